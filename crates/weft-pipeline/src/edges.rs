//! Edge bindings: which Pipeline edges run over which NumaNetwork, and how.
//!
//! Two places say so, and both are read:
//!
//! - `spec.edges[i].numaNetwork: {name, connectionType}`, the proposal's field. Numaflow's
//!   *minimal* Pipeline CRD (its default install) keeps unknown fields under `spec`, so the field
//!   reaches the webhook; its *full* CRD prunes it before admission.
//! - the Pipeline annotation [`NUMA_NETWORK_EDGES_ANNOTATION`], a JSON array of
//!   `{from, to, numaNetwork, connectionType}` (the contrib prototype's form, under weft's
//!   prefix), for clusters whose CRD prunes the field.
//!
//! An annotation entry must name an edge that is in `spec.edges`. Both places may bind the same
//! edge only to the same network and type; anything else is a conflict and an error.

use std::collections::HashMap;
use std::fmt;

use serde_json::{Map, Value};

use crate::problem::Collector;

/// Pipeline annotation binding edges to NumaNetworks: a JSON array of
/// `{"from": "<vertex>", "to": "<vertex>", "numaNetwork": "<name>", "connectionType": "direct" | "multi-isbsvc"}`.
pub const NUMA_NETWORK_EDGES_ANNOTATION: &str = "weft.io/numa-network-edges";

/// How the two vertices of a bound edge talk over the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConnectionType {
    /// `direct`: the from-vertex's user container sends straight to the to-vertex's user
    /// containers on the network (the to-vertices' domains are in its `VERTEX_DOMAIN_TARGETS`).
    Direct,
    /// `multi-isbsvc`: through an inter-step buffer service on the network. weft gives both
    /// vertices the network's NIC and their domains; putting the ISB service itself on the network
    /// is outside this proposal's scope.
    MultiIsbsvc,
}

impl ConnectionType {
    /// The value as written in a Pipeline.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectionType::Direct => "direct",
            ConnectionType::MultiIsbsvc => "multi-isbsvc",
        }
    }

    /// Reads `direct` or `multi-isbsvc` (exactly; Kubernetes enums are case-sensitive).
    pub fn parse(s: &str) -> Option<ConnectionType> {
        match s {
            "direct" => Some(ConnectionType::Direct),
            "multi-isbsvc" => Some(ConnectionType::MultiIsbsvc),
            _ => None,
        }
    }
}

impl fmt::Display for ConnectionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a binding is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `spec.edges[i].numaNetwork`.
    Edge(usize),
    /// Entry `i` of the [`NUMA_NETWORK_EDGES_ANNOTATION`] array.
    Annotation(usize),
}

impl Origin {
    /// The binding's path: `spec.edges[1].numaNetwork` or
    /// `metadata.annotations[weft.io/numa-network-edges][0]`.
    pub fn path(&self) -> String {
        match self {
            Origin::Edge(i) => format!("spec.edges[{i}].numaNetwork"),
            Origin::Annotation(i) => format!("metadata.annotations[{NUMA_NETWORK_EDGES_ANNOTATION}][{i}]"),
        }
    }

    /// Path of the network's name.
    pub fn network_path(&self) -> String {
        match self {
            Origin::Edge(_) => format!("{}.name", self.path()),
            Origin::Annotation(_) => format!("{}.numaNetwork", self.path()),
        }
    }

    /// Path of the connection type.
    pub fn type_path(&self) -> String {
        format!("{}.connectionType", self.path())
    }

    /// Path of the from-vertex's name.
    pub fn from_path(&self) -> String {
        match self {
            Origin::Edge(i) => format!("spec.edges[{i}].from"),
            Origin::Annotation(_) => format!("{}.from", self.path()),
        }
    }

    /// Path of the to-vertex's name.
    pub fn to_path(&self) -> String {
        match self {
            Origin::Edge(i) => format!("spec.edges[{i}].to"),
            Origin::Annotation(_) => format!("{}.to", self.path()),
        }
    }
}

/// One edge bound to a NumaNetwork.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EdgeBinding {
    /// The from-vertex.
    pub from: String,
    /// The to-vertex.
    pub to: String,
    /// The NumaNetwork's name.
    pub network: String,
    /// How the vertices talk.
    pub connection: ConnectionType,
    /// Where it is written: the first place first (one or both).
    pub origins: Vec<Origin>,
}

impl EdgeBinding {
    /// Where the binding was first written.
    pub fn origin(&self) -> &Origin {
        // `origins` is never empty: a binding is made from the place it was read.
        &self.origins[0]
    }
}

/// One binding as written, before it is merged with the others.
struct Written {
    from: String,
    to: String,
    network: String,
    connection: ConnectionType,
    origin: Origin,
}

fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(_) => "a boolean".into(),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("'{s}'"),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// A string field of `obj` that must be present and non-empty.
fn required_str(
    obj: &Map<String, Value>,
    key: &str,
    path: &str,
    what: &str,
    problems: &mut Collector,
) -> Option<String> {
    match obj.get(key) {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Value::String(_)) => {
            problems.push(format!("{path}.{key}"), format!("empty; {what}"));
            None
        }
        None | Some(Value::Null) => {
            problems.push(format!("{path}.{key}"), format!("missing; {what}"));
            None
        }
        Some(other) => {
            problems.push(format!("{path}.{key}"), format!("{} is not a string; {what}", describe(other)));
            None
        }
    }
}

fn connection_type(obj: &Map<String, Value>, path: &str, problems: &mut Collector) -> Option<ConnectionType> {
    let raw = required_str(obj, "connectionType", path, "set direct or multi-isbsvc", problems)?;
    let parsed = ConnectionType::parse(&raw);
    if parsed.is_none() {
        problems.push(format!("{path}.connectionType"), format!("'{raw}' is not direct or multi-isbsvc"));
    }
    parsed
}

/// `spec.edges[i].numaNetwork` of one edge, if it has one.
fn edge_binding(i: usize, edge: &Value, problems: &mut Collector) -> Option<Written> {
    let edge = edge.as_object()?;
    let nn = match edge.get("numaNetwork") {
        None | Some(Value::Null) => return None,
        Some(v) => v,
    };
    let origin = Origin::Edge(i);
    let path = origin.path();
    let Some(nn) = nn.as_object() else {
        problems.push(path, format!("{} is not an object {{name, connectionType}}", describe(nn)));
        return None;
    };
    for key in nn.keys() {
        if key != "name" && key != "connectionType" {
            problems.push(format!("{path}.{key}"), "unknown field; numaNetwork has name and connectionType");
        }
    }
    let network = required_str(nn, "name", &path, "name the NumaNetwork the edge runs over", problems);
    let connection = connection_type(nn, &path, problems);
    let from = required_str(edge, "from", &format!("spec.edges[{i}]"), "name the vertex the edge leaves", problems);
    let to = required_str(edge, "to", &format!("spec.edges[{i}]"), "name the vertex the edge enters", problems);
    Some(Written { from: from?, to: to?, network: network?, connection: connection?, origin })
}

/// The Pipeline's annotation entries.
fn annotation_bindings(pipeline: &Value, problems: &mut Collector) -> Vec<Written> {
    let Some(raw) = pipeline.pointer("/metadata/annotations").and_then(|a| a.get(NUMA_NETWORK_EDGES_ANNOTATION)) else {
        return Vec::new();
    };
    let path = format!("metadata.annotations[{NUMA_NETWORK_EDGES_ANNOTATION}]");
    let shape = "a JSON array of {\"from\", \"to\", \"numaNetwork\", \"connectionType\"}";
    let Some(text) = raw.as_str() else {
        problems.push(path, format!("{} is not a string; it holds {shape}", describe(raw)));
        return Vec::new();
    };
    let entries: Vec<Value> = match serde_json::from_str(text) {
        Ok(Value::Array(a)) => a,
        Ok(other) => {
            problems.push(path, format!("{} is not {shape}", describe(&other)));
            return Vec::new();
        }
        Err(e) => {
            problems.push(path, format!("not valid JSON ({e}); it holds {shape}"));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let origin = Origin::Annotation(i);
        let path = origin.path();
        let Some(obj) = entry.as_object() else {
            problems
                .push(path, format!("{} is not an object {{from, to, numaNetwork, connectionType}}", describe(entry)));
            continue;
        };
        for key in obj.keys() {
            if !matches!(key.as_str(), "from" | "to" | "numaNetwork" | "connectionType") {
                problems.push(
                    format!("{path}.{key}"),
                    "unknown field; entries have from, to, numaNetwork and connectionType",
                );
            }
        }
        let from = required_str(obj, "from", &path, "name the vertex the edge leaves", problems);
        let to = required_str(obj, "to", &path, "name the vertex the edge enters", problems);
        let network = required_str(obj, "numaNetwork", &path, "name the NumaNetwork the edge runs over", problems);
        let connection = connection_type(obj, &path, problems);
        if let (Some(from), Some(to), Some(network), Some(connection)) = (from, to, network, connection) {
            out.push(Written { from, to, network, connection, origin });
        }
    }
    out
}

/// Every edge binding of `pipeline`, merged, in the order first written (spec edges first, then
/// the annotation). Problems with the bindings themselves (shape, type, an annotation entry for
/// an edge not in `spec.edges`, conflicts) are pushed to `problems`; a binding with a problem is
/// left out.
pub(crate) fn collect(pipeline: &Value, problems: &mut Collector) -> Vec<EdgeBinding> {
    let edges = pipeline.pointer("/spec/edges");
    let mut written = Vec::new();
    // (from, to) of every spec edge, bound or not: annotation entries must name one.
    let mut spec_pairs: HashMap<(String, String), usize> = HashMap::new();
    if let Some(Value::Array(edges)) = edges {
        for (i, edge) in edges.iter().enumerate() {
            if let (Some(from), Some(to)) =
                (edge.get("from").and_then(Value::as_str), edge.get("to").and_then(Value::as_str))
            {
                spec_pairs.entry((from.to_owned(), to.to_owned())).or_insert(i);
            }
            written.extend(edge_binding(i, edge, problems));
        }
    }
    let annotated = annotation_bindings(pipeline, problems);
    if !annotated.is_empty() && !matches!(edges, Some(Value::Array(_))) {
        let what = match edges {
            None | Some(Value::Null) => "missing".to_owned(),
            Some(other) => format!("{} is not a list", describe(other)),
        };
        problems.push("spec.edges", format!("{what}; the edges {NUMA_NETWORK_EDGES_ANNOTATION} binds must be in it"));
    }
    for w in annotated {
        if !spec_pairs.contains_key(&(w.from.clone(), w.to.clone())) {
            problems.push(
                w.origin.path(),
                format!("edge '{}' → '{}' is not in spec.edges; bind only edges the pipeline has", w.from, w.to),
            );
            continue;
        }
        written.push(w);
    }

    let mut merged: Vec<EdgeBinding> = Vec::new();
    let mut by_pair: HashMap<(String, String), usize> = HashMap::new();
    for w in written {
        let key = (w.from.clone(), w.to.clone());
        match by_pair.get(&key) {
            Some(&at) => {
                let first = &mut merged[at];
                if first.network == w.network && first.connection == w.connection {
                    first.origins.push(w.origin);
                } else {
                    problems.push(
                        w.origin.path(),
                        format!(
                            "binds edge '{}' → '{}' to NumaNetwork '{}' ({}), but {} binds it to '{}' ({}); bind each edge once",
                            w.from,
                            w.to,
                            w.network,
                            w.connection,
                            first.origin().path(),
                            first.network,
                            first.connection
                        ),
                    );
                }
            }
            None => {
                by_pair.insert(key, merged.len());
                merged.push(EdgeBinding {
                    from: w.from,
                    to: w.to,
                    network: w.network,
                    connection: w.connection,
                    origins: vec![w.origin],
                });
            }
        }
    }
    merged
}

/// The edge bindings of `pipeline` and every problem with them.
pub fn bindings(pipeline: &Value) -> (Vec<EdgeBinding>, Vec<crate::Problem>) {
    let mut problems = Collector::default();
    let b = collect(pipeline, &mut problems);
    (b, problems.0)
}

/// The NumaNetworks `pipeline` names anywhere (spec edges and the annotation), sorted, each once,
/// even where the rest of a binding is wrong. The webhook looks these up before wiring.
pub fn referenced_networks(pipeline: &Value) -> Vec<String> {
    let mut names = Vec::new();
    if let Some(Value::Array(edges)) = pipeline.pointer("/spec/edges") {
        for edge in edges {
            if let Some(name) = edge.pointer("/numaNetwork/name").and_then(Value::as_str) {
                names.push(name.to_owned());
            }
        }
    }
    let annotated = pipeline
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(NUMA_NETWORK_EDGES_ANNOTATION))
        .and_then(Value::as_str)
        .and_then(|t| serde_json::from_str::<Vec<Value>>(t).ok())
        .unwrap_or_default();
    for entry in annotated {
        if let Some(name) = entry.get("numaNetwork").and_then(Value::as_str) {
            names.push(name.to_owned());
        }
    }
    names.retain(|n| !n.is_empty());
    names.sort_unstable();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    fn pipeline(edges: Value, annotation: Option<&str>) -> Value {
        let mut p = json!({"metadata": {"name": "video"}, "spec": {"edges": edges}});
        if let Some(a) = annotation {
            p["metadata"]["annotations"] = json!({NUMA_NETWORK_EDGES_ANNOTATION: a});
        }
        p
    }

    #[test]
    fn spec_edges_and_the_annotation_merge() {
        let p = pipeline(
            json!([
                {"from": "in", "to": "a"},
                {"from": "a", "to": "b", "numaNetwork": {"name": "n1", "connectionType": "direct"}},
                {"from": "b", "to": "out"}
            ]),
            Some(
                r#"[{"from":"b","to":"out","numaNetwork":"n2","connectionType":"multi-isbsvc"},
                     {"from":"a","to":"b","numaNetwork":"n1","connectionType":"direct"}]"#,
            ),
        );
        let (b, problems) = bindings(&p);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(b.len(), 2);
        assert_eq!((b[0].network.as_str(), b[0].connection), ("n1", ConnectionType::Direct));
        assert_eq!(b[0].origins, vec![Origin::Edge(1), Origin::Annotation(1)], "the same binding twice is one");
        assert_eq!((b[1].from.as_str(), b[1].to.as_str(), b[1].network.as_str()), ("b", "out", "n2"));
        assert_eq!(referenced_networks(&p), vec!["n1", "n2"]);
    }

    #[test]
    fn each_problem_is_named_where_it_is() {
        let p = pipeline(
            json!([
                {"from": "a", "to": "b", "numaNetwork": {"name": "n1", "connectionType": "fast"}},
                {"from": "b", "to": "c", "numaNetwork": {"name": "", "connectiontype": "direct"}},
                {"from": "c", "to": "d", "numaNetwork": "n1"},
                {"from": "d", "to": "e", "numaNetwork": {"name": "n1", "connectionType": "direct"}}
            ]),
            Some(
                r#"[{"from":"x","to":"y","numaNetwork":"n1","connectionType":"direct"},
                     {"from":"d","to":"e","numaNetwork":"n2","connectionType":"direct"},
                     {"from":"d","to":"e","numaNetwork":"n1","connectionType":"direct","extra":1},
                     7]"#,
            ),
        );
        let (b, problems) = bindings(&p);
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        let has = |s: &str| assert!(text.iter().any(|t| t == s), "missing {s:?} in {text:#?}");
        has("spec.edges[0].numaNetwork.connectionType: 'fast' is not direct or multi-isbsvc");
        has("spec.edges[1].numaNetwork.connectiontype: unknown field; numaNetwork has name and connectionType");
        has("spec.edges[1].numaNetwork.name: empty; name the NumaNetwork the edge runs over");
        has("spec.edges[1].numaNetwork.connectionType: missing; set direct or multi-isbsvc");
        has("spec.edges[2].numaNetwork: 'n1' is not an object {name, connectionType}");
        has(
            "metadata.annotations[weft.io/numa-network-edges][0]: edge 'x' → 'y' is not in spec.edges; bind only edges the pipeline has",
        );
        has(
            "metadata.annotations[weft.io/numa-network-edges][1]: binds edge 'd' → 'e' to NumaNetwork 'n2' (direct), but spec.edges[3].numaNetwork binds it to 'n1' (direct); bind each edge once",
        );
        has(
            "metadata.annotations[weft.io/numa-network-edges][2].extra: unknown field; entries have from, to, numaNetwork and connectionType",
        );
        has(
            "metadata.annotations[weft.io/numa-network-edges][3]: the number 7 is not an object {from, to, numaNetwork, connectionType}",
        );
        assert_eq!(text.len(), 9, "{text:#?}");
        assert_eq!(b.len(), 1, "only the good binding (d → e on n1) is kept: {b:?}");
    }

    #[test]
    fn malformed_annotations_are_one_problem_each() {
        for (text, want) in
            [("[{", "not valid JSON"), (r#"{"from":"a"}"#, "an object is not a JSON array"), ("", "not valid JSON")]
        {
            let (_, problems) = bindings(&pipeline(json!([]), Some(text)));
            assert_eq!(problems.len(), 1, "{text}: {problems:?}");
            assert!(problems[0].message.contains(want), "{text}: {problems:?}");
            assert_eq!(problems[0].path, "metadata.annotations[weft.io/numa-network-edges]");
        }
        let mut p = pipeline(json!([]), None);
        p["metadata"]["annotations"] = json!({NUMA_NETWORK_EDGES_ANNOTATION: 5});
        assert!(bindings(&p).1[0].message.contains("is not a string"));
        let mut p =
            pipeline(json!(null), Some(r#"[{"from":"a","to":"b","numaNetwork":"n","connectionType":"direct"}]"#));
        p["spec"].as_object_mut().unwrap().remove("edges");
        let (_, problems) = bindings(&p);
        assert!(problems.iter().any(|p| p.path == "spec.edges" && p.message.starts_with("missing")), "{problems:?}");
    }

    #[test]
    fn a_pipeline_without_bindings_has_none_and_no_problems() {
        for p in [
            json!({}),
            json!({"spec": {"edges": "weird"}}),
            json!({"spec": {"edges": [{"from": "a", "to": "b"}, 5, {"numaNetwork": null}]}}),
        ] {
            let (b, problems) = bindings(&p);
            assert!(b.is_empty() && problems.is_empty(), "{p}: {b:?} {problems:?}");
        }
    }
}
