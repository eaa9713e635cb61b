package main

// Values files and how Helm combines them with the chart's values.yaml.

import (
	"fmt"
	"os"

	"github.com/ghodss/yaml"
)

// readValuesFile is chartutil.ReadValues: sigs.k8s.io/yaml, so numbers are float64.
func readValuesFile(file string, optional bool) (map[string]interface{}, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		if optional && os.IsNotExist(err) {
			return map[string]interface{}{}, nil
		}
		return nil, err
	}
	vals := map[string]interface{}{}
	if err := yaml.Unmarshal(data, &vals); err != nil {
		return nil, fmt.Errorf("failed to parse %s: %w", file, err)
	}
	if vals == nil {
		vals = map[string]interface{}{}
	}
	return vals, nil
}

// mergeMaps is values.Options' mergeMaps: b over a, maps merged recursively.
func mergeMaps(a, b map[string]interface{}) map[string]interface{} {
	out := make(map[string]interface{}, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if v, ok := v.(map[string]interface{}); ok {
			if bv, ok := out[k]; ok {
				if bv, ok := bv.(map[string]interface{}); ok {
					out[k] = mergeMaps(bv, v)
					continue
				}
			}
		}
		out[k] = v
	}
	return out
}

// coalesceValues is chartutil.CoalesceValues for a chart without subcharts:
// user values win, maps merge, a user null deletes the chart's default.
func coalesceValues(user, defaults map[string]interface{}) map[string]interface{} {
	v := deepCopy(user).(map[string]interface{})
	coalesceTables(v, deepCopy(defaults).(map[string]interface{}))
	return v
}

func coalesceTables(dst, src map[string]interface{}) {
	for key, val := range src {
		dv, ok := dst[key]
		if ok && dv == nil {
			delete(dst, key)
			continue
		}
		if !ok {
			dst[key] = val
			continue
		}
		if dm, isMap := dv.(map[string]interface{}); isMap {
			if sm, ok := val.(map[string]interface{}); ok {
				coalesceTables(dm, sm)
			}
		}
	}
}

func deepCopy(v interface{}) interface{} {
	switch t := v.(type) {
	case map[string]interface{}:
		m := make(map[string]interface{}, len(t))
		for k, x := range t {
			m[k] = deepCopy(x)
		}
		return m
	case []interface{}:
		l := make([]interface{}, len(t))
		for i, x := range t {
			l[i] = deepCopy(x)
		}
		return l
	default:
		return v
	}
}
