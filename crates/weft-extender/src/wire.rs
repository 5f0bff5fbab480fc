//! Wire types of the kube-scheduler extender protocol (`k8s.io/kube-scheduler/extender/v1`).
//!
//! The Go structs carry no json tags, so the wire uses the Go field names (PascalCase) and Go's
//! decoder matches keys case-insensitively. These types always *emit* PascalCase, exactly the field
//! set Go emits (`null` for nil pointers, `{}` for empty maps, `""` for no error), and *accept*
//! PascalCase, camelCase and lowercase keys. The Pod and Nodes inside are ordinary Kubernetes
//! objects with camelCase keys; the Pod often has no `apiVersion`/`kind`.
//!
//! A Node received in `Nodes` is kept as the exact JSON text it arrived in ([`WireNode`]), so that
//! the filter response hands the scheduler back the same objects, including fields newer than the
//! `k8s-openapi` version this crate is built with.
//!
//! The server reads requests with [`read_args`], which walks the body as it arrives
//! ([`crate::stream`]): it counts candidate nodes while decoding and stops at the first one over
//! the limit, so an oversized list is refused after reading only as much of it as the limit allows.

use std::collections::BTreeMap;
use std::io::Read;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use serde::de::{Deserializer, Error as _};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;

use crate::stream::{JsonStream, StreamError};

/// Lowest score a prioritize response may give (`MinExtenderPriority`).
pub const MIN_EXTENDER_PRIORITY: i64 = 0;
/// Highest score a prioritize response may give (`MaxExtenderPriority`). The scheduler multiplies
/// by `MaxNodeScore / MaxExtenderPriority` (100 / 10) and by the extender's `weight`.
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

/// A v1 `Node` as it travels in an extender request: the exact JSON text, and the three things the
/// extender reads of it (name, `resourceVersion`, the `weft.io/gpu-topology` annotation).
///
/// Serialising writes the original text back unchanged. Decoding reads only those fields and walks
/// past the rest (status, images, labels, ...) without building them: kube-scheduler's full Node
/// objects are ~10 KB each and the whole k8s-openapi `Node` took most of a request's time; a field
/// of the wrong type where the extender does not look is echoed as it came, as kube-scheduler sent
/// it. [`WireNode::to_node`] decodes the whole object when it is wanted. The annotation is kept as
/// its JSON string and unescaped only when the topology cache does not already know the node at
/// that `resourceVersion`. Decoding needs `serde_json`'s text deserializers (`from_str`,
/// `from_slice`, `from_reader`), not `from_value`.
#[derive(Clone, Debug)]
pub struct WireNode {
    raw: Box<RawValue>,
    name: String,
    resource_version: Option<String>,
    /// Where in `raw` the annotation's JSON string literal is.
    topology: Option<std::ops::Range<usize>>,
}

/// What [`WireNode`] decodes of a Node; everything else is skipped unread.
#[derive(Deserialize)]
struct NodeHead<'a> {
    #[serde(default, borrow)]
    metadata: Option<MetaHead<'a>>,
}

#[derive(Deserialize)]
struct MetaHead<'a> {
    #[serde(default, borrow)]
    name: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow, rename = "resourceVersion")]
    resource_version: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    annotations: Option<AnnotationsHead<'a>>,
}

#[derive(Deserialize)]
struct AnnotationsHead<'a> {
    /// `weft_record::TOPOLOGY_ANNOTATION` (a test checks the spelling).
    #[serde(default, borrow, rename = "weft.io/gpu-topology")]
    topology: Option<&'a RawValue>,
}

impl WireNode {
    /// Wrap a node, rendering its JSON text.
    pub fn from_node(node: Node) -> Result<WireNode, serde_json::Error> {
        WireNode::from_raw(serde_json::value::to_raw_value(&node)?)
    }

    fn from_raw(raw: Box<RawValue>) -> Result<WireNode, serde_json::Error> {
        let head: NodeHead<'_> = serde_json::from_str(raw.get())?;
        let meta = head.metadata;
        let (name, resource_version, topology) = match meta {
            Some(m) => (m.name, m.resource_version, m.annotations.and_then(|a| a.topology)),
            None => (None, None, None),
        };
        let topology = match topology {
            Some(t) if !t.get().starts_with('"') => {
                return Err(serde_json::Error::custom(format!(
                    "metadata.annotations.{}: expected a string, found {}",
                    weft_record::TOPOLOGY_ANNOTATION,
                    t.get().chars().take(40).collect::<String>()
                )));
            }
            Some(t) => {
                let at = t.get().as_ptr() as usize - raw.get().as_ptr() as usize;
                Some(at..at + t.get().len())
            }
            None => None,
        };
        let (name, resource_version) = (name.map(|n| n.into_owned()), resource_version.map(|v| v.into_owned()));
        Ok(WireNode { name: name.unwrap_or_default(), resource_version, topology, raw })
    }

    /// The whole node, decoded from its text.
    pub fn to_node(&self) -> Result<Node, serde_json::Error> {
        serde_json::from_str(self.raw.get())
    }

    /// The JSON text the node arrived in (or was rendered to).
    pub fn raw_json(&self) -> &str {
        self.raw.get()
    }

    /// The node's `metadata.name` (empty when absent).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the topology cache reads of the node.
    pub fn key(&self) -> crate::cache::NodeKey<'_> {
        crate::cache::NodeKey {
            name: &self.name,
            resource_version: self.resource_version.as_deref(),
            annotation: self.topology.clone().map(|r| crate::cache::Annotation::Json(&self.raw.get()[r])),
        }
    }
}

impl PartialEq for WireNode {
    fn eq(&self, other: &Self) -> bool {
        match (self.to_node(), other.to_node()) {
            (Ok(a), Ok(b)) => a == b,
            _ => self.raw.get() == other.raw.get(),
        }
    }
}

impl Serialize for WireNode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(s)
    }
}

impl<'de> Deserialize<'de> for WireNode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        WireNode::from_raw(raw).map_err(D::Error::custom)
    }
}

/// A v1 `NodeList` (`{metadata, items}`); `items: null` reads as empty.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeList {
    /// List metadata (usually empty in extender traffic).
    #[serde(default, deserialize_with = "null_as_default")]
    pub metadata: ListMeta,
    /// The nodes.
    #[serde(default, deserialize_with = "null_as_default")]
    pub items: Vec<WireNode>,
}

/// The body of a filter or prioritize request.
///
/// kube-scheduler fills `Nodes` when the extender is configured with `nodeCacheCapable: false` and
/// `NodeNames` when it is `true`; the other one is `null`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtenderArgs {
    /// The pod being scheduled. Always set by kube-scheduler; `None` when a caller omitted it.
    #[serde(rename = "Pod", alias = "pod", alias = "POD", default)]
    pub pod: Option<Pod>,
    /// Candidate nodes as full objects (`nodeCacheCapable: false`).
    #[serde(rename = "Nodes", alias = "nodes", alias = "NODES", default)]
    pub nodes: Option<NodeList>,
    /// Candidate node names (`nodeCacheCapable: true`).
    #[serde(rename = "NodeNames", alias = "nodeNames", alias = "nodenames", alias = "NODENAMES", default)]
    pub node_names: Option<Vec<String>>,
}

/// Read an [`ExtenderArgs`] body from `stream`, stopping at the node `max_nodes + 1` (of `Nodes`
/// or `NodeNames`) with [`StreamError::TooManyNodes`]. Keys match without regard to ASCII case, as
/// Go's decoder matches them; unknown keys are skipped unread; the pod, the node objects and the
/// names count as kept ([`JsonStream::kept`]). A repeated key replaces the earlier value, as in Go.
pub fn read_args<R: Read>(stream: &mut JsonStream<R>, max_nodes: usize) -> Result<ExtenderArgs, StreamError> {
    let mut args = ExtenderArgs::default();
    stream.object("ExtenderArgs", |s, key| {
        if key.eq_ignore_ascii_case("Pod") {
            args.pod = s.kept("Pod")?;
        } else if key.eq_ignore_ascii_case("Nodes") {
            args.nodes = read_node_list(s, max_nodes)?;
        } else if key.eq_ignore_ascii_case("NodeNames") {
            args.node_names = read_names(s, "NodeNames", max_nodes)?;
        } else {
            s.skip()?;
        }
        Ok(())
    })?;
    stream.finish()?;
    Ok(args)
}

fn read_node_list<R: Read>(s: &mut JsonStream<R>, max_nodes: usize) -> Result<Option<NodeList>, StreamError> {
    let mut list = NodeList::default();
    let present = s.object("Nodes", |s, key| {
        if key.eq_ignore_ascii_case("metadata") {
            list.metadata = s.kept::<Option<ListMeta>>("Nodes.metadata")?.unwrap_or_default();
        } else if key.eq_ignore_ascii_case("items") {
            list.items.clear();
            s.array("Nodes.items", |s, i| {
                if i >= max_nodes {
                    return Err(StreamError::TooManyNodes { max: max_nodes });
                }
                list.items.push(s.kept_item("Nodes.items", i)?);
                Ok(())
            })?;
        } else {
            s.skip()?;
        }
        Ok(())
    })?;
    Ok(present.then_some(list))
}

/// A JSON array of node names, stopping at the name `max + 1`; `null` is `None`.
pub fn read_names<R: Read>(s: &mut JsonStream<R>, what: &str, max: usize) -> Result<Option<Vec<String>>, StreamError> {
    let mut names = Vec::new();
    let present = s.array(what, |s, i| {
        if i >= max {
            return Err(StreamError::TooManyNodes { max });
        }
        names.push(s.kept_item(what, i)?);
        Ok(())
    })?;
    Ok(present.then_some(names))
}

/// Node name → reason.
pub type FailedNodesMap = BTreeMap<String, String>;

/// The body of a filter response.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtenderFilterResult {
    /// Nodes that passed, as objects (answer to a request that carried `Nodes`).
    #[serde(rename = "Nodes", alias = "nodes", alias = "NODES", default)]
    pub nodes: Option<NodeList>,
    /// Names of nodes that passed (answer to a request that carried `NodeNames`); must be a subset
    /// of the request's names.
    #[serde(rename = "NodeNames", alias = "nodeNames", alias = "nodenames", alias = "NODENAMES", default)]
    pub node_names: Option<Vec<String>>,
    /// Nodes that failed, with reasons; preemption may help.
    #[serde(
        rename = "FailedNodes",
        alias = "failedNodes",
        alias = "failednodes",
        alias = "FAILEDNODES",
        default,
        deserialize_with = "null_as_default"
    )]
    pub failed_nodes: FailedNodesMap,
    /// Nodes that failed where preemption cannot help (takes precedence over `FailedNodes`).
    #[serde(
        rename = "FailedAndUnresolvableNodes",
        alias = "failedAndUnresolvableNodes",
        alias = "failedandunresolvablenodes",
        alias = "FAILEDANDUNRESOLVABLENODES",
        default,
        deserialize_with = "null_as_default"
    )]
    pub failed_and_unresolvable_nodes: FailedNodesMap,
    /// Non-empty when the whole call failed; kube-scheduler treats it as an error of this extender.
    #[serde(rename = "Error", alias = "error", alias = "ERROR", default, deserialize_with = "null_as_default")]
    pub error: String,
}

/// One entry of a prioritize response (the response body is a JSON array of these).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    /// Node name.
    #[serde(rename = "Host", alias = "host", alias = "HOST", default, deserialize_with = "null_as_default")]
    pub host: String,
    /// Score, [`MIN_EXTENDER_PRIORITY`]..=[`MAX_EXTENDER_PRIORITY`].
    #[serde(rename = "Score", alias = "score", alias = "SCORE", default, deserialize_with = "null_as_default")]
    pub score: i64,
    /// weft extension, only emitted on request (`X-Weft-Debug: true`): why the node got this score.
    /// kube-scheduler's decoder ignores unknown fields.
    #[serde(rename = "Reason", alias = "reason", default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The body of a prioritize response.
pub type HostPriorityList = Vec<HostPriority>;

/// The body of a bind request (`bindVerb`): the pod kube-scheduler chose a node for, and the node.
/// The extender that sets `bindVerb` must create the pod's Binding itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingArgs {
    /// The pod's name.
    #[serde(
        rename = "PodName",
        alias = "podName",
        alias = "podname",
        alias = "PODNAME",
        default,
        deserialize_with = "null_as_default"
    )]
    pub pod_name: String,
    /// The pod's namespace.
    #[serde(
        rename = "PodNamespace",
        alias = "podNamespace",
        alias = "podnamespace",
        alias = "PODNAMESPACE",
        default,
        deserialize_with = "null_as_default"
    )]
    pub pod_namespace: String,
    /// The pod's UID.
    #[serde(
        rename = "PodUID",
        alias = "podUID",
        alias = "podUid",
        alias = "poduid",
        alias = "PODUID",
        default,
        deserialize_with = "null_as_default"
    )]
    pub pod_uid: String,
    /// The chosen node.
    #[serde(rename = "Node", alias = "node", alias = "NODE", default, deserialize_with = "null_as_default")]
    pub node: String,
}

/// The body of a bind response: empty `Error` when the pod was bound.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingResult {
    /// Non-empty when binding failed; kube-scheduler treats it as an error of this extender.
    #[serde(rename = "Error", alias = "error", alias = "ERROR", default, deserialize_with = "null_as_default")]
    pub error: String,
}

/// Read `null` (as Go writes nil maps, slices and pointers) as the type's default.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}
