//! Label and field selectors, parsed from the `labelSelector` / `fieldSelector` query parameters.

use serde_json::{Map, Value};

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
    Gt(String, i64),
    Lt(String, i64),
}

/// A parsed label selector: requirements joined by AND. The empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LabelSelector {
    reqs: Vec<LabelReq>,
}

/// Splits on commas that are not inside parentheses.
fn split_terms(s: &str) -> Result<Vec<&str>, String> {
    let mut terms = Vec::new();
    let mut depth = 0usize;
    let mut start = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.checked_sub(1).ok_or_else(|| format!("unbalanced ')' in {s:?}"))?,
            ',' if depth == 0 => {
                terms.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("unbalanced '(' in {s:?}"));
    }
    terms.push(&s[start..]);
    Ok(terms.into_iter().map(str::trim).filter(|t| !t.is_empty()).collect())
}

fn valid_key(key: &str) -> Result<String, String> {
    let ok = !key.is_empty()
        && key.len() <= 317
        && key.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok { Ok(key.to_owned()) } else { Err(format!("invalid label key {key:?}")) }
}

fn valid_value(value: &str) -> Result<String, String> {
    let ok = value.len() <= 63 && value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok { Ok(value.to_owned()) } else { Err(format!("invalid label value {value:?}")) }
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (x,y),f notin (z),g,!h,n>3`.
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for term in split_terms(s)? {
            reqs.push(Self::parse_term(term)?);
        }
        Ok(Self { reqs })
    }

    fn parse_term(term: &str) -> Result<LabelReq, String> {
        if let Some(key) = term.strip_prefix('!') {
            return Ok(LabelReq::NotExists(valid_key(key.trim())?));
        }
        if let Some(open) = term.find('(') {
            let Some(inner) = term[open + 1..].strip_suffix(')') else {
                return Err(format!("expected ')' at the end of {term:?}"));
            };
            let head: Vec<&str> = term[..open].split_whitespace().collect();
            let [key, op] = head.as_slice() else {
                return Err(format!("expected `key in (..)` or `key notin (..)` in {term:?}"));
            };
            let values = inner.split(',').map(|v| valid_value(v.trim())).collect::<Result<Vec<_>, _>>()?;
            let key = valid_key(key)?;
            return match *op {
                "in" => Ok(LabelReq::In(key, values)),
                "notin" => Ok(LabelReq::NotIn(key, values)),
                other => Err(format!("unknown set operator {other:?} in {term:?}")),
            };
        }
        for (op, len) in [("!=", 2), ("==", 2), ("=", 1), (">", 1), ("<", 1)] {
            if let Some(at) = term.find(op) {
                let key = valid_key(term[..at].trim())?;
                let value = term[at + len..].trim();
                return match op {
                    "!=" => Ok(LabelReq::NotEq(key, valid_value(value)?)),
                    "==" | "=" => Ok(LabelReq::Eq(key, valid_value(value)?)),
                    _ => {
                        let n: i64 = value.parse().map_err(|_| format!("{value:?} is not an integer in {term:?}"))?;
                        Ok(if op == ">" { LabelReq::Gt(key, n) } else { LabelReq::Lt(key, n) })
                    }
                };
            }
        }
        Ok(LabelReq::Exists(valid_key(term)?))
    }

    /// Whether an object's labels satisfy every requirement.
    pub(crate) fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|req| match req {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
            LabelReq::Gt(k, n) => get(k).and_then(|x| x.parse::<i64>().ok()).is_some_and(|x| x > *n),
            LabelReq::Lt(k, n) => get(k).and_then(|x| x.parse::<i64>().ok()).is_some_and(|x| x < *n),
        })
    }
}

/// One requirement of a field selector.
#[derive(Debug, Clone, PartialEq)]
struct FieldReq {
    path: Vec<String>,
    value: String,
    equal: bool,
}

/// A parsed field selector: `path=value`, `path==value` or `path!=value` terms joined by AND.
///
/// Any dotted path into the object is accepted (the real server allows a per-type subset, always
/// including `metadata.name` and `metadata.namespace`). A missing field reads as `""`, so
/// `spec.nodeName!=` selects pods bound to a node and `spec.nodeName=` unbound ones.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FieldSelector {
    reqs: Vec<FieldReq>,
}

impl FieldSelector {
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for term in split_terms(s)? {
            let (path, value, equal) = if let Some((p, v)) = term.split_once("!=") {
                (p, v, false)
            } else if let Some((p, v)) = term.split_once("==") {
                (p, v, true)
            } else if let Some((p, v)) = term.split_once('=') {
                (p, v, true)
            } else {
                return Err(format!("invalid field selector term {term:?}: expected field=value or field!=value"));
            };
            let path = path.trim();
            if path.is_empty() || path.split('.').any(str::is_empty) {
                return Err(format!("invalid field path {path:?}"));
            }
            reqs.push(FieldReq {
                path: path.split('.').map(str::to_owned).collect(),
                value: value.trim().to_owned(),
                equal,
            });
        }
        Ok(Self { reqs })
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|req| {
            let mut cur = Some(obj);
            for seg in &req.path {
                cur = cur.and_then(|v| v.get(seg));
            }
            let actual = match cur {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
            };
            (actual == req.value) == req.equal
        })
    }
}

/// Everything that decides whether an object is visible to a list or watch.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    pub(crate) namespace: Option<String>,
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
}

impl Filter {
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && crate::meta::namespace(obj) != Some(ns.as_str())
        {
            return false;
        }
        self.labels.matches(crate::meta::labels(obj)) && self.fields.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({ "metadata": { "name": "a", "labels": labels }, "spec": { "nodeName": "n1" }, "status": { "phase": "Running" } })
    }

    #[test]
    fn label_equality_and_sets() {
        let o = obj(json!({ "app": "web", "tier": "front", "n": "5" }));
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(crate::meta::labels(&o));
        assert!(m(""));
        assert!(m("app=web"));
        assert!(m("app==web,tier=front"));
        assert!(!m("app=db"));
        assert!(m("app!=db"));
        assert!(m("missing!=x"));
        assert!(m("app in (web, db)"));
        assert!(!m("app notin (web)"));
        assert!(m("missing notin (web)"));
        assert!(m("tier"));
        assert!(!m("!tier"));
        assert!(m("!missing"));
        assert!(m("n>4,n<6"));
        assert!(!m("n>5"));
    }

    #[test]
    fn label_parse_errors() {
        assert!(LabelSelector::parse("app in (web").is_err());
        assert!(LabelSelector::parse("app foo (web)").is_err());
        assert!(LabelSelector::parse("a b=c").is_err());
        assert!(LabelSelector::parse("n>x").is_err());
    }

    #[test]
    fn field_selectors() {
        let o = obj(json!({}));
        let m = |s: &str| FieldSelector::parse(s).unwrap().matches(&o);
        assert!(m("metadata.name=a"));
        assert!(m("spec.nodeName!="));
        assert!(!m("spec.nodeName="));
        assert!(m("status.phase==Running,metadata.namespace="));
        assert!(m("spec.missing="));
        assert!(FieldSelector::parse("spec.nodeName").is_err());
        assert!(FieldSelector::parse(".x=1").is_err());
    }
}
