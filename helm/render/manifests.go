package main

// Output: rendered files split into documents and sorted as Helm installs them.

import (
	"fmt"
	"path"
	"regexp"
	"sort"
	"strings"

	"github.com/ghodss/yaml"
)

// InstallOrder is releaseutil.InstallOrder.
var installOrder = []string{
	"PriorityClass", "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange",
	"PodSecurityPolicy", "PodDisruptionBudget", "ServiceAccount", "Secret",
	"SecretList", "ConfigMap", "StorageClass", "PersistentVolume",
	"PersistentVolumeClaim", "CustomResourceDefinition", "ClusterRole",
	"ClusterRoleList", "ClusterRoleBinding", "ClusterRoleBindingList", "Role",
	"RoleList", "RoleBinding", "RoleBindingList", "Service", "DaemonSet", "Pod",
	"ReplicationController", "ReplicaSet", "Deployment", "HorizontalPodAutoscaler",
	"StatefulSet", "Job", "CronJob", "IngressClass", "Ingress", "APIService",
	"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
}

type manifest struct {
	name    string
	content string
	kind    string
}

type simpleHead struct {
	Version  string `json:"apiVersion"`
	Kind     string `json:"kind,omitempty"`
	Metadata *struct {
		Name        string            `json:"name"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata,omitempty"`
}

var sep = regexp.MustCompile("(?:^|\\s*\n)---\\s*")

// splitManifests is releaseutil.SplitManifests, returned in file order.
func splitManifests(bigFile string) []string {
	var res []string
	for _, d := range sep.Split(strings.TrimSpace(bigFile), -1) {
		if d == "" {
			continue
		}
		res = append(res, strings.TrimSpace(d))
	}
	return res
}

// sortManifests is releaseutil.SortManifests with InstallOrder.
func sortManifests(files map[string]string) (hooks, generic []manifest, err error) {
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		content := files[p]
		if strings.HasPrefix(path.Base(p), "_") || strings.TrimSpace(content) == "" {
			continue
		}
		for _, doc := range splitManifests(content) {
			var head simpleHead
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				return nil, nil, fmt.Errorf("YAML parse error on %s: %w", p, err)
			}
			m := manifest{name: p, content: doc, kind: head.Kind}
			if head.Metadata != nil {
				if _, ok := head.Metadata.Annotations["helm.sh/hook"]; ok {
					hooks = append(hooks, m)
					continue
				}
			}
			generic = append(generic, m)
		}
	}
	byKind := func(ms []manifest) {
		order := make(map[string]int, len(installOrder))
		for i, k := range installOrder {
			order[k] = i
		}
		sort.SliceStable(ms, func(i, j int) bool {
			a, aok := order[ms[i].kind]
			b, bok := order[ms[j].kind]
			if !aok && !bok {
				return ms[i].kind < ms[j].kind
			}
			if !aok {
				return false
			}
			if !bok {
				return true
			}
			return a < b
		})
	}
	byKind(generic)
	byKind(hooks)
	return hooks, generic, nil
}
