//! SubjectAccessReviews (`authorization.k8s.io/v1`), answered as the real
//! server's authorizer chain does for the users tests create: the
//! `system:masters` group is always allowed (the privileged-group authorizer),
//! everyone else only by the stored RBAC objects (plugin/pkg/auth/authorizer/
//! rbac). Aggregated ClusterRoles are not expanded.
use serde_json::{Value, json};

use crate::{error::ApiError, resources, store::Inner};

/// What is asked, from the review's `spec`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Request {
    pub user: String,
    pub groups: Vec<String>,
    pub verb: String,
    /// `None` for a non-resource request (`nonResourceAttributes`).
    pub resource: Option<ResourceAttrs>,
    pub path: String,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct ResourceAttrs {
    pub namespace: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
}

const SUPERUSER_GROUP: &str = "system:masters";

/// Decodes a posted review, decides it against `store`, and returns the
/// review with its `status`, as the real server does.
pub fn review(store: &Inner, body: &[u8]) -> Result<Value, ApiError> {
    let mut sar: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::BadRequest(format!("not a SubjectAccessReview: {e}")))?;
    let req = parse(&sar["spec"])?;
    let (allowed, reason) = decide(store, &req);
    sar["status"] = json!({"allowed": allowed, "reason": reason});
    sar["apiVersion"] = json!("authorization.k8s.io/v1");
    sar["kind"] = json!("SubjectAccessReview");
    Ok(sar)
}

fn parse(spec: &Value) -> Result<Request, ApiError> {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let groups: Vec<String> = spec["groups"]
        .as_array()
        .map(|a| a.iter().map(s).collect())
        .unwrap_or_default();
    let user = s(&spec["user"]);
    if user.is_empty() && groups.is_empty() {
        return Err(ApiError::BadRequest(
            "spec.user or spec.groups: at least one is required".into(),
        ));
    }
    let ra = &spec["resourceAttributes"];
    let na = &spec["nonResourceAttributes"];
    match (ra.is_object(), na.is_object()) {
        (true, false) => Ok(Request {
            user,
            groups,
            verb: s(&ra["verb"]),
            resource: Some(ResourceAttrs {
                namespace: s(&ra["namespace"]),
                group: s(&ra["group"]),
                resource: s(&ra["resource"]),
                subresource: s(&ra["subresource"]),
                name: s(&ra["name"]),
            }),
            path: String::new(),
        }),
        (false, true) => Ok(Request {
            user,
            groups,
            verb: s(&na["verb"]),
            resource: None,
            path: s(&na["path"]),
        }),
        _ => Err(ApiError::BadRequest(
            "exactly one of spec.resourceAttributes and spec.nonResourceAttributes is required"
                .into(),
        )),
    }
}

/// Whether `req` is allowed, and the reason the real RBAC authorizer gives.
pub fn decide(store: &Inner, req: &Request) -> (bool, String) {
    if req.groups.iter().any(|g| g == SUPERUSER_GROUP) {
        return (true, String::new());
    }
    let find = |plural| resources::find("rbac.authorization.k8s.io", "v1", plural);
    let (Some(crb), Some(cr), Some(rb), Some(role)) = (
        find("clusterrolebindings"),
        find("clusterroles"),
        find("rolebindings"),
        find("roles"),
    ) else {
        return (false, "RBAC resources are not served".into());
    };
    for (_, binding) in store.list(crb, None, None) {
        let binding = &*binding;
        if binds(binding, req)
            && role_ref(binding, "ClusterRole").is_some_and(|name| {
                store
                    .get(cr, "", name)
                    .is_some_and(|r| rules_allow(&r["rules"], req))
            })
        {
            let name = binding["metadata"]["name"].as_str().unwrap_or_default();
            return (
                true,
                format!("RBAC: allowed by ClusterRoleBinding {name:?} of ClusterRole"),
            );
        }
    }
    let namespace = req.resource.as_ref().map(|r| r.namespace.as_str());
    if let Some(ns) = namespace.filter(|ns| !ns.is_empty()) {
        for (_, binding) in store.list(rb, Some(ns), None) {
            let binding = &*binding;
            if !binds(binding, req) {
                continue;
            }
            let rules = match (role_ref(binding, "Role"), role_ref(binding, "ClusterRole")) {
                (Some(name), _) => store.get(role, ns, name),
                (_, Some(name)) => store.get(cr, "", name),
                _ => None,
            };
            if rules.is_some_and(|r| rules_allow(&r["rules"], req)) {
                let name = binding["metadata"]["name"].as_str().unwrap_or_default();
                return (
                    true,
                    format!("RBAC: allowed by RoleBinding \"{name}/{ns}\""),
                );
            }
        }
    }
    (false, String::new())
}

fn role_ref<'a>(binding: &'a Value, kind: &str) -> Option<&'a str> {
    let r = &binding["roleRef"];
    (r["kind"] == kind).then(|| r["name"].as_str()).flatten()
}

fn binds(binding: &Value, req: &Request) -> bool {
    let binding_ns = binding["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default();
    binding["subjects"].as_array().is_some_and(|subjects| {
        subjects.iter().any(|s| {
            let name = s["name"].as_str().unwrap_or_default();
            match s["kind"].as_str() {
                Some("User") => req.user == name,
                Some("Group") => req.groups.iter().any(|g| g == name),
                Some("ServiceAccount") => {
                    // An unset namespace on a RoleBinding's subject means the binding's.
                    let ns = s["namespace"]
                        .as_str()
                        .filter(|n| !n.is_empty())
                        .unwrap_or(binding_ns);
                    req.user == format!("system:serviceaccount:{ns}:{name}")
                }
                _ => false,
            }
        })
    })
}

fn rules_allow(rules: &Value, req: &Request) -> bool {
    rules
        .as_array()
        .is_some_and(|rules| rules.iter().any(|r| rule_allows(r, req)))
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// One PolicyRule, as rbac/v1's `RuleAllows`.
pub fn rule_allows(rule: &Value, req: &Request) -> bool {
    let has = |field: &str, want: &str| {
        strings(&rule[field])
            .iter()
            .any(|v| *v == "*" || *v == want)
    };
    if !has("verbs", &req.verb) {
        return false;
    }
    match &req.resource {
        Some(ra) => {
            let names = strings(&rule["resourceNames"]);
            has("apiGroups", &ra.group)
                && resource_matches(&strings(&rule["resources"]), ra)
                && (names.is_empty() || names.contains(&ra.name.as_str()))
        }
        None => strings(&rule["nonResourceURLs"]).iter().any(|u| {
            *u == "*"
                || *u == req.path
                || u.strip_suffix('*').is_some_and(|p| req.path.starts_with(p))
        }),
    }
}

fn resource_matches(resources: &[&str], ra: &ResourceAttrs) -> bool {
    let combined = if ra.subresource.is_empty() {
        ra.resource.clone()
    } else {
        format!("{}/{}", ra.resource, ra.subresource)
    };
    resources.iter().any(|r| {
        *r == "*"
            || *r == combined
            || (!ra.subresource.is_empty() && r.strip_prefix("*/") == Some(&ra.subresource))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(verb: &str, sub: &str) -> Request {
        Request {
            user: "alice".into(),
            verb: verb.into(),
            resource: Some(ResourceAttrs {
                resource: "nodes".into(),
                subresource: sub.into(),
                name: "n1".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn rules_match_verbs_resources_subresources_and_names() {
        let proxy = json!({"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]});
        assert!(rule_allows(&proxy, &nodes("get", "proxy")));
        assert!(!rule_allows(&proxy, &nodes("create", "proxy")));
        assert!(!rule_allows(&proxy, &nodes("get", "log")));
        // `nodes` alone does not grant its subresources.
        let bare = json!({"apiGroups": [""], "resources": ["nodes"], "verbs": ["*"]});
        assert!(!rule_allows(&bare, &nodes("get", "proxy")));
        let any_sub = json!({"apiGroups": ["*"], "resources": ["*/stats"], "verbs": ["get"]});
        assert!(rule_allows(&any_sub, &nodes("get", "stats")));
        let named = json!({"apiGroups": [""], "resources": ["*"], "verbs": ["get"],
                           "resourceNames": ["n2"]});
        assert!(!rule_allows(&named, &nodes("get", "proxy")));
        let wrong_group = json!({"apiGroups": ["apps"], "resources": ["*"], "verbs": ["*"]});
        assert!(!rule_allows(&wrong_group, &nodes("get", "proxy")));
    }

    #[test]
    fn non_resource_urls_match_exactly_or_by_prefix() {
        let req = Request {
            user: "u".into(),
            verb: "get".into(),
            path: "/metrics/cadvisor".into(),
            ..Default::default()
        };
        assert!(rule_allows(
            &json!({"nonResourceURLs": ["/metrics*"], "verbs": ["get"]}),
            &req
        ));
        assert!(!rule_allows(
            &json!({"nonResourceURLs": ["/metrics"], "verbs": ["get"]}),
            &req
        ));
    }

    #[test]
    fn a_review_needs_a_subject_and_one_kind_of_attributes() {
        assert!(parse(&json!({"resourceAttributes": {"verb": "get"}})).is_err());
        assert!(parse(&json!({"user": "u"})).is_err());
        let r = parse(&json!({"user": "u", "groups": ["g"],
                              "resourceAttributes": {"verb": "get", "resource": "nodes",
                                                     "subresource": "proxy", "name": "n"}}))
        .unwrap();
        assert_eq!(r.groups, ["g"]);
        assert_eq!(r.resource.unwrap().subresource, "proxy");
    }
}
