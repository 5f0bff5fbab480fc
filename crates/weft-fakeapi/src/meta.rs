//! Small helpers over `serde_json::Value` objects: metadata access, timestamps, identifiers.

use serde_json::{Map, Value};

/// `metadata.name`, if set and non-empty.
pub(crate) fn name(obj: &Value) -> Option<&str> {
    str_at(obj, "/metadata/name")
}

/// `metadata.namespace`, if set and non-empty.
pub(crate) fn namespace(obj: &Value) -> Option<&str> {
    str_at(obj, "/metadata/namespace")
}

/// `metadata.resourceVersion`, if set and non-empty.
pub(crate) fn resource_version(obj: &Value) -> Option<&str> {
    str_at(obj, "/metadata/resourceVersion")
}

/// `metadata.uid`, if set and non-empty.
pub(crate) fn uid(obj: &Value) -> Option<&str> {
    str_at(obj, "/metadata/uid")
}

/// `metadata.deletionTimestamp` is set.
pub(crate) fn is_deleting(obj: &Value) -> bool {
    str_at(obj, "/metadata/deletionTimestamp").is_some()
}

/// `metadata.finalizers` as strings (empty when absent).
pub(crate) fn finalizers(obj: &Value) -> Vec<&str> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|list| list.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// `metadata.labels` as a JSON map, if present.
pub(crate) fn labels(obj: &Value) -> Option<&Map<String, Value>> {
    obj.pointer("/metadata/labels").and_then(Value::as_object)
}

/// `metadata.generation`, if present.
pub(crate) fn generation(obj: &Value) -> Option<i64> {
    obj.pointer("/metadata/generation").and_then(Value::as_i64)
}

fn str_at<'a>(obj: &'a Value, pointer: &str) -> Option<&'a str> {
    obj.pointer(pointer).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// The `metadata` map of an object, created if absent or not a map.
///
/// Callers check beforehand that `obj` is a JSON object; anything else is turned into one.
pub(crate) fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    let root = match obj {
        Value::Object(map) => map,
        _ => unreachable_object(),
    };
    let meta = root.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    match meta {
        Value::Object(map) => map,
        _ => unreachable_object(),
    }
}

/// The top-level map of an object, created if `obj` is not a map.
pub(crate) fn root_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    match obj {
        Value::Object(map) => map,
        _ => unreachable_object(),
    }
}

// Both callers replace a non-object with an object right before matching, so this arm cannot be
// reached; it exists only to satisfy the type checker without `unwrap`.
#[cold]
fn unreachable_object() -> ! {
    unreachable!("value was just made a JSON object")
}

/// Sets `metadata.<key>` to a value.
pub(crate) fn set_meta(obj: &mut Value, key: &str, value: Value) {
    meta_mut(obj).insert(key.to_owned(), value);
}

/// Removes `metadata.<key>`.
pub(crate) fn remove_meta(obj: &mut Value, key: &str) -> Option<Value> {
    meta_mut(obj).remove(key)
}

/// The current time as RFC 3339 with second precision, as the apiserver writes `creationTimestamp`.
pub(crate) fn now_rfc3339() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    match k8s_openapi::jiff::Timestamp::from_second(now.as_second()) {
        Ok(ts) => ts.to_string(),
        Err(_) => now.to_string(),
    }
}

/// Renders a set of key/value pairs as a JSON string value.
pub(crate) fn string(s: impl Into<String>) -> Value {
    Value::String(s.into())
}
