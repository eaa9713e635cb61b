package main

// The template engine: loading the chart's templates, parsing them into one
// set and executing each, as helm.sh/helm/v3/pkg/engine does.

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"text/template"
)

type tmpl struct {
	name     string // <chart>/templates/x.yaml
	basePath string
	source   string
}

func loadTemplates(dir, chartName string) (map[string]tmpl, error) {
	tpls := map[string]tmpl{}
	root := filepath.Join(dir, "templates")
	err := filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if info.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		name := path.Join(chartName, filepath.ToSlash(rel))
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		tpls[name] = tmpl{name: name, basePath: path.Join(chartName, "templates"), source: string(data)}
		return nil
	})
	return tpls, err
}

// sortTemplates is engine.sortTemplates: deepest paths first, then reverse
// lexical order, so that later definitions of a `define` win as in Helm.
func sortTemplates(tpls map[string]tmpl) []string {
	keys := make([]string, 0, len(tpls))
	for k := range tpls {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		ca, cb := strings.Count(a, "/"), strings.Count(b, "/")
		if ca != cb {
			return ca > cb
		}
		return a > b
	})
	return keys
}

// execErr matches what Helm's cleanupExecError keeps of a failed execution:
// the template location and the message of fail/required.
var execErrRe = regexp.MustCompile(`^template: (.*?): executing ".*?" at <.*?>: error calling (?:fail|required): (.*)$`)

func render(tpls map[string]tmpl, top map[string]interface{}, chartName string) (map[string]string, error) {
	t := template.New("gotpl")
	t.Option("missingkey=zero")
	initFuncs(t)
	keys := sortTemplates(tpls)
	for _, k := range keys {
		if _, err := t.New(k).Parse(tpls[k].source); err != nil {
			return nil, fmt.Errorf("parse error at (%s): %w", k, err)
		}
	}
	rendered := map[string]string{}
	for _, k := range keys {
		if strings.HasPrefix(path.Base(k), "_") {
			continue
		}
		vals := make(map[string]interface{}, len(top)+1)
		for key, v := range top {
			vals[key] = v
		}
		vals["Template"] = map[string]interface{}{"Name": k, "BasePath": tpls[k].basePath}
		var buf strings.Builder
		if err := t.ExecuteTemplate(&buf, k, vals); err != nil {
			msg := err.Error()
			if m := execErrRe.FindStringSubmatch(msg); m != nil {
				return nil, fmt.Errorf("execution error at (%s): %s", m[1], m[2])
			}
			return nil, fmt.Errorf("template: %s", strings.TrimPrefix(msg, "template: "))
		}
		rendered[k] = strings.ReplaceAll(buf.String(), "<no value>", "")
	}
	return rendered, nil
}
