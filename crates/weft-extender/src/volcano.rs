//! vc-scheduler's `extender` plugin (volcano-sh/volcano `pkg/scheduler/plugins/extender`), served
//! by the same process and the same decisions as kube-scheduler's extender protocol. Volcano Jobs'
//! pods are scheduled by vc-scheduler (the webhook defaults `schedulerName: volcano`), which never
//! calls kube-scheduler's extenders; its own plugin POSTs JSON to `urlPrefix + "/" + verb`:
//!
//! | vc-scheduler callback | body | weft answers |
//! | --- | --- | --- |
//! | PredicateFn | `{"task": TaskInfo, "node": NodeInfo}` | `{"status": reason, "code": n}` from filter |
//! | BatchNodeOrderFn | `{"task": TaskInfo, "nodes": [NodeInfo]}` | `{"nodeScore": {node: 0–100}, "errorMessage": ""}` from prioritize |
//! | AllocateFunc (event) | `{"task": TaskInfo}` (its `NodeName` set) | `{"errorMessage": ""}`: picks and reserves the GPU set, records it on the pod; for a bound pod (a victim `unevict`ed) nothing |
//! | DeallocateFunc (event) | `{"task": TaskInfo}` | `{"errorMessage": ""}`: releases the reservation and the record; for a bound pod (a victim `Evict`ed) marks it evicted |
//!
//! `TaskInfo` and `NodeInfo` are Go structs without JSON tags, so their fields arrive under their Go
//! names (`UID`, `Name`, `Namespace`, `NodeName`, `Pod`; `Name`, `Node`); weft reads those and
//! ignores the rest (resources, node state, the node's tasks: weft has its own watch of the
//! cluster). Status codes are Volcano's (`api.Success` 0, `Error` 1, `Unschedulable` 2,
//! `UnschedulableAndUnresolvable` 3). Volcano's node scores are 0–100 (`MaxNodeScore`), so weft
//! sends its node score (0–10 on kube-scheduler's scale) times 10.
//!
//! Volcano sends each `NodeInfo` whole, with every task pod on the node, so a BatchNodeOrderFn
//! body grows with the cluster's pods (1,000 nodes × 20 pods: 67 MiB). [`read_prioritize`] and
//! [`read_predicate`] read the body as it arrives ([`crate::stream`]): one `NodeInfo` at a time is
//! held, only its `Name` is kept, and the node count stops at `--max-nodes-per-request`.
//!
//! vc-scheduler binds the pod itself, later in the session; weft cannot make the decision part of
//! the Binding as it does for kube-scheduler. AllocateFunc answers only after the pod carries
//! `weft.io/gpu-ids` and `weft.io/gpu-decision` (a JSON merge patch that fails unless the pod still
//! has the task's UID), so the record is on the pod before vc-scheduler can bind it. An allocation
//! the session discards (a gang that does not fit) comes back as DeallocateFunc, which releases the
//! reservation and removes the record if it is still the one made for that node.

use std::collections::BTreeMap;
use std::io::Read;

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use crate::stream::{JsonStream, StreamError};

/// Volcano's `api.Success`.
pub const SUCCESS: i32 = 0;
/// Volcano's `api.Error`: unexpected input or an internal failure.
pub const ERROR: i32 = 1;
/// Volcano's `api.Unschedulable`: preemption might help.
pub const UNSCHEDULABLE: i32 = 2;
/// Volcano's `api.UnschedulableAndUnresolvable`: preemption would not help.
pub const UNSCHEDULABLE_AND_UNRESOLVABLE: i32 = 3;

/// Volcano's `api.Allocated`: the session placed the task on a node with the resources free now;
/// vc-scheduler binds it when its job is ready.
pub const ALLOCATED: u32 = 1 << 1;
/// Volcano's `api.Pipelined`: the session placed the task on a node whose resources are still being
/// released (victims evicted by preempt or reclaim); it is not bound in this session.
pub const PIPELINED: u32 = 1 << 2;
/// Volcano's `api.Running`: the status `Statement.unevict` gives back to a victim before it calls
/// AllocateFunc for it.
pub const RUNNING: u32 = 1 << 5;

/// The fields of Volcano's `api.TaskInfo` weft reads.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct TaskInfo {
    /// Task id (the pod's UID).
    #[serde(rename = "UID", default)]
    pub uid: String,
    /// Pod name.
    #[serde(rename = "Name", default)]
    pub name: String,
    /// Pod namespace.
    #[serde(rename = "Namespace", default)]
    pub namespace: String,
    /// The node the session placed the task on (set for AllocateFunc).
    #[serde(rename = "NodeName", default)]
    pub node_name: String,
    /// The task's state in the session (Volcano's `api.TaskStatus`, a bit: [`PIPELINED`], …).
    #[serde(rename = "Status", default)]
    pub status: u32,
    /// The pod.
    #[serde(rename = "Pod", default)]
    pub pod: Option<Pod>,
}

/// The fields of Volcano's `api.NodeInfo` weft reads.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeInfo {
    /// Node name.
    #[serde(rename = "Name", default)]
    pub name: String,
}

/// `PredicateRequest`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PredicateRequest {
    /// The task.
    #[serde(default)]
    pub task: Option<TaskInfo>,
    /// The node.
    #[serde(default)]
    pub node: Option<NodeInfo>,
}

/// `PredicateResponse`: an empty `status` passes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PredicateResponse {
    /// Why the node does not fit (Volcano's field `ErrorMessage`, JSON `status`).
    #[serde(rename = "status")]
    pub error_message: String,
    /// Volcano status code.
    pub code: i32,
}

/// `PrioritizeRequest`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PrioritizeRequest {
    /// The task.
    #[serde(default)]
    pub task: Option<TaskInfo>,
    /// The candidate nodes (`null` from Go is none).
    #[serde(default)]
    pub nodes: Option<Vec<NodeInfo>>,
}

/// `PrioritizeResponse`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PrioritizeResponse {
    /// Node → score, 0–100.
    #[serde(rename = "nodeScore")]
    pub node_score: BTreeMap<String, f64>,
    /// Non-empty when no scores could be given.
    #[serde(rename = "errorMessage")]
    pub error_message: String,
}

/// `EventHandlerRequest` (AllocateFunc, DeallocateFunc).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct EventHandlerRequest {
    /// The task.
    #[serde(default)]
    pub task: Option<TaskInfo>,
}

/// `EventHandlerResponse`: a non-empty message fails the event.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventHandlerResponse {
    /// Why the event failed.
    #[serde(rename = "errorMessage")]
    pub error_message: String,
}

/// Read a `PredicateRequest` body (keys in any ASCII case; others skipped unread).
pub fn read_predicate<R: Read>(stream: &mut JsonStream<R>) -> Result<PredicateRequest, StreamError> {
    let mut request = PredicateRequest::default();
    stream.object("PredicateRequest", |s, key| {
        if key.eq_ignore_ascii_case("task") {
            request.task = s.kept("task")?;
        } else if key.eq_ignore_ascii_case("node") {
            request.node = s.value("node")?;
        } else {
            s.skip()?;
        }
        Ok(())
    })?;
    stream.finish()?;
    Ok(request)
}

/// Read a `PrioritizeRequest` body: the task, and of each `NodeInfo` only its name (its tasks,
/// resources and node object are scanned and dropped before the next node is read); stops at
/// the node `max_nodes + 1` with [`StreamError::TooManyNodes`].
pub fn read_prioritize<R: Read>(
    stream: &mut JsonStream<R>,
    max_nodes: usize,
) -> Result<PrioritizeRequest, StreamError> {
    let mut request = PrioritizeRequest::default();
    stream.object("PrioritizeRequest", |s, key| {
        if key.eq_ignore_ascii_case("task") {
            request.task = s.kept("task")?;
        } else if key.eq_ignore_ascii_case("nodes") {
            let mut nodes = Vec::new();
            let present = s.array("nodes", |s, i| {
                if i >= max_nodes {
                    return Err(StreamError::TooManyNodes { max: max_nodes });
                }
                let node: NodeInfo = s.value(&format!("nodes[{i}]"))?;
                s.keep(node.name.len())?;
                nodes.push(node);
                Ok(())
            })?;
            request.nodes = present.then_some(nodes);
        } else {
            s.skip()?;
        }
        Ok(())
    })?;
    stream.finish()?;
    Ok(request)
}

/// vc-scheduler's allocation events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// AllocateFunc: the session placed a task on a node.
    Allocate,
    /// DeallocateFunc: the session took the placement back.
    Deallocate,
}

impl Event {
    /// The route's verb.
    pub fn verb(self) -> &'static str {
        match self {
            Event::Allocate => "allocate",
            Event::Deallocate => "deallocate",
        }
    }

    /// The verb label of the request metrics.
    pub fn metric(self) -> &'static str {
        match self {
            Event::Allocate => "volcano_allocate",
            Event::Deallocate => "volcano_deallocate",
        }
    }
}

/// The task's pod, with the task's identity where the pod lacks it; the error names what is
/// missing.
pub fn task_pod(task: Option<TaskInfo>) -> Result<(TaskInfo, Pod), String> {
    let mut task = task.ok_or("the request carries no task")?;
    let mut pod = task.pod.take().ok_or_else(|| format!("task {}/{} carries no pod", task.namespace, task.name))?;
    let meta = &mut pod.metadata;
    if meta.name.is_none() && !task.name.is_empty() {
        meta.name = Some(task.name.clone());
    }
    if meta.namespace.is_none() && !task.namespace.is_empty() {
        meta.namespace = Some(task.namespace.clone());
    }
    if meta.uid.is_none() && !task.uid.is_empty() {
        meta.uid = Some(task.uid.clone());
    }
    Ok((task, pod))
}

/// The task's pod for an event that writes to it ([`task_pod`]), once the pod's namespace and name
/// (and the task's node, when set) are names the API server would accept, and the task agrees with
/// its pod. Volcano builds a task from its pod (`api.NewTaskInfo`: the task's UID, name and
/// namespace are the pod's), and weft conditions its write on the task's UID; a task that names
/// another UID, name or namespace than its own pod is malformed and refused, with nothing written.
pub fn event_pod(task: Option<TaskInfo>) -> Result<(TaskInfo, Pod), String> {
    let (task, pod) = task_pod(task)?;
    let meta = &pod.metadata;
    let (namespace, name) = (meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default());
    let node = (!task.node_name.is_empty()).then_some(task.node_name.as_str());
    crate::bind::check_names(namespace, name, node)
        .map_err(|e| format!("task {}/{}: {e}", task.namespace, task.name))?;
    let uid = meta.uid.as_deref().unwrap_or_default();
    if uid.is_empty() {
        return Err(format!("task {namespace}/{name}: neither the task nor its pod has a UID"));
    }
    let disagree = |field: &str, theirs: &str, ours: &str| {
        format!(
            "task {namespace}/{name}: the task's {field} {theirs:?} is not its pod's ({ours:?}); Volcano takes both from the pod"
        )
    };
    if !task.uid.is_empty() && task.uid != uid {
        return Err(disagree("UID", &task.uid, uid));
    }
    if !task.name.is_empty() && task.name != name {
        return Err(disagree("name", &task.name, name));
    }
    if !task.namespace.is_empty() && task.namespace != namespace {
        return Err(disagree("namespace", &task.namespace, namespace));
    }
    Ok((task, pod))
}
