//! `metav1.LabelSelector` matching, as `LabelSelectorAsSelector` reads it.
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// A parsed selector; the default (a null selector) selects nothing, `{}`
/// everything.
#[derive(Debug, Default, Clone)]
pub struct Selector(Option<LabelSelector>);

impl Selector {
    pub fn new(sel: &LabelSelector) -> Self {
        Selector(Some(sel.clone()))
    }

    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let Some(sel) = &self.0 else { return false };
        let get = |k: &str| labels.and_then(|l| l.get(k));
        let exact = sel
            .match_labels
            .iter()
            .flatten()
            .all(|(k, v)| get(k) == Some(v));
        exact
            && sel.match_expressions.iter().flatten().all(|e| {
                let values = e.values.clone().unwrap_or_default();
                match e.operator.as_str() {
                    "In" => get(&e.key).is_some_and(|v| values.contains(v)),
                    "NotIn" => get(&e.key).is_none_or(|v| !values.contains(v)),
                    "Exists" => get(&e.key).is_some(),
                    "DoesNotExist" => get(&e.key).is_none(),
                    // Validation refuses other operators; select nothing.
                    _ => false,
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn selectors_match_like_upstream() {
        let labels = BTreeMap::from([
            ("app".to_string(), "web".to_string()),
            ("tier".into(), "front".into()),
        ]);
        let sel = |v: serde_json::Value| Selector::new(&serde_json::from_value(v).unwrap());
        let cases = [
            (json!({}), true),
            (json!({"matchLabels": {"app": "web"}}), true),
            (json!({"matchLabels": {"app": "db"}}), false),
            (
                json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front", "x"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["front"]}]}),
                false,
            ),
            (
                json!({"matchExpressions": [{"key": "gone", "operator": "DoesNotExist"}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "app", "operator": "Near"}]}),
                false,
            ),
        ];
        for (s, want) in cases {
            assert_eq!(sel(s.clone()).matches(Some(&labels)), want, "{s}");
        }
        assert!(
            !Selector::default().matches(Some(&labels)),
            "null selects nothing"
        );
    }
}
