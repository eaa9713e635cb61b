package main

// values.schema.json, checked against the coalesced values before rendering.

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/ghodss/yaml"
	"github.com/xeipuuv/gojsonschema"
)

// validateAgainstSchema is chartutil.ValidateAgainstSingleSchema (Helm <= 3.17).
func validateAgainstSchema(vals map[string]interface{}, schema []byte) error {
	data, err := yaml.Marshal(vals)
	if err != nil {
		return err
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return err
	}
	if bytes.Equal(js, []byte("null")) {
		js = []byte("{}")
	}
	result, err := gojsonschema.Validate(gojsonschema.NewBytesLoader(schema), gojsonschema.NewBytesLoader(js))
	if err != nil {
		return err
	}
	if !result.Valid() {
		var sb strings.Builder
		for _, desc := range result.Errors() {
			sb.WriteString(fmt.Sprintf("- %s\n", desc))
		}
		return errors.New(sb.String())
	}
	return nil
}
