package main

// Chart.yaml and the built-in objects templates see besides .Values and
// .Release: .Chart, .Capabilities and .Files.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/Masterminds/semver"
	"github.com/ghodss/yaml"
)

// Metadata mirrors helm.sh/helm/v3/pkg/chart.Metadata: templates see these
// field names (.Chart.Name, .Chart.AppVersion, ...).
type Metadata struct {
	Name         string            `json:"name,omitempty"`
	Home         string            `json:"home,omitempty"`
	Sources      []string          `json:"sources,omitempty"`
	Version      string            `json:"version,omitempty"`
	Description  string            `json:"description,omitempty"`
	Keywords     []string          `json:"keywords,omitempty"`
	Maintainers  []*Maintainer     `json:"maintainers,omitempty"`
	Icon         string            `json:"icon,omitempty"`
	APIVersion   string            `json:"apiVersion,omitempty"`
	Condition    string            `json:"condition,omitempty"`
	Tags         string            `json:"tags,omitempty"`
	AppVersion   string            `json:"appVersion,omitempty"`
	Deprecated   bool              `json:"deprecated,omitempty"`
	Annotations  map[string]string `json:"annotations,omitempty"`
	KubeVersion  string            `json:"kubeVersion,omitempty"`
	Dependencies []interface{}     `json:"dependencies,omitempty"`
	Type         string            `json:"type,omitempty"`
}

// Maintainer mirrors chart.Maintainer.
type Maintainer struct {
	Name  string `json:"name,omitempty"`
	Email string `json:"email,omitempty"`
	URL   string `json:"url,omitempty"`
}

// KubeVersion mirrors chartutil.KubeVersion.
type KubeVersion struct {
	Version string
	Major   string
	Minor   string
}

func (kv *KubeVersion) String() string     { return kv.Version }
func (kv *KubeVersion) GitVersion() string { return kv.Version }

// VersionSet mirrors chartutil.VersionSet.
type VersionSet []string

// Has reports whether the API group/version (or group/version/Kind) is known.
func (v VersionSet) Has(apiVersion string) bool {
	for _, x := range v {
		if x == apiVersion {
			return true
		}
	}
	return false
}

// Capabilities mirrors chartutil.Capabilities (HelmVersion reduced to a map).
type Capabilities struct {
	APIVersions VersionSet
	KubeVersion KubeVersion
	HelmVersion map[string]string
}

// Built-in group/versions of a current Kubernetes API server; Helm derives the
// same list from client-go's scheme. --api-versions adds more (helm template -a).
var defaultAPIVersions = []string{
	"v1", "admissionregistration.k8s.io/v1", "apiextensions.k8s.io/v1",
	"apiregistration.k8s.io/v1", "apps/v1", "authentication.k8s.io/v1",
	"authorization.k8s.io/v1", "autoscaling/v1", "autoscaling/v2", "batch/v1",
	"certificates.k8s.io/v1", "coordination.k8s.io/v1", "discovery.k8s.io/v1",
	"events.k8s.io/v1", "flowcontrol.apiserver.k8s.io/v1", "networking.k8s.io/v1",
	"node.k8s.io/v1", "policy/v1", "rbac.authorization.k8s.io/v1",
	"resource.k8s.io/v1", "scheduling.k8s.io/v1", "storage.k8s.io/v1",
}

func capabilities(o *options) (*Capabilities, error) {
	v, err := semver.NewVersion(o.kubeVersion)
	if err != nil {
		return nil, fmt.Errorf("invalid kube version %q: %w", o.kubeVersion, err)
	}
	apis := append(VersionSet{}, defaultAPIVersions...)
	apis = append(apis, o.apiVersions...)
	return &Capabilities{
		APIVersions: apis,
		KubeVersion: KubeVersion{
			Version: "v" + v.String(),
			Major:   strconv.FormatUint(v.Major(), 10),
			Minor:   strconv.FormatUint(v.Minor(), 10),
		},
		HelmVersion: map[string]string{"Version": "v3-weir-helm-render"},
	}, nil
}

func loadMetadata(file string) (*Metadata, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("Chart.yaml file is missing: %w", err)
	}
	md := &Metadata{}
	if err := yaml.Unmarshal(data, md); err != nil {
		return nil, fmt.Errorf("cannot load Chart.yaml: %w", err)
	}
	if md.APIVersion == "" {
		return nil, errors.New("validation: chart.metadata.apiVersion is required")
	}
	if md.Name == "" {
		return nil, errors.New("validation: chart.metadata.name is required")
	}
	if _, err := semver.StrictNewVersion(md.Version); err != nil {
		return nil, fmt.Errorf("validation: chart.metadata.version %q is invalid", md.Version)
	}
	if md.Type != "" && md.Type != "application" {
		return nil, fmt.Errorf("%s charts are not installable", md.Type)
	}
	if len(md.Dependencies) > 0 {
		return nil, errors.New("chart dependencies (subcharts) are not supported by weir-helm-render")
	}
	return md, nil
}

// Files is a reduced chart.Files: Get, GetBytes and Lines of the chart's
// non-template files.
type Files map[string][]byte

func (f Files) GetBytes(name string) []byte { return f[name] }
func (f Files) Get(name string) string      { return string(f[name]) }
func (f Files) Lines(name string) []string {
	s := string(f[name])
	if s == "" {
		return []string{}
	}
	return strings.Split(s, "\n")
}

func loadFiles(dir string) (Files, error) {
	files := Files{}
	err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if info.IsDir() {
			if rel == "templates" || rel == "charts" {
				return filepath.SkipDir
			}
			return nil
		}
		switch rel {
		case "Chart.yaml", "values.yaml", "values.schema.json", "Chart.lock", ".helmignore":
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files[rel] = data
		return nil
	})
	return files, err
}
