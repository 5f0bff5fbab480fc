//! Patch formats: JSON merge patch, JSON patch, strategic merge (approximated), apply bodies.

use json_patch::PatchOperation;
use serde_json::Value;

use crate::error::ApiError;

/// The patch type, from the request's `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchKind {
    /// `application/merge-patch+json` (RFC 7386).
    Merge,
    /// `application/json-patch+json` (RFC 6902).
    Json,
    /// `application/strategic-merge-patch+json`, applied as a merge patch.
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply).
    Apply,
}

impl PatchKind {
    pub(crate) fn from_content_type(content_type: &str) -> Option<Self> {
        let essence = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
        match essence.as_str() {
            "application/merge-patch+json" => Some(Self::Merge),
            "application/json-patch+json" => Some(Self::Json),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" | "application/apply-patch+cbor" => {
                Some(Self::Apply)
            }
            _ => None,
        }
    }
}

/// Parses a JSON request body that must be a JSON object.
pub(crate) fn parse_object(body: &[u8], what: &str) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding {what}: invalid JSON: {e}")))?;
    if value.is_object() {
        Ok(value)
    } else {
        Err(ApiError::bad_request(format!("error decoding {what}: expected a JSON object, got {}", kind_of(&value))))
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Applies a JSON merge patch (RFC 7386) in place. The patch must be an object.
pub(crate) fn merge(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// Drops the strategic-merge directives (`$patch`, `$retainKeys`, `$setElementOrder/…`,
/// `$deleteFromPrimitiveList/…`) so the rest can be applied as a merge patch.
pub(crate) fn strip_strategic_directives(patch: &mut Value) {
    match patch {
        Value::Object(map) => {
            map.retain(|k, _| !k.starts_with('$'));
            map.values_mut().for_each(strip_strategic_directives);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_strategic_directives),
        _ => {}
    }
}

/// Applies an RFC 6902 JSON patch to a copy of `doc`, atomically.
///
/// `test` follows the apiserver's JSON-patch library: testing a missing member against `null`
/// succeeds (kube's finalizer helper relies on this for `/metadata/finalizers`). A failed
/// operation answers 422 Invalid, a malformed patch 400 BadRequest, like the apiserver.
pub(crate) fn json_patch(doc: &Value, body: &[u8]) -> Result<Value, ApiError> {
    let raw: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding JSON patch: invalid JSON: {e}")))?;
    let patch: json_patch::Patch =
        serde_json::from_value(raw).map_err(|e| ApiError::bad_request(format!("error decoding JSON patch: {e}")))?;
    let mut out = doc.clone();
    for (i, op) in patch.0.iter().enumerate() {
        match op {
            PatchOperation::Test(test) => test_op(&out, test.path.as_str(), &test.value)
                .map_err(|why| ApiError::unprocessable(format!("json patch operation {i} (test) failed: {why}")))?,
            other => json_patch::patch(&mut out, std::slice::from_ref(other))
                .map_err(|e| ApiError::unprocessable(format!("json patch operation {i} failed: {e}")))?,
        }
    }
    Ok(out)
}

fn unescape_token(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

fn test_op(doc: &Value, path: &str, expected: &Value) -> Result<(), String> {
    if let Some(actual) = doc.pointer(path) {
        return if actual == expected { Ok(()) } else { Err(format!("testing value {path} failed")) };
    }
    let Some(split) = path.rfind('/') else {
        return Err(format!("invalid path {path:?}"));
    };
    let (parent, key) = (&path[..split], unescape_token(&path[split + 1..]));
    match doc.pointer(parent) {
        Some(Value::Object(map)) if !map.contains_key(&key) && expected.is_null() => Ok(()),
        Some(_) => Err(format!("testing value {path} failed: the value is missing")),
        None => Err(format!("test operation does not apply: is missing path: {path}")),
    }
}

/// Parses a server-side apply body, JSON or YAML; it must be an object.
pub(crate) fn parse_apply(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(json_err) => {
            let text = std::str::from_utf8(body).map_err(|_| {
                ApiError::bad_request("error decoding apply patch: body is neither JSON nor UTF-8 YAML")
            })?;
            serde_saphyr::from_str::<Value>(text).map_err(|yaml_err| {
                ApiError::bad_request(format!(
                    "error decoding apply patch: not JSON ({json_err}) and not YAML ({yaml_err})"
                ))
            })?
        }
    };
    if value.is_object() {
        Ok(value)
    } else {
        Err(ApiError::bad_request(format!("error decoding apply patch: expected an object, got {}", kind_of(&value))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn content_types() {
        assert_eq!(PatchKind::from_content_type("application/merge-patch+json; charset=utf-8"), Some(PatchKind::Merge));
        assert_eq!(PatchKind::from_content_type("application/apply-patch+yaml"), Some(PatchKind::Apply));
        assert_eq!(PatchKind::from_content_type("text/plain"), None);
    }

    #[test]
    fn test_op_on_missing_member_against_null_passes() {
        let doc = json!({ "metadata": { "name": "a" } });
        let body = br#"[{"op":"test","path":"/metadata/finalizers","value":null},
                        {"op":"add","path":"/metadata/finalizers","value":["x"]}]"#;
        let out = json_patch(&doc, body).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["x"]));
    }

    #[test]
    fn failed_test_is_422_and_atomic() {
        let doc = json!({ "a": 1 });
        let body = br#"[{"op":"replace","path":"/a","value":2},{"op":"test","path":"/a","value":3}]"#;
        let err = json_patch(&doc, body).unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(err.reason, "Invalid");
        let err = json_patch(&doc, br#"[{"op":"test","path":"/x/y","value":null}]"#).unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(json_patch(&doc, b"{").unwrap_err().code, 400);
        assert_eq!(json_patch(&doc, br#"[{"op":"frobnicate","path":"/a"}]"#).unwrap_err().code, 400);
    }

    #[test]
    fn apply_accepts_yaml() {
        let v = parse_apply(b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata:\n  k: v\n").unwrap();
        assert_eq!(v["data"]["k"], "v");
        assert!(parse_apply(b"- 1\n- 2\n").is_err());
        assert!(parse_apply(b"\xff\xfe").is_err());
    }

    #[test]
    fn strategic_directives_are_dropped() {
        let mut p = json!({ "$setElementOrder/x": [1], "spec": { "$retainKeys": ["a"], "a": 1 } });
        strip_strategic_directives(&mut p);
        assert_eq!(p, json!({ "spec": { "a": 1 } }));
    }
}
