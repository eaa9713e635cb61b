//! Label and field selectors with the syntax and the error behaviour of
//! `k8s.io/apimachinery/pkg/labels` and `.../fields`.
use serde_json::Value;

use crate::{error::ApiError, resources::ResourceDef, store::Stored};

#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`.
#[derive(Debug, Clone, Default)]
pub struct LabelSelector(Vec<Requirement>);

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let bad =
            |why: &str| ApiError::BadRequest(format!("unable to parse requirement: {why}: {s:?}"));
        let mut reqs = Vec::new();
        for term in split_terms(s) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let req = if let Some(key) = term.strip_prefix('!') {
                Requirement::NotExists(valid_key(key.trim()).map_err(|e| bad(&e))?)
            } else if let Some((k, v)) = term.split_once("!=") {
                Requirement::NotEq(valid_key(k.trim()).map_err(|e| bad(&e))?, v.trim().into())
            } else if let Some((k, v)) = term.split_once("==") {
                Requirement::Eq(valid_key(k.trim()).map_err(|e| bad(&e))?, v.trim().into())
            } else if let Some((k, v)) = term.split_once('=') {
                Requirement::Eq(valid_key(k.trim()).map_err(|e| bad(&e))?, v.trim().into())
            } else if let Some((k, set, negated)) = set_term(term) {
                let key = valid_key(k).map_err(|e| bad(&e))?;
                if negated {
                    Requirement::NotIn(key, set)
                } else {
                    Requirement::In(key, set)
                }
            } else {
                Requirement::Exists(valid_key(term).map_err(|e| bad(&e))?)
            };
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// A `metav1.LabelSelector` object (`matchLabels`, `matchExpressions`),
    /// as `LabelSelectorAsSelector` reads it; `None` (a null selector)
    /// selects nothing, `{}` everything.
    pub fn from_object(sel: &Value) -> Result<Option<Self>, String> {
        if sel.is_null() {
            return Ok(None);
        }
        let mut reqs = Vec::new();
        for (k, v) in sel["matchLabels"].as_object().into_iter().flatten() {
            let v = v.as_str().ok_or(format!("matchLabels.{k}: not a string"))?;
            reqs.push(Requirement::Eq(valid_key(k)?, v.to_string()));
        }
        for e in sel["matchExpressions"].as_array().into_iter().flatten() {
            let key = valid_key(e["key"].as_str().unwrap_or_default())?;
            let values: Vec<String> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(String::from))
                .collect();
            let op = e["operator"].as_str().unwrap_or_default();
            reqs.push(match op {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(format!("for '{op}' operator, values set can't be empty"));
                }
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::NotExists(key),
                other => return Err(format!("{other:?} is not a valid label selector operator")),
            });
        }
        Ok(Some(LabelSelector(reqs)))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        if self.0.is_empty() {
            return true;
        }
        let labels = labels_of(obj);
        self.eval(|k| labels.and_then(|l| l.get(k)).and_then(Value::as_str))
    }

    /// As [`Self::matches`], over an object's labels read once when it was
    /// stored (see [`LabelSet`]).
    pub fn matches_set(&self, labels: &LabelSet) -> bool {
        self.eval(|k| labels.get(k))
    }

    fn eval<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Eq(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEq(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }
}

/// An object's labels, kept beside it as the real server's watch cache
/// keeps each object's label set for filtering. Matching a list's selector
/// through the object's JSON tree walked three maps of scattered strings per
/// object: at 100k objects, 40% of this server's CPU while it served a list.
/// Here the keys' lengths, held inline, rule out most keys unread.
#[derive(Clone, Debug, Default)]
pub struct LabelSet(Box<[(Box<str>, Box<str>)]>);

impl LabelSet {
    pub fn of(obj: &Value) -> Self {
        Self(
            labels_of(obj)
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| Some((k.as_str().into(), v.as_str()?.into())))
                .collect(),
        )
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k.len() == key.len() && **k == *key)
            .map(|(_, v)| &**v)
    }
}

/// `metadata.labels`, looked up key by key: `Value::pointer` allocates each
/// segment of its path, and this runs for every object a selector meets.
fn labels_of(obj: &Value) -> Option<&serde_json::Map<String, Value>> {
    obj.get("metadata")?.get("labels")?.as_object()
}

/// Splits on commas outside parentheses (`a in (x,y),b`).
fn split_terms(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn set_term(term: &str) -> Option<(&str, Vec<String>, bool)> {
    let open = term.find('(')?;
    let close = term.rfind(')')?;
    let head = term[..open].trim();
    let (key, negated) = if let Some(k) = head.strip_suffix(" notin") {
        (k.trim(), true)
    } else if let Some(k) = head.strip_suffix(" in") {
        (k.trim(), false)
    } else {
        return None;
    };
    let set = term[open + 1..close]
        .split(',')
        .map(|v| v.trim().to_string())
        .collect();
    Some((key, set, negated))
}

fn valid_key(k: &str) -> Result<String, String> {
    let ok = !k.is_empty()
        && k.len() <= 317
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(k.to_string())
    } else {
        Err(format!("invalid label key {k:?}"))
    }
}

/// A parsed `fieldSelector`, checked against the fields the kind supports.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(s: &str, res: &ResourceDef) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, eq, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::BadRequest(format!(
                    "invalid selector: '{s}'; can't understand '{term}'"
                )));
            };
            let field = field.trim();
            let known = field == "metadata.name"
                || (field == "metadata.namespace" && res.namespaced)
                || res.field_selectors.contains(&field);
            if !known {
                return Err(ApiError::BadRequest(format!(
                    "field label not supported: {field}"
                )));
            }
            reqs.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(field, eq, want)| {
            let got = field_value(obj, field);
            (got == *want) == *eq
        })
    }
}

/// A field as the real server's field-set functions render it: missing is "".
fn field_value(obj: &Value, field: &str) -> String {
    if field == "source" {
        return obj
            .pointer("/source/component")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
    }
    let pointer = format!("/{}", field.replace('.', "/"));
    match obj.pointer(&pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ if field == "spec.unschedulable" || field == "spec.hostNetwork" => "false".into(),
        _ => String::new(),
    }
}

/// Label plus field selector, as a watch or list applies them.
#[derive(Debug, Clone, Default)]
pub struct Selector {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selector {
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    /// As [`Self::matches`]: `view` is `stored` as the request reads it.
    pub fn matches_stored(&self, stored: &Stored, view: &Value) -> bool {
        self.labels.matches_set(&stored.labels) && self.fields.matches(view)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "labels": labels}, "spec": {"nodeName": "n1"}})
    }

    #[test]
    fn label_operators() {
        let o = obj(json!({"app": "web", "tier": "fe"}));
        // The label set kept with a stored object answers as its JSON does.
        let set = LabelSet::of(&o);
        let m = |s: &str| {
            let sel = LabelSelector::parse(s).unwrap();
            assert_eq!(sel.matches(&o), sel.matches_set(&set), "{s}");
            sel.matches(&o)
        };
        assert!(m("app=web"));
        assert!(m("app==web,tier"));
        assert!(!m("app!=web"));
        assert!(m("app in (db, web),tier notin (be)"));
        assert!(!m("app notin (web)"));
        assert!(m("!missing"));
        assert!(!m("!app"));
        assert!(m(""));
        assert!(m("ap!=web,tie!=fe,tier=fe"));
        assert!(LabelSelector::parse("a b c=d").is_err());
        // No labels at all.
        let bare = json!({"metadata": {"name": "a"}});
        let sel = LabelSelector::parse("!app,tier!=fe").unwrap();
        assert!(sel.matches(&bare) && sel.matches_set(&LabelSet::of(&bare)));
    }

    #[test]
    fn field_selectors_are_checked_per_kind() {
        let pods = crate::resources::find("", "v1", "pods").unwrap();
        let cms = crate::resources::find("", "v1", "configmaps").unwrap();
        let o = obj(json!({}));
        assert!(
            FieldSelector::parse("spec.nodeName=n1", pods)
                .unwrap()
                .matches(&o)
        );
        assert!(
            !FieldSelector::parse("spec.nodeName!=n1", pods)
                .unwrap()
                .matches(&o)
        );
        assert!(
            FieldSelector::parse("status.phase=", pods)
                .unwrap()
                .matches(&o)
        );
        assert!(FieldSelector::parse("spec.nodeName=n1", cms).is_err());
    }
}
