//! A small model of server-side apply field ownership (`metadata.managedFields`).
//!
//! Fields are leaf paths through JSON maps; lists are atomic (owned as a whole), which is coarser
//! than the real server's associative lists keyed by `name`/`type`. Every write records ownership:
//! updates (create, PUT, merge/JSON/strategic patches) give the changed fields to the writer's
//! `Update` entry; an apply sets the applier's `Apply` entry to exactly the applied fields and
//! fails with 409 Conflict when another manager owns a field the apply would change, unless
//! `force=true` (then ownership moves). Fields dropped from a manager's applied configuration are
//! removed from the object when nobody else owns them.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

type Path = Vec<String>;

/// Which part of an object a write may touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The whole object; `with_status == false` excludes `.status` (status subresource present).
    Main { with_status: bool },
    /// Only `.status` (the `/status` subresource).
    Status,
}

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: String,
    subresource: Option<String>,
    fields: BTreeSet<Path>,
}

impl Entry {
    fn is(&self, manager: &str, operation: &str, subresource: Option<&str>) -> bool {
        self.manager == manager && self.operation == operation && self.subresource.as_deref() == subresource
    }
}

fn related(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The metadata members that carry user data and are tracked.
const TRACKED_META: [&str; 4] = ["labels", "annotations", "finalizers", "ownerReferences"];

/// Tracked leaf paths and their values.
fn leaves(obj: &Value, scope: Scope) -> BTreeMap<Path, &Value> {
    let mut out = BTreeMap::new();
    let Some(root) = obj.as_object() else { return out };
    for (key, value) in root {
        let keep = match (key.as_str(), scope) {
            ("apiVersion" | "kind", _) => false,
            ("metadata", Scope::Main { .. }) => {
                if let Some(meta) = value.as_object() {
                    for m in TRACKED_META {
                        if let Some(v) = meta.get(m) {
                            walk(v, vec!["metadata".to_owned(), m.to_owned()], &mut out);
                        }
                    }
                }
                false
            }
            ("status", Scope::Main { with_status }) => with_status,
            (_, Scope::Main { .. }) => true,
            ("status", Scope::Status) => true,
            (_, Scope::Status) => false,
        };
        if keep {
            walk(value, vec![key.clone()], &mut out);
        }
    }
    out
}

fn walk<'a>(value: &'a Value, path: Path, out: &mut BTreeMap<Path, &'a Value>) {
    match value {
        Value::Null => {}
        // Maps are containers, not values: an empty map owns nothing.
        Value::Object(map) => {
            for (k, v) in map {
                let mut p = path.clone();
                p.push(k.clone());
                walk(v, p, out);
            }
        }
        _ => {
            out.insert(path, value);
        }
    }
}

fn value_at<'a>(obj: &'a Value, path: &Path) -> Option<&'a Value> {
    let mut cur = obj;
    for seg in path {
        cur = cur.get(seg)?;
    }
    Some(cur)
}

fn remove_at(obj: &mut Value, path: &Path) {
    let Some((last, parents)) = path.split_last() else { return };
    let mut cur = obj;
    for seg in parents {
        match cur.get_mut(seg) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(map) = cur.as_object_mut() {
        map.remove(last);
    }
}

fn fields_to_v1(fields: &BTreeSet<Path>) -> Value {
    let mut root = Map::new();
    for path in fields {
        let mut cur = &mut root;
        for seg in path {
            let entry = cur.entry(format!("f:{seg}")).or_insert_with(|| Value::Object(Map::new()));
            if !entry.is_object() {
                *entry = Value::Object(Map::new());
            }
            match entry {
                Value::Object(next) => cur = next,
                _ => break,
            }
        }
    }
    Value::Object(root)
}

fn fields_from_v1(v: &Value, prefix: &mut Path, out: &mut BTreeSet<Path>) {
    let Some(map) = v.as_object() else { return };
    let children: Vec<(&String, &Value)> = map.iter().filter(|(k, _)| k.starts_with("f:")).collect();
    if children.is_empty() {
        if !prefix.is_empty() {
            out.insert(prefix.clone());
        }
        return;
    }
    for (k, child) in children {
        prefix.push(k[2..].to_owned());
        fields_from_v1(child, prefix, out);
        prefix.pop();
    }
}

fn read_entries(obj: &Value) -> Vec<Entry> {
    let Some(list) = obj.pointer("/metadata/managedFields").and_then(Value::as_array) else { return Vec::new() };
    list.iter()
        .filter_map(|e| {
            let mut fields = BTreeSet::new();
            if let Some(f) = e.get("fieldsV1") {
                fields_from_v1(f, &mut Vec::new(), &mut fields);
            }
            Some(Entry {
                manager: e.get("manager")?.as_str()?.to_owned(),
                operation: e.get("operation").and_then(Value::as_str).unwrap_or("Update").to_owned(),
                api_version: e.get("apiVersion").and_then(Value::as_str).unwrap_or_default().to_owned(),
                time: e.get("time").and_then(Value::as_str).unwrap_or_default().to_owned(),
                subresource: e.get("subresource").and_then(Value::as_str).map(str::to_owned),
                fields,
            })
        })
        .collect()
}

fn write_entries(obj: &mut Value, entries: &[Entry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": fields_to_v1(&e.fields),
            });
            if let Some(sub) = &e.subresource {
                v["subresource"] = json!(sub);
            }
            v
        })
        .collect();
    if list.is_empty() {
        crate::meta::remove_meta(obj, "managedFields");
    } else {
        crate::meta::set_meta(obj, "managedFields", Value::Array(list));
    }
}

fn entry_mut<'a>(
    entries: &'a mut Vec<Entry>,
    manager: &str,
    operation: &str,
    subresource: Option<&str>,
    api_version: &str,
) -> &'a mut Entry {
    let idx = match entries.iter().position(|e| e.is(manager, operation, subresource)) {
        Some(i) => i,
        None => {
            entries.push(Entry {
                manager: manager.to_owned(),
                operation: operation.to_owned(),
                api_version: api_version.to_owned(),
                time: String::new(),
                subresource: subresource.map(str::to_owned),
                fields: BTreeSet::new(),
            });
            entries.len() - 1
        }
    };
    &mut entries[idx]
}

/// Who writes: the field manager, the API version written through, and the subresource.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Writer<'a> {
    pub(crate) manager: &'a str,
    pub(crate) api_version: &'a str,
    pub(crate) subresource: Option<&'a str>,
    pub(crate) scope: Scope,
}

/// Records an update (`operation: Update`) from `old` (absent on create) to `new`, writing the
/// resulting `managedFields` into `new`. Ownership entries come from `old`; whatever the client
/// sent in `new.metadata.managedFields` is ignored.
pub(crate) fn record_update(old: Option<&Value>, new: &mut Value, w: Writer<'_>) {
    let mut entries = old.map(read_entries).unwrap_or_default();
    let before = old.map(|o| leaves(o, w.scope)).unwrap_or_default();
    let after = leaves(new, w.scope);
    let changed: Vec<Path> = after.iter().filter(|(p, v)| before.get(*p) != Some(*v)).map(|(p, _)| p.clone()).collect();
    let removed: Vec<Path> = before.keys().filter(|p| !after.contains_key(*p)).cloned().collect();
    if !changed.is_empty() || !removed.is_empty() {
        for e in entries.iter_mut() {
            let before_len = e.fields.len();
            e.fields.retain(|f| !changed.iter().chain(&removed).any(|c| related(f, c)));
            if e.fields.len() != before_len {
                e.time = crate::meta::now_rfc3339();
            }
        }
        if !changed.is_empty() {
            let mine = entry_mut(&mut entries, w.manager, "Update", w.subresource, w.api_version);
            mine.fields.extend(changed);
            mine.api_version = w.api_version.to_owned();
            mine.time = crate::meta::now_rfc3339();
        }
    }
    write_entries(new, &entries);
}

/// Server-side apply of `applied` onto `current` (absent on create). Returns the new object with
/// its `managedFields`, or the conflicts as `(manager, .field.path)` pairs.
pub(crate) fn apply(
    current: &Value,
    applied: &Value,
    force: bool,
    w: Writer<'_>,
) -> Result<Value, Vec<(String, String)>> {
    let mut entries = read_entries(current);
    let applied_leaves = leaves(applied, w.scope);
    let mine = |e: &Entry| e.is(w.manager, "Apply", w.subresource);

    let mut conflicts = BTreeSet::new();
    for e in entries.iter().filter(|e| !mine(e)) {
        for owned in &e.fields {
            for path in applied_leaves.keys().filter(|p| related(p, owned)) {
                let longer = if owned.len() >= path.len() { owned } else { path };
                if value_at(current, longer) != value_at(applied, longer) {
                    conflicts.insert((e.manager.clone(), format!(".{}", longer.join("."))));
                }
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflicts.into_iter().collect());
    }
    let now = crate::meta::now_rfc3339();
    if force {
        for e in entries.iter_mut().filter(|e| !mine(e)) {
            let before_len = e.fields.len();
            e.fields.retain(|f| {
                !applied_leaves.keys().any(|p| related(f, p) && value_at(current, f) != value_at(applied, f))
            });
            if e.fields.len() != before_len {
                e.time.clone_from(&now);
            }
        }
    }

    let mut out = current.clone();
    // Fields this manager applied before but no longer applies are removed unless someone else owns them.
    let previous: BTreeSet<Path> = entries.iter().find(|e| mine(e)).map(|e| e.fields.clone()).unwrap_or_default();
    for dropped in previous.iter().filter(|p| !applied_leaves.contains_key(*p)) {
        let owned_elsewhere = entries.iter().filter(|e| !mine(e)).any(|e| e.fields.iter().any(|f| related(f, dropped)));
        if !owned_elsewhere {
            remove_at(&mut out, dropped);
        }
    }
    crate::patch::merge(&mut out, &scoped(applied, w.scope));

    let new_fields: BTreeSet<Path> = applied_leaves.keys().cloned().collect();
    let entry = entry_mut(&mut entries, w.manager, "Apply", w.subresource, w.api_version);
    if entry.fields != new_fields || entry.time.is_empty() {
        entry.fields = new_fields;
        entry.time = now;
    }
    entry.api_version = w.api_version.to_owned();
    write_entries(&mut out, &entries);
    Ok(out)
}

/// The part of an applied configuration that the scope lets through (system metadata stripped).
fn scoped(applied: &Value, scope: Scope) -> Value {
    let mut out = Map::new();
    let Some(root) = applied.as_object() else { return Value::Object(out) };
    for (k, v) in root {
        let keep = match (k.as_str(), scope) {
            ("apiVersion" | "kind", _) => false,
            ("metadata", Scope::Main { .. }) => {
                let mut meta = Map::new();
                if let Some(m) = v.as_object() {
                    for key in TRACKED_META {
                        if let Some(x) = m.get(key) {
                            meta.insert(key.to_owned(), x.clone());
                        }
                    }
                }
                out.insert(k.clone(), Value::Object(meta));
                false
            }
            ("status", Scope::Main { with_status }) => with_status,
            (_, Scope::Main { .. }) => true,
            ("status", Scope::Status) => true,
            (_, Scope::Status) => false,
        };
        if keep {
            out.insert(k.clone(), v.clone());
        }
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAIN: Scope = Scope::Main { with_status: false };

    fn w(manager: &str) -> Writer<'_> {
        Writer { manager, api_version: "v1", subresource: None, scope: MAIN }
    }

    #[test]
    fn fields_v1_round_trip() {
        let fields: BTreeSet<Path> =
            [vec!["spec".into(), "a".into()], vec!["metadata".into(), "labels".into(), "x".into()]].into();
        let v = fields_to_v1(&fields);
        assert_eq!(v, json!({ "f:spec": { "f:a": {} }, "f:metadata": { "f:labels": { "f:x": {} } } }));
        let mut back = BTreeSet::new();
        fields_from_v1(&v, &mut Vec::new(), &mut back);
        assert_eq!(back, fields);
    }

    #[test]
    fn apply_conflicts_with_other_manager_unless_same_value_or_forced() {
        let empty = json!({ "metadata": { "name": "l" } });
        let a = json!({ "apiVersion": "v1", "kind": "X", "spec": { "holder": "a", "d": 5 } });
        let obj = apply(&empty, &a, false, w("a")).unwrap();
        assert_eq!(obj["spec"]["holder"], "a");
        // Same value: shared ownership, no conflict.
        let same = json!({ "spec": { "d": 5 } });
        let obj = apply(&obj, &same, false, w("b")).unwrap();
        // Different value: conflict.
        let b = json!({ "spec": { "holder": "b" } });
        let err = apply(&obj, &b, false, w("b")).unwrap_err();
        assert_eq!(err, vec![("a".to_owned(), ".spec.holder".to_owned())]);
        // Forced: ownership moves.
        let obj = apply(&obj, &b, true, w("b")).unwrap();
        assert_eq!(obj["spec"]["holder"], "b");
        let again = json!({ "spec": { "holder": "a2" } });
        assert!(apply(&obj, &again, false, w("a")).is_err());
    }

    #[test]
    fn update_takes_ownership_and_apply_drops_unapplied_fields() {
        let empty = json!({ "metadata": { "name": "l" } });
        let a = json!({ "spec": { "x": 1, "y": 2 } });
        let obj = apply(&empty, &a, false, w("a")).unwrap();
        let mut updated = obj.clone();
        updated["spec"]["y"] = json!(3);
        record_update(Some(&obj), &mut updated, w("kubectl"));
        let managers: Vec<&str> = updated["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["manager"].as_str().unwrap())
            .collect();
        assert_eq!(managers, ["a", "kubectl"]);
        // a re-applies without y: kubectl owns y now, so it stays.
        let obj = apply(&updated, &json!({ "spec": { "x": 1 } }), false, w("a")).unwrap();
        assert_eq!(obj["spec"], json!({ "x": 1, "y": 3 }));
        // a applies nothing: x is removed (nobody else owns it).
        let obj = apply(&obj, &json!({ "spec": {} }), false, w("a")).unwrap();
        assert_eq!(obj["spec"], json!({ "y": 3 }));
    }
}
