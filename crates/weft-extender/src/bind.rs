//! The bind verb: kube-scheduler hands the extender a pod and the node it chose; the extender picks
//! the pod's GPUs on that node, records the decision on the pod and creates the pod's Binding, in
//! one write. The API server copies a Binding's annotations onto the pod in the same atomic update
//! that sets `spec.nodeName`, so a pod is never bound without its decision, nor annotated without
//! being bound: there is no half state to repair.
//!
//! Between the write and the moment the watch shows the pod on its node, the decision is held in
//! [`crate::reservations`], which filter, prioritize and the next bind count as used.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use weft_alloc::{Policy, Request, allocate};
use weft_net::joint::decide;
use weft_record::usage::{PodRef, format_gpu_ids};
use weft_record::vf_usage::{VF_IDS_ANNOTATION, format_vf_ids};
use weft_record::{GPU_DECISION_ANNOTATION, GPU_IDS_ANNOTATION, GpuDecision};
use weft_resources::names::{is_dns1123_label, is_dns1123_subdomain};

use crate::claims::{allocated_vfs, claim_names};
use crate::decision::PodAsk;
use crate::gang::{GANG_PLAN_ANNOTATION, GangNote, GroupKey};
use crate::reservations::{NodeRecord, RECORD_ANNOTATION, RecordEntry, Reserved, record_name, shown_in, wall_until};
use crate::server::{ExtenderState, devices_in_use};
use crate::volcano::{EventHandlerRequest, EventHandlerResponse, PIPELINED, event_pod};
use crate::wire::{ExtenderBindingArgs, ExtenderBindingResult};

/// What bind decided for a pod on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decided {
    /// GPU indices, ascending.
    pub gpus: Vec<usize>,
    /// VFs by physnet (PCI addresses).
    pub vfs: BTreeMap<String, Vec<String>>,
    /// The entry that holds them in the node's record.
    pub entry: RecordEntry,
    /// The member's place in its gang's plan, when it is a gang member with a held plan.
    pub gang: Option<GangNote>,
}

/// Who a decision is for: it decides what the pod's earlier entries in the node's record mean.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purpose {
    /// kube-scheduler's bind. An earlier bind of the pod (a retry, a failover) may still land, so
    /// its entries stay beside the new one.
    Bind,
    /// vc-scheduler's AllocateFunc, for a pod that is not bound (vc-scheduler binds only after
    /// allocating): the pod's earlier entries are replaced. `pipelined`: the task waits for the
    /// victims its session evicted, whose devices it may be given.
    Allocate { pipelined: bool },
}

/// The annotations that record `decided` on `node`: the decision, and what the pod holds
/// (`weft.io/gpu-ids` when it has GPUs, `weft.io/vf-ids` when it has VFs).
fn decision_annotations(node: &str, decided: &Decided) -> BTreeMap<String, String> {
    let gpus = &decided.gpus;
    let decision = GpuDecision {
        node: node.to_string(),
        gpus: gpus.to_vec(),
        vfs: decided.vfs.clone(),
        decided_at: k8s_openapi::jiff::Timestamp::now()
            .round(k8s_openapi::jiff::Unit::Second)
            .map_or_else(|_| String::new(), |t| t.to_string()),
        by: DECIDED_BY.to_string(),
    };
    let mut out = BTreeMap::from([(GPU_DECISION_ANNOTATION.to_string(), decision.to_annotation())]);
    if !gpus.is_empty() {
        out.insert(GPU_IDS_ANNOTATION.to_string(), format_gpu_ids(gpus));
    }
    if !decided.vfs.is_empty() {
        out.insert(VF_IDS_ANNOTATION.to_string(), format_vf_ids(&decided.vfs));
    }
    if let Some(note) = &decided.gang
        && let Ok(json) = serde_json::to_string(note)
    {
        out.insert(GANG_PLAN_ANNOTATION.to_string(), json);
    }
    out
}

/// How many times a decision is made again because another replica wrote the node's record first.
const RECORD_ATTEMPTS: usize = 8;

/// Who the decision says made it.
pub const DECIDED_BY: &str = "weft-scheduler-extender";

/// Checks a pod's namespace and name, and the node's name, as the API server validates them
/// (a namespace is a DNS-1123 label; pod and node names are DNS-1123 subdomains), before any of
/// them goes into a request. kube-rs puts names into URL paths as they are, so a name from a
/// request body such as `gp3?dryRun=All&x=` or `../../nodes/n1` would otherwise change which
/// object, or which operation, the request addresses. The error names the field and the value.
pub fn check_names(namespace: &str, name: &str, node: Option<&str>) -> Result<(), String> {
    if !is_dns1123_label(namespace) {
        return Err(format!("namespace {namespace:?} is not a valid Kubernetes name (a DNS-1123 label)"));
    }
    check_subdomain("pod name", name)?;
    node.map_or(Ok(()), |node| check_subdomain("node name", node))
}

/// Checks that `value` (the `what` of an object) is a DNS-1123 subdomain, as the API server
/// validates the names of pods, nodes and ResourceClaims.
pub fn check_subdomain(what: &str, value: &str) -> Result<(), String> {
    if is_dns1123_subdomain(value) {
        Ok(())
    } else {
        Err(format!("{what} {value:?} is not a valid Kubernetes name (a DNS-1123 subdomain)"))
    }
}

/// The API writes a bind needs (a seam for tests and for serving without a cluster).
#[async_trait]
pub trait PodBinder: Send + Sync {
    /// The pod, or `None` when it does not exist.
    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, String>;

    /// The ResourceClaim, or `None` when it does not exist.
    async fn resource_claim(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, String>;

    /// Binds the pod to `node` with `annotations`, in one write that fails unless the pod still has
    /// `uid` and is not bound.
    async fn bind(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        node: &str,
        annotations: BTreeMap<String, String>,
    ) -> Result<(), String>;

    /// Sets (`Some`) or removes (`None`) annotations of the pod in one write that fails unless the
    /// pod still has `uid` and, when given, is still at `resource_version` (vc-scheduler binds the
    /// pod itself; weft records its decision first, onto the unbound pod it read).
    async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        resource_version: Option<&str>,
        annotations: BTreeMap<String, Option<String>>,
    ) -> Result<(), String>;

    /// `node`'s shared record of in-flight decisions (docs/scheduler-extender.md, "Replicas") and
    /// the version it was read at; an empty record and `None` when there is none yet.
    async fn node_record(&self, node: &str) -> Result<(Option<String>, NodeRecord), String>;

    /// Writes `node`'s record: creates it when `version` is `None`, else replaces it only if it is
    /// still at `version`. `Ok(false)` when another writer got there first.
    async fn write_node_record(&self, node: &str, version: Option<&str>, record: &NodeRecord) -> Result<bool, String>;
}

/// [`PodBinder`] over the API server: GET the pod, POST its `binding` subresource; the nodes'
/// records are Leases ([`crate::reservations::record_name`]) in the extender's namespace.
#[derive(Clone)]
pub struct KubePodBinder {
    client: kube::Client,
    record_namespace: String,
}

impl KubePodBinder {
    /// A binder over `client`, keeping the nodes' records in the client's default namespace (in a
    /// cluster: the namespace of the extender's service account).
    pub fn new(client: kube::Client) -> KubePodBinder {
        let record_namespace = client.default_namespace().to_string();
        KubePodBinder { client, record_namespace }
    }

    /// The same binder, keeping the nodes' records in `namespace`.
    pub fn with_record_namespace(mut self, namespace: &str) -> KubePodBinder {
        self.record_namespace = namespace.to_string();
        self
    }

    fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.record_namespace)
    }
}

#[async_trait]
impl PodBinder for KubePodBinder {
    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, String> {
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| format!("reading pod {namespace}/{name}: {e}"))
    }

    async fn resource_claim(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, String> {
        Api::<ResourceClaim>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(|e| format!("reading ResourceClaim {namespace}/{name}: {e}"))
    }

    async fn bind(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        node: &str,
        annotations: BTreeMap<String, String>,
    ) -> Result<(), String> {
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                uid: Some(uid.to_string()),
                annotations: (!annotations.is_empty()).then_some(annotations),
                ..ObjectMeta::default()
            },
            target: ObjectReference { kind: Some("Node".into()), name: Some(node.to_string()), ..Default::default() },
        };
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .create_subresource::<Binding, serde_json::Value>("binding", name, &PostParams::default(), &binding)
            .await
            .map(|_| ())
            .map_err(|e| format!("binding pod {namespace}/{name} to {node}: {e}"))
    }

    async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        resource_version: Option<&str>,
        annotations: BTreeMap<String, Option<String>>,
    ) -> Result<(), String> {
        let api = Api::<Pod>::namespaced(self.client.clone(), namespace);
        weft_kube::write::patch_annotations_at(&api, name, uid, resource_version, &annotations, DECIDED_BY)
            .await
            .map(|_| ())
            .map_err(|e| format!("recording the GPU decision on pod {namespace}/{name}: {e}"))
    }

    async fn node_record(&self, node: &str) -> Result<(Option<String>, NodeRecord), String> {
        let name = record_name(node);
        let ns = &self.record_namespace;
        let Some(lease) = self
            .leases()
            .get_opt(&name)
            .await
            .map_err(|e| format!("reading node {node}'s record (Lease {ns}/{name}): {e}"))?
        else {
            return Ok((None, NodeRecord::default()));
        };
        let value = lease.metadata.annotations.as_ref().and_then(|a| a.get(RECORD_ANNOTATION));
        let record = NodeRecord::parse(value.map(String::as_str)).unwrap_or_else(|e| {
            tracing::warn!(%node, lease = %format!("{ns}/{name}"), "{e}; read as empty");
            NodeRecord::default()
        });
        Ok((lease.metadata.resource_version, record))
    }

    async fn write_node_record(&self, node: &str, version: Option<&str>, record: &NodeRecord) -> Result<bool, String> {
        let name = record_name(node);
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(self.record_namespace.clone()),
                resource_version: version.map(str::to_string),
                annotations: Some(BTreeMap::from([(RECORD_ANNOTATION.to_string(), record.to_annotation())])),
                labels: Some(BTreeMap::from([("app.kubernetes.io/managed-by".to_string(), DECIDED_BY.to_string())])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec { holder_identity: Some(DECIDED_BY.to_string()), ..LeaseSpec::default() }),
        };
        let params = PostParams { field_manager: Some(DECIDED_BY.to_string()), ..PostParams::default() };
        let written = match version {
            None => self.leases().create(&params, &lease).await,
            Some(_) => self.leases().replace(&name, &params, &lease).await,
        };
        match written {
            Ok(_) => Ok(true),
            // 409: Conflict (another version) or AlreadyExists (created meanwhile).
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(e) => Err(format!("writing node {node}'s record (Lease {}/{name}): {e}", self.record_namespace)),
        }
    }
}

impl ExtenderState {
    /// Answers a bind request: the pod is bound to the node with its GPU decision, or `Error` says
    /// why not (and nothing was written or reserved).
    pub async fn bind(&self, args: &ExtenderBindingArgs) -> ExtenderBindingResult {
        match self.bind_pod(args).await {
            Ok(()) => ExtenderBindingResult::default(),
            Err(error) => {
                tracing::warn!(pod = %format!("{}/{}", args.pod_namespace, args.pod_name), node = %args.node, "bind: {error}");
                ExtenderBindingResult { error }
            }
        }
    }

    async fn bind_pod(&self, args: &ExtenderBindingArgs) -> Result<(), String> {
        let binder = self.binder().ok_or("this extender cannot bind: it has no API access (--cluster-file mode)")?;
        let (namespace, name, node) = (args.pod_namespace.as_str(), args.pod_name.as_str(), args.node.as_str());
        check_names(namespace, name, Some(node)).map_err(|e| format!("bind request: {e}"))?;
        let pod = binder.pod(namespace, name).await?.ok_or_else(|| format!("pod {namespace}/{name} does not exist"))?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if !args.pod_uid.is_empty() && uid != args.pod_uid {
            return Err(format!("pod {namespace}/{name} was replaced (uid {uid}, bind asked for {})", args.pod_uid));
        }
        match pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            // A retried bind whose first write went through.
            Some(bound) if bound == node => return Ok(()),
            Some(bound) => return Err(format!("pod {namespace}/{name} is already bound to {bound}")),
            None => {}
        }
        let ask = PodAsk::of(&pod, &self.config().resource_name).map_err(|e| format!("pod {namespace}/{name}: {e}"))?;
        let decided = if ask.is_empty() {
            None
        } else {
            // The pod's claims as the scheduler allocated them in PreBind (crate::claims).
            let mut claims = Vec::new();
            for claim in claim_names(&pod) {
                check_subdomain("ResourceClaim name", &claim).map_err(|e| format!("pod {namespace}/{name}: {e}"))?;
                claims.extend(binder.resource_claim(namespace, &claim).await?);
            }
            let group = self.member_of(&pod).ok().flatten().map(|m| m.key);
            self.decide_and_hold(binder, node, &uid, &ask, &claims, group.as_ref(), Purpose::Bind).await?
        };
        let annotations = decided.as_ref().map(|d| decision_annotations(node, d)).unwrap_or_default();
        if let Err(e) = binder.bind(namespace, name, &uid, node, annotations.clone()).await {
            let Some(decided) = decided else { return Err(e) };
            return self.after_failed_binding(binder, namespace, name, &uid, node, &decided, &annotations, e).await;
        }
        tracing::debug!(pod = %format!("{namespace}/{name}"), %node, decided = ?decided, "bound");
        Ok(())
    }

    /// vc-scheduler's AllocateFunc: the session placed the task on `task.NodeName`; weft picks and
    /// reserves the pod's GPUs there and records the decision on the pod before answering (see
    /// [`crate::volcano`]). A non-empty message fails the allocation; nothing is then left
    /// reserved or recorded.
    ///
    /// A pod already bound is never decided again nor written: `Statement.unevict` (a preemption or
    /// reclaim the session discards, or an eviction that failed) calls AllocateFunc for the running
    /// victim, which keeps the GPUs it holds; its eviction mark ends. A task the session
    /// *pipelined* (it waits for victims to go; `api.Pipelined`) may be given the devices of the
    /// pods the session evicted on that node ([`Reservations::evict`](crate::reservations::Reservations::evict)).
    pub async fn volcano_allocate(&self, request: EventHandlerRequest) -> EventHandlerResponse {
        let outcome = async {
            let binder = self.binder().ok_or("this extender cannot record decisions: it has no API access")?;
            let (task, pod) = event_pod(request.task)?;
            let PodRef { namespace, name } = PodRef::of(&pod);
            let node = task.node_name.as_str();
            if node.is_empty() {
                return Err(format!("task {namespace}/{name} has no NodeName"));
            }
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            // The pod as it is now: the task's copy carries the session's NodeName, not the API's.
            let current =
                binder.pod(&namespace, &name).await?.ok_or_else(|| format!("pod {namespace}/{name} does not exist"))?;
            let current_uid = current.metadata.uid.as_deref().unwrap_or_default();
            if current_uid != uid {
                return Err(format!("pod {namespace}/{name} was replaced (uid {current_uid}, the task has {uid})"));
            }
            match current.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
                Some(bound) if bound == node => {
                    self.update_record(binder, node, |record| record.unevict(&uid)).await?;
                    tracing::debug!(pod = %format!("{namespace}/{name}"), %node, "allocate for a bound pod: it keeps its GPUs");
                    return Ok(());
                }
                Some(bound) => return Err(format!("pod {namespace}/{name} is bound to {bound}, not {node}")),
                None => {}
            }
            let ask =
                PodAsk::of(&pod, &self.config().resource_name).map_err(|e| format!("pod {namespace}/{name}: {e}"))?;
            // vc-scheduler allocates before DRA's PreBind: no claim has its devices yet.
            let pipelined = task.status == PIPELINED;
            let Some(decided) = (if ask.is_empty() {
                None
            } else {
                let group = self.member_of(&pod).ok().flatten().map(|m| m.key);
                self.decide_and_hold(binder, node, &uid, &ask, &[], group.as_ref(), Purpose::Allocate { pipelined })
                    .await?
            }) else {
                return Ok(());
            };
            let gpus = &decided.gpus;
            let annotations = decision_annotations(node, &decided).into_iter().map(|(k, v)| (k, Some(v))).collect();
            // Written only onto the pod as read: a pod bound (or changed) since fails with 409.
            let version = current.metadata.resource_version.as_deref();
            if let Err(e) = binder.annotate(&namespace, &name, &uid, version, annotations).await {
                self.forget(binder, node, &uid, None).await;
                return Err(e);
            }
            tracing::debug!(pod = %format!("{namespace}/{name}"), %node, ?gpus, "vc-scheduler allocation recorded");
            Ok(())
        }
        .await;
        EventHandlerResponse { error_message: outcome.err().unwrap_or_default() }
    }

    /// vc-scheduler's DeallocateFunc: the session took back an allocation. The reservation is
    /// released and the recorded decision removed, if it is still the one for that node. For a pod
    /// bound to the node (a running victim: `Statement.Evict` calls DeallocateFunc) nothing is
    /// written; the pod is marked evicted, so the task the session pipelines onto the node in its
    /// place may be given its devices.
    pub async fn volcano_deallocate(&self, request: EventHandlerRequest) -> EventHandlerResponse {
        let outcome = async {
            let binder = self.binder().ok_or("this extender cannot record decisions: it has no API access")?;
            let (task, pod) = event_pod(request.task)?;
            let PodRef { namespace, name } = PodRef::of(&pod);
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let node = task.node_name.as_str();
            if node.is_empty() {
                return Ok(());
            }
            // The pod as it is now: the task's copy predates the allocation's record.
            let current = binder.pod(&namespace, &name).await?;
            let current = current.filter(|p| p.metadata.uid.as_deref() == Some(uid.as_str()));
            let bound = current.as_ref().and_then(|p| p.spec.as_ref()?.node_name.clone());
            if bound.as_deref() == Some(node) {
                let until = wall_until(Timestamp::now(), self.reservations().ttl());
                return self.update_record(binder, node, |record| record.evict(&uid, until)).await;
            }
            self.forget(binder, node, &uid, None).await;
            let Some(current) = current.filter(|_| bound.is_none()) else { return Ok(()) };
            let recorded = current.metadata.annotations.as_ref().and_then(|a| a.get(GPU_DECISION_ANNOTATION));
            let ours = recorded.and_then(|v| GpuDecision::from_annotation(v).ok()).is_some_and(|d| d.node == node);
            if !ours {
                return Ok(());
            }
            let annotations = [GPU_IDS_ANNOTATION, GPU_DECISION_ANNOTATION, VF_IDS_ANNOTATION, GANG_PLAN_ANNOTATION]
                .into_iter()
                .map(|k| (k.to_string(), None))
                .collect();
            let version = current.metadata.resource_version.as_deref();
            binder.annotate(&namespace, &name, &uid, version, annotations).await
        }
        .await;
        EventHandlerResponse { error_message: outcome.err().unwrap_or_default() }
    }

    /// Decides the pod `uid`'s devices on `node` ([`Self::decide_devices`]) and holds them in the
    /// node's shared record before answering, so no other replica can give them away: the record
    /// is read, the decision made over what it and the view hold, and the record written back only
    /// if it is still at the version read. When another replica wrote it first, the decision is
    /// made again over the new record. Within this replica, decisions for one node take turns.
    #[allow(clippy::too_many_arguments)] // the decision's inputs, each named where it is called
    async fn decide_and_hold(
        &self,
        binder: &Arc<dyn PodBinder>,
        node: &str,
        uid: &str,
        ask: &PodAsk,
        claims: &[ResourceClaim],
        group: Option<&GroupKey>,
        purpose: Purpose,
    ) -> Result<Option<Decided>, String> {
        let _turn = self.reservations().turn(node).await;
        for _ in 0..RECORD_ATTEMPTS {
            let (version, mut record) = binder.node_record(node).await?;
            let Some(decided) = self.decide_devices(node, uid, ask, claims, group, purpose, &mut record)? else {
                return Ok(None);
            };
            match binder.write_node_record(node, version.as_deref(), &record).await {
                Ok(true) => {
                    if let (Some(group), Some(note)) = (group, &decided.gang) {
                        self.gangs().take(group, uid, note.rank, Instant::now());
                    }
                    return Ok(Some(decided));
                }
                Ok(false) => self.reservations().release(node, uid),
                Err(e) => {
                    self.reservations().release(node, uid);
                    return Err(e);
                }
            }
        }
        Err(format!("node {node}: its reservation record changed {RECORD_ATTEMPTS} times while deciding; try again"))
    }

    /// Changes `node`'s shared record with `change` and writes it back at the version read,
    /// reading again after a conflict; nothing is written when `change` changes nothing.
    async fn update_record(
        &self,
        binder: &Arc<dyn PodBinder>,
        node: &str,
        mut change: impl FnMut(&mut NodeRecord),
    ) -> Result<(), String> {
        let _turn = self.reservations().turn(node).await;
        for _ in 0..RECORD_ATTEMPTS {
            let (version, mut record) = binder.node_record(node).await?;
            let before = record.clone();
            change(&mut record);
            if record == before || binder.write_node_record(node, version.as_deref(), &record).await? {
                return Ok(());
            }
        }
        Err(format!("node {node}: its reservation record changed {RECORD_ATTEMPTS} times while updating it"))
    }

    /// Ends the pod `uid`'s hold on `node`: in this replica's ledger, and in the node's record
    /// `entry` (an attempt that failed for certain), or all of the pod's entries (an allocation
    /// taken back). A record that cannot be written is logged; its entries then end at their
    /// expiry.
    async fn forget(&self, binder: &Arc<dyn PodBinder>, node: &str, uid: &str, entry: Option<&RecordEntry>) {
        self.reservations().release(node, uid);
        self.gangs().release(uid);
        let change = |record: &mut NodeRecord| match entry {
            Some(entry) => record.release_entry(entry),
            None => record.release(uid),
        };
        if let Err(e) = self.update_record(binder, node, change).await {
            tracing::warn!(%node, pod_uid = %uid, "the reservation stays in the node's record until it expires: {e}");
        }
    }

    /// A Binding that answered with an error: the pod is read again to learn what happened. Bound
    /// with this decision: the write went through after all, and the bind succeeded. Bound
    /// otherwise (another attempt of the pod won), gone or replaced: this attempt failed for
    /// certain and its entry ends. Still unbound: the request may yet land (the error may have
    /// been the connection's), so the entry stays until it expires.
    #[allow(clippy::too_many_arguments)]
    async fn after_failed_binding(
        &self,
        binder: &Arc<dyn PodBinder>,
        namespace: &str,
        name: &str,
        uid: &str,
        node: &str,
        decided: &Decided,
        annotations: &BTreeMap<String, String>,
        error: String,
    ) -> Result<(), String> {
        let current = match binder.pod(namespace, name).await {
            Ok(current) => current.filter(|p| p.metadata.uid.as_deref() == Some(uid)),
            Err(e) => {
                tracing::warn!(pod = %format!("{namespace}/{name}"), "after a failed Binding: {e}");
                return Err(error);
            }
        };
        let bound = current.as_ref().and_then(|p| p.spec.as_ref()?.node_name.as_deref());
        let ours = current.as_ref().and_then(|p| p.metadata.annotations.as_ref()?.get(GPU_DECISION_ANNOTATION))
            == annotations.get(GPU_DECISION_ANNOTATION);
        match bound {
            Some(bound) if bound == node && ours => return Ok(()),
            None if current.is_some() => return Err(error),
            _ => self.forget(binder, node, uid, Some(&decided.entry)).await,
        }
        Err(error)
    }

    /// Picks and reserves the pod `uid`'s GPUs and VFs on `node` in one decision
    /// ([`weft_net::joint::decide`]) over the GPUs and VFs neither held by the node's pods nor
    /// reserved for others, beside the VFs weft's NIC driver was allocated in `claims`
    /// ([`crate::claims`]). `None` when the node has no topology (the node's device plugins then
    /// choose), unless topology is required.
    #[allow(clippy::too_many_arguments)] // the decision's inputs, each named where it is called
    fn decide_devices(
        &self,
        node: &str,
        uid: &str,
        ask: &PodAsk,
        claims: &[ResourceClaim],
        group: Option<&GroupKey>,
        purpose: Purpose,
        record: &mut NodeRecord,
    ) -> Result<Option<Decided>, String> {
        let node_object = self.view().node(node).ok_or_else(|| format!("node {node} is not known to the extender"))?;
        let prepared = match self.cache().resolve(&node_object) {
            Ok(p) => p,
            Err(reason) if self.config().require_topology => return Err(format!("node {node}: {reason}")),
            Err(_) => return Ok(None),
        };
        let count = usize::try_from(ask.gpus).map_err(|_| format!("the pod asks for {} GPUs", ask.gpus))?;
        let now = Instant::now();
        // The ledger first, then the view: see `Reservations::lock`.
        let mut ledger = self.reservations().lock(node);
        let pods = self.view().pods_on_node(node);
        let mut reserved = ledger.others(uid, now, shown_in(&pods));
        // Other replicas' decisions (and this one's) not yet in the view, from the node's record.
        let wall = Timestamp::now();
        if matches!(purpose, Purpose::Allocate { .. }) {
            record.release(uid);
        }
        let shared = record.settle(uid, wall);
        reserved.gpus |= shared.gpus;
        reserved.vfs.extend(shared.vfs);
        // For a pipelined task, the pods its session evicted here are being released: they hold
        // nothing for it.
        let releasing =
            if purpose == (Purpose::Allocate { pipelined: true }) { record.evicted_at(wall) } else { BTreeSet::new() };
        let holding: Vec<_> =
            pods.iter().filter(|p| p.metadata.uid.as_ref().is_none_or(|u| !releasing.contains(u))).cloned().collect();
        let (held, mut vfs_used) = devices_in_use(node, &prepared, &holding, &self.config().resource_name);
        let used = held | reserved.gpus;
        vfs_used.extend(reserved.vfs);
        // Other gangs' members not yet placed keep their planned GPUs.
        let used = used | self.gangs().held(node, group);
        let free: Vec<usize> = (0..prepared.len()).filter(|&g| used & (1u128 << g) == 0).collect();
        if free.len() < count {
            return Err(format!("node {node} has {} free GPUs now; the pod asks for {count}", free.len()));
        }
        // A gang member takes its planned set when the plan put it here and the set is still free.
        let mut planned = group.and_then(|g| self.gangs().rank_on(g, uid, node));
        let free = match &mut planned {
            Some(r) if r.on_node && r.gpus.len() == count && r.gpus.iter().all(|g| free.contains(g)) => r.gpus.clone(),
            Some(r) => {
                r.note.followed = false;
                free
            }
            None => free,
        };
        let (gpus, vfs) = match prepared.with_vfs() {
            Some(topology) => {
                let fixed = allocated_vfs(claims, node, topology);
                let choice = decide(&prepared, topology, &free, &|a| !vfs_used.contains(a), count, &ask.vfs, &fixed)
                    .map_err(|e| format!("node {node}: {e}"))?;
                (choice.gpus, choice.vfs.vfs)
            }
            None if ask.vfs.values().any(|&n| n > 0) => {
                return Err(format!("node {node} publishes no SR-IOV VFs; the pod asks for {:?}", ask.vfs));
            }
            None => {
                let req = Request { count, available: &free, required: &[] };
                let chosen = allocate(&prepared, &Policy::BestEffort, &req).map_err(|e| format!("node {node}: {e}"))?;
                (chosen.gpus, BTreeMap::new())
            }
        };
        let set = gpus.iter().fold(0u128, |m, &g| m | (1u128 << g));
        let devices = Reserved { gpus: set, vfs: vfs.values().flatten().cloned().collect() };
        let entry = record.hold(uid, &devices, wall_until(wall, self.reservations().ttl()));
        ledger.reserve(uid, devices, now);
        let gpus: Vec<usize> = (0..128).filter(|&g| set & (1u128 << g) != 0).collect();
        if let (Some(group), Some(r)) = (group, &planned)
            && !r.note.followed
        {
            tracing::warn!(%group, %node, rank = r.note.rank, "gang member placed off its plan");
        }
        Ok(Some(Decided { gpus, vfs, entry, gang: planned.map(|r| r.note) }))
    }
}
