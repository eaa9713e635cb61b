// weir-helm-render renders a Helm 3 chart the way `helm template` does, for the
// subset of Helm that Weir's chart (and most single charts) use. No helm binary
// can be installed where Weir is built, so this reproduces Helm's engine from the
// same parts Helm is made of:
//
//   - Go text/template with sprig's TxtFuncMap minus env/expandenv, plus Helm's
//     own include, tpl, required, toYaml, toJson, fromYaml(Array),
//     fromJson(Array), mustToYaml, mustToJson and lookup (an empty map, as
//     `helm template` returns without a cluster); missingkey=zero and
//     "<no value>" removed, as Helm's engine does.
//   - Values: values.yaml coalesced with --values files (merged in order) and
//     --set/--set-string (Helm's strvals typing: true/false/null, int64 for
//     digit strings that do not start with 0), YAML read through ghodss/yaml,
//     of which Helm's sigs.k8s.io/yaml is a fork (numbers become float64, as in
//     Helm).
//   - values.schema.json checked against the coalesced values BEFORE rendering,
//     with xeipuuv/gojsonschema, the validator Helm 3.0-3.17 uses, and Helm's
//     error text.
//   - .Release, .Chart (Chart.yaml with Helm's field names), .Capabilities
//     (KubeVersion, APIVersions.Has), .Template (Name, BasePath), .Files.Get.
//   - Output: documents split, sorted by kind in Helm's InstallOrder (stable by
//     file name and position), each as "---\n# Source: <chart>/templates/<file>\n<doc>\n";
//     NOTES.txt and partials (_*.tpl) are not printed; hook documents follow.
//
// What it does not do is listed in helm/weir/README.md ("Rendering without helm").
//
// Build (GOPATH mode, Debian's golang-* -dev packages):
//
//	GO111MODULE=off GOPATH=/usr/share/gocode CGO_ENABLED=0 go build -buildvcs=false -trimpath -o target/helm-render/weir-helm-render ./helm/render
//
// (cargo xtask helm-template and the render test do this.) The semver import has
// no /v3 suffix: in GOPATH mode Debian installs it at github.com/Masterminds/semver.
//
// Files: main.go (flags and the render pipeline), values.go (values files,
// merging and coalescing), strvals.go (--set parsing), schema.go
// (values.schema.json), chart.go (.Chart, .Capabilities, .Files), engine.go
// (loading, parsing and executing templates), funcs.go (the template function
// map), manifests.go (splitting and ordering the output).
package main

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/Masterminds/semver"
)

type multiFlag []string

type options struct {
	chartDir     string
	valueFiles   multiFlag
	sets         multiFlag
	setStrings   multiFlag
	releaseName  string
	namespace    string
	kubeVersion  string
	apiVersions  multiFlag
	isUpgrade    bool
	showTemplate string
}

func usage() {
	fmt.Fprint(os.Stderr, `usage: weir-helm-render [flags] CHART_DIR
  -f, --values FILE          values file merged over values.yaml (repeatable, later wins)
      --set k=v[,k=v]        set values, Helm's --set syntax and typing (repeatable)
      --set-string k=v       like --set, values stay strings
      --release-name NAME    .Release.Name (default "release-name", as helm template)
  -n, --namespace NS         .Release.Namespace (default "default")
      --kube-version V       .Capabilities.KubeVersion (default v1.35.0)
  -a, --api-versions GV      extra .Capabilities.APIVersions (repeatable)
      --is-upgrade           .Release.IsUpgrade true, IsInstall false
  -s, --show-only FILE       only print this template (e.g. templates/daemonset.yaml)
`)
}

func parseArgs(args []string) (*options, error) {
	o := &options{releaseName: "release-name", namespace: "default", kubeVersion: "v1.35.0"}
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, val, hasVal := a, "", false
		if strings.HasPrefix(a, "--") {
			if eq := strings.IndexByte(a, '='); eq >= 0 {
				name, val, hasVal = a[:eq], a[eq+1:], true
			}
		}
		next := func() (string, error) {
			if hasVal {
				return val, nil
			}
			if i+1 >= len(args) {
				return "", fmt.Errorf("flag %s needs a value", name)
			}
			i++
			return args[i], nil
		}
		var err error
		var v string
		switch name {
		case "-f", "--values":
			v, err = next()
			o.valueFiles = append(o.valueFiles, v)
		case "--set":
			v, err = next()
			o.sets = append(o.sets, v)
		case "--set-string":
			v, err = next()
			o.setStrings = append(o.setStrings, v)
		case "--release-name":
			o.releaseName, err = next()
		case "-n", "--namespace":
			o.namespace, err = next()
		case "--kube-version":
			o.kubeVersion, err = next()
		case "-a", "--api-versions":
			v, err = next()
			o.apiVersions = append(o.apiVersions, v)
		case "--is-upgrade":
			o.isUpgrade = true
		case "-s", "--show-only":
			o.showTemplate, err = next()
		case "-h", "--help":
			usage()
			os.Exit(0)
		default:
			if strings.HasPrefix(a, "-") {
				return nil, fmt.Errorf("unknown flag %s", a)
			}
			if o.chartDir != "" {
				return nil, fmt.Errorf("one chart directory only (got %s and %s)", o.chartDir, a)
			}
			o.chartDir = a
		}
		if err != nil {
			return nil, err
		}
	}
	if o.chartDir == "" {
		return nil, errors.New("no chart directory given")
	}
	return o, nil
}

func main() {
	o, err := parseArgs(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		usage()
		os.Exit(2)
	}
	out, err := run(o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		os.Exit(1)
	}
	os.Stdout.WriteString(out)
}

func run(o *options) (string, error) {
	dir := o.chartDir
	md, err := loadMetadata(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return "", err
	}
	defaults, err := readValuesFile(filepath.Join(dir, "values.yaml"), true)
	if err != nil {
		return "", err
	}
	user := map[string]interface{}{}
	for _, f := range o.valueFiles {
		cur, err := readValuesFile(f, false)
		if err != nil {
			return "", err
		}
		user = mergeMaps(user, cur)
	}
	for _, s := range o.sets {
		if err := parseSet(s, user, false); err != nil {
			return "", fmt.Errorf("failed parsing --set data: %w", err)
		}
	}
	for _, s := range o.setStrings {
		if err := parseSet(s, user, true); err != nil {
			return "", fmt.Errorf("failed parsing --set-string data: %w", err)
		}
	}
	vals := coalesceValues(user, defaults)

	caps, err := capabilities(o)
	if err != nil {
		return "", err
	}
	if md.KubeVersion != "" {
		c, err := semver.NewConstraint(md.KubeVersion)
		if err != nil {
			return "", fmt.Errorf("Chart.yaml kubeVersion %q: %w", md.KubeVersion, err)
		}
		v, err := semver.NewVersion(caps.KubeVersion.Version)
		if err != nil || !c.Check(v) {
			return "", fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s", md.KubeVersion, caps.KubeVersion.Version)
		}
	}

	if schema, err := os.ReadFile(filepath.Join(dir, "values.schema.json")); err == nil {
		if err := validateAgainstSchema(vals, schema); err != nil {
			return "", fmt.Errorf("values don't meet the specifications of the schema(s) in the following chart(s):\n%s:\n%s", md.Name, err)
		}
	} else if !os.IsNotExist(err) {
		return "", err
	}

	files, err := loadFiles(dir)
	if err != nil {
		return "", err
	}
	tpls, err := loadTemplates(dir, md.Name)
	if err != nil {
		return "", err
	}
	top := map[string]interface{}{
		"Values":       vals,
		"Chart":        md,
		"Capabilities": caps,
		"Files":        files,
		"Subcharts":    map[string]interface{}{},
		"Release": map[string]interface{}{
			"Name":      o.releaseName,
			"Namespace": o.namespace,
			"IsUpgrade": o.isUpgrade,
			"IsInstall": !o.isUpgrade,
			"Revision":  1,
			"Service":   "Helm",
		},
	}
	rendered, err := render(tpls, top, md.Name)
	if err != nil {
		return "", err
	}
	notes := path.Join(md.Name, "templates", "NOTES.txt")
	for k := range rendered {
		if strings.HasSuffix(k, "NOTES.txt") || k == notes {
			delete(rendered, k)
		}
	}
	if o.showTemplate != "" {
		want := path.Join(md.Name, filepath.ToSlash(o.showTemplate))
		if _, ok := rendered[want]; !ok {
			return "", fmt.Errorf("could not find template %s in chart", o.showTemplate)
		}
		for k := range rendered {
			if k != want {
				delete(rendered, k)
			}
		}
	}
	hooks, manifests, err := sortManifests(rendered)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, m := range manifests {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", m.name, m.content)
	}
	for _, m := range hooks {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", m.name, m.content)
	}
	return b.String(), nil
}
