//! [`ClusterView`] over the API server: reflectors on Nodes and on bound, non-terminal Pods, kept
//! warm by spawned tasks.
//!
//! Objects are slimmed before they are stored: only what the extender reads is kept (names,
//! resourceVersion, creation time, the weft annotations, container resources, node name, phase), so
//! the caches stay small on large clusters.

use std::collections::HashMap;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::gang::PodGroupSpec;
use crate::view::ClusterView;
use weft_gang::HyperNode;
use weft_record::TOPOLOGY_ANNOTATION;
use weft_record::usage::GPU_IDS_ANNOTATION;

/// Field selector of the pod watch: pods bound to a node that still hold their devices.
pub const POD_FIELD_SELECTOR: &str = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed";

/// A [`ClusterView`] fed by watches on the API server. Dropping it stops the watches.
pub struct KubeClusterView {
    nodes: Arc<NodeIndex>,
    pods: Arc<PodIndex>,
    nodes_ready: Arc<AtomicBool>,
    pods_ready: Arc<AtomicBool>,
    changes: watch::Receiver<u64>,
    /// Volcano PodGroups' specs by (namespace, name); empty where Volcano is not installed.
    pod_groups: Arc<Objects<PodGroupSpec>>,
    /// Volcano HyperNodes by name.
    hypernodes: Arc<Objects<HyperNode>>,
    tasks: Vec<JoinHandle<()>>,
}

/// Objects of one kind by (namespace, name), as a watch last listed and changed them.
type Objects<T> = RwLock<rustc_hash::FxHashMap<(String, String), Arc<T>>>;

/// Volcano's HyperNode resource (`topology.volcano.sh/v1alpha1`, cluster-scoped).
pub fn volcano_hypernode_resource() -> ApiResource {
    ApiResource {
        group: "topology.volcano.sh".into(),
        version: "v1alpha1".into(),
        api_version: "topology.volcano.sh/v1alpha1".into(),
        kind: "HyperNode".into(),
        plural: "hypernodes".into(),
    }
}

/// A HyperNode as weft reads it; one weft cannot read is logged and left out.
fn hypernode_of(obj: &DynamicObject) -> Option<HyperNode> {
    let value = serde_json::to_value(obj).ok()?;
    serde_json::from_value(value)
        .map_err(|e| tracing::warn!(hypernode = %obj.metadata.name.as_deref().unwrap_or_default(), "HyperNode not read: {e}"))
        .ok()
}

/// Watches `resource` (all namespaces) into `objects` with `read`, bumping `changes` after each
/// event; errors are retried with the watcher's backoff.
fn watch_objects<T: Send + Sync + 'static>(
    client: Client,
    resource: ApiResource,
    objects: Arc<Objects<T>>,
    read: fn(&DynamicObject) -> Option<T>,
    (changes, revision): (Arc<watch::Sender<u64>>, Option<Arc<AtomicU64>>),
) -> JoinHandle<()> {
    let api = Api::<DynamicObject>::all_with(client, &resource);
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    let key = |o: &DynamicObject| {
        (o.metadata.namespace.clone().unwrap_or_default(), o.metadata.name.clone().unwrap_or_default())
    };
    tokio::spawn(async move {
        let mut stream = pin!(stream);
        let mut listing = rustc_hash::FxHashMap::default();
        while let Some(event) = stream.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    tracing::debug!(error = %e, kind = %resource.kind, "watch failed (is Volcano installed?); retrying");
                    continue;
                }
            };
            let mut objects = objects.write().unwrap_or_else(PoisonError::into_inner);
            match event {
                Event::Apply(obj) => match read(&obj) {
                    Some(v) => drop(objects.insert(key(&obj), Arc::new(v))),
                    None => drop(objects.remove(&key(&obj))),
                },
                Event::Delete(obj) => drop(objects.remove(&key(&obj))),
                Event::Init => listing.clear(),
                Event::InitApply(obj) => {
                    if let Some(v) = read(&obj) {
                        listing.insert(key(&obj), Arc::new(v));
                    }
                }
                Event::InitDone => *objects = std::mem::take(&mut listing),
            }
            drop(objects);
            if let Some(revision) = &revision {
                revision.fetch_add(1, Ordering::AcqRel);
            }
            changes.send_modify(|g| *g += 1);
        }
    })
}

/// Volcano's PodGroup resource (`scheduling.volcano.sh/v1beta1`).
pub fn volcano_pod_group_resource() -> ApiResource {
    ApiResource {
        group: "scheduling.volcano.sh".into(),
        version: "v1beta1".into(),
        api_version: "scheduling.volcano.sh/v1beta1".into(),
        kind: "PodGroup".into(),
        plural: "podgroups".into(),
    }
}

/// A PodGroup's spec; one weft cannot read is logged and left out.
fn pod_group_of(obj: &DynamicObject) -> Option<PodGroupSpec> {
    let spec = obj.data.get("spec").cloned().unwrap_or(serde_json::Value::Null);
    serde_json::from_value::<PodGroupSpec>(spec)
        .map_err(|e| {
            let name = format!(
                "{}/{}",
                obj.metadata.namespace.as_deref().unwrap_or_default(),
                obj.metadata.name.as_deref().unwrap_or_default()
            );
            tracing::warn!(pod_group = %name, "PodGroup spec not read: {e}");
        })
        .ok()
}

impl std::fmt::Debug for KubeClusterView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClusterView")
            .field("nodes", &self.nodes.len())
            .field("ready", &self.is_ready())
            .finish_non_exhaustive()
    }
}

/// Nodes by name, sharing the `Arc`s held by the node reflector's store, so that one request's
/// candidates are looked up under one lock and by `&str` (the store itself is keyed by
/// `ObjectRef`, one allocation and one lock per lookup). Mirrors the store: changed after each
/// event the store applied, rebuilt from it when a (re-)list completes.
#[derive(Default)]
struct NodeIndex {
    by_name: RwLock<rustc_hash::FxHashMap<String, Arc<Node>>>,
    /// [`ClusterView::network_revision`]: bumped when a node comes or goes or its labels change,
    /// and by every HyperNode event.
    network: Arc<AtomicU64>,
}

impl NodeIndex {
    fn apply(&self, event: &Event<Node>, store: &Store<Node>) {
        let mut by_name = self.by_name.write().unwrap_or_else(PoisonError::into_inner);
        match event {
            Event::Apply(node) => {
                let name = node.metadata.name.clone().unwrap_or_default();
                let before = match store.get(&ObjectRef::from_obj(node)) {
                    Some(arc) => by_name.insert(name, arc),
                    None => by_name.remove(&name),
                };
                // Labels are the network: a heartbeat or a topology change leaves it as it was.
                if before.is_none_or(|b| b.metadata.labels != node.metadata.labels) {
                    self.network.fetch_add(1, Ordering::AcqRel);
                }
            }
            Event::Delete(node) => {
                by_name.remove(node.metadata.name.as_deref().unwrap_or_default());
                self.network.fetch_add(1, Ordering::AcqRel);
            }
            Event::InitDone => {
                *by_name =
                    store.state().into_iter().map(|n| (n.metadata.name.clone().unwrap_or_default(), n)).collect();
                self.network.fetch_add(1, Ordering::AcqRel);
            }
            Event::Init | Event::InitApply(_) => {}
        }
    }

    fn len(&self) -> usize {
        self.by_name.read().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// Pods by node, sharing the `Arc`s held by the pod reflector's store.
#[derive(Default)]
struct PodIndex {
    inner: RwLock<IndexInner>,
}

#[derive(Default)]
struct IndexInner {
    by_node: HashMap<String, HashMap<ObjectRef<Pod>, Arc<Pod>>>,
    node_of: HashMap<ObjectRef<Pod>, String>,
    /// Per node, the counter value of its last pod change ([`ClusterView::pods_revision`]); kept
    /// when the node's last pod goes, so that change is seen too.
    revision: HashMap<String, u64>,
    /// Source of revisions; never reused, across re-lists too.
    counter: u64,
}

impl IndexInner {
    fn touch(&mut self, node: &str) {
        self.counter += 1;
        self.revision.insert(node.to_string(), self.counter);
    }

    fn remove(&mut self, key: &ObjectRef<Pod>) {
        if let Some(node) = self.node_of.remove(key) {
            if let Some(pods) = self.by_node.get_mut(&node) {
                pods.remove(key);
                if pods.is_empty() {
                    self.by_node.remove(&node);
                }
            }
            self.touch(&node);
        }
    }

    fn insert(&mut self, key: ObjectRef<Pod>, pod: Arc<Pod>) {
        self.remove(&key);
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty()) {
            self.node_of.insert(key.clone(), node.clone());
            self.by_node.entry(node.clone()).or_default().insert(key, pod);
            self.touch(&node);
        }
    }
}

impl PodIndex {
    fn apply(&self, event: &Event<Pod>, store: &Store<Pod>) {
        let mut inner = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        match event {
            Event::Apply(pod) => {
                let key = ObjectRef::from_obj(pod);
                match store.get(&key) {
                    Some(arc) => inner.insert(key, arc),
                    None => inner.remove(&key),
                }
            }
            Event::Delete(pod) => inner.remove(&ObjectRef::from_obj(pod)),
            Event::InitDone => {
                // A re-list may have missed deletions: every node gets a new revision.
                let counter = inner.counter + 1;
                let nodes: Vec<String> = inner.revision.keys().cloned().collect();
                *inner = IndexInner { counter, ..IndexInner::default() };
                for node in nodes {
                    inner.touch(&node);
                }
                for pod in store.state() {
                    inner.insert(ObjectRef::from_obj(&*pod), pod);
                }
            }
            Event::Init | Event::InitApply(_) => {}
        }
    }
}

impl KubeClusterView {
    /// Start the node and pod watches on `client` (needs a Tokio runtime) and return at once; the
    /// view is ready once both have listed everything.
    pub fn spawn(client: Client) -> KubeClusterView {
        let (changes_tx, changes) = watch::channel(0u64);
        let changes_tx = Arc::new(changes_tx);
        let nodes_ready = Arc::new(AtomicBool::new(false));
        let pods_ready = Arc::new(AtomicBool::new(false));
        let pods = Arc::new(PodIndex::default());

        let (node_store, mut node_writer) = reflector::store::<Node>();
        let nodes = Arc::new(NodeIndex::default());
        let node_stream = watcher(Api::<Node>::all(client.clone()), watcher::Config::default()).modify(slim_node);
        let (ready, tx, index) = (nodes_ready.clone(), changes_tx.clone(), nodes.clone());
        let node_task = tokio::spawn(async move {
            let mut stream = pin!(node_stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(event) => {
                        node_writer.apply_watcher_event(&event);
                        index.apply(&event, &node_store);
                        if matches!(event, Event::InitDone) {
                            ready.store(true, Ordering::Release);
                        }
                        tx.send_modify(|g| *g += 1);
                    }
                    Err(e) => tracing::warn!(error = %e, "node watch failed; retrying"),
                }
            }
        });

        let (pod_store, mut pod_writer) = reflector::store::<Pod>();
        let pod_cfg = watcher::Config::default().fields(POD_FIELD_SELECTOR);
        let group_client = client.clone();
        let pod_stream = watcher(Api::<Pod>::all(client), pod_cfg).modify(slim_pod);
        let (ready, tx, index) = (pods_ready.clone(), changes_tx.clone(), pods.clone());
        let pod_task = tokio::spawn(async move {
            let mut stream = pin!(pod_stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(event) => {
                        pod_writer.apply_watcher_event(&event);
                        index.apply(&event, &pod_store);
                        if matches!(event, Event::InitDone) {
                            ready.store(true, Ordering::Release);
                        }
                        tx.send_modify(|g| *g += 1);
                    }
                    Err(e) => tracing::warn!(error = %e, "pod watch failed; retrying"),
                }
            }
        });

        // Volcano's PodGroups and HyperNodes: not part of readiness (Volcano may not be installed:
        // the watches then retry with their backoff; members of a Volcano group wait with a reason
        // until the PodGroups list, and gang plans read the network from node labels).
        let pod_groups: Arc<Objects<PodGroupSpec>> = Arc::default();
        let pg_task = watch_objects(
            group_client.clone(),
            volcano_pod_group_resource(),
            pod_groups.clone(),
            pod_group_of,
            (changes_tx.clone(), None),
        );
        let hypernodes: Arc<Objects<HyperNode>> = Arc::default();
        let hn_task = watch_objects(
            group_client,
            volcano_hypernode_resource(),
            hypernodes.clone(),
            hypernode_of,
            (changes_tx, Some(nodes.network.clone())),
        );

        KubeClusterView {
            nodes,
            pods,
            nodes_ready,
            pods_ready,
            changes,
            pod_groups,
            hypernodes,
            tasks: vec![node_task, pod_task, pg_task, hn_task],
        }
    }

    /// A receiver whose value increases after every applied watch event (nodes, pods, PodGroups,
    /// HyperNodes;
    /// for tests and metrics).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    /// Wait until both watches have completed their initial list.
    pub async fn wait_until_ready(&self) {
        let mut rx = self.changes.clone();
        // The sender lives as long as the tasks; if they ended, readiness cannot change any more.
        let _ = rx.wait_for(|_| self.is_ready()).await;
    }
}

/// The watcher with the default backoff, so errors are retried after growing pauses.
fn watcher<K>(api: Api<K>, cfg: watcher::Config) -> impl futures::Stream<Item = Result<Event<K>, watcher::Error>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    watcher::watcher(api, cfg).default_backoff()
}

impl Drop for KubeClusterView {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl ClusterView for KubeClusterView {
    fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.by_name.read().unwrap_or_else(PoisonError::into_inner).get(name).cloned()
    }

    fn nodes(&self, names: &[String]) -> Vec<Option<Arc<Node>>> {
        let by_name = self.nodes.by_name.read().unwrap_or_else(PoisonError::into_inner);
        names.iter().map(|n| by_name.get(n.as_str()).cloned()).collect()
    }

    fn node_names(&self) -> Vec<String> {
        let mut names: Vec<String> =
            self.nodes.by_name.read().unwrap_or_else(PoisonError::into_inner).keys().cloned().collect();
        names.sort();
        names
    }

    fn pod_group(&self, namespace: &str, name: &str) -> Option<Arc<PodGroupSpec>> {
        let groups = self.pod_groups.read().unwrap_or_else(PoisonError::into_inner);
        groups.get(&(namespace.to_string(), name.to_string())).cloned()
    }

    fn network_revision(&self) -> Option<u64> {
        Some(self.nodes.network.load(Ordering::Acquire))
    }

    fn hypernodes(&self) -> Vec<Arc<HyperNode>> {
        let objects = self.hypernodes.read().unwrap_or_else(PoisonError::into_inner);
        objects.values().cloned().collect()
    }

    fn pods_on_node(&self, name: &str) -> Vec<Arc<Pod>> {
        let inner = self.pods.inner.read().unwrap_or_else(PoisonError::into_inner);
        inner.by_node.get(name).map(|m| m.values().cloned().collect()).unwrap_or_default()
    }

    fn is_ready(&self) -> bool {
        self.nodes_ready.load(Ordering::Acquire) && self.pods_ready.load(Ordering::Acquire)
    }

    fn pods_revision(&self, name: &str) -> Option<u64> {
        let inner = self.pods.inner.read().unwrap_or_else(PoisonError::into_inner);
        // A node never seen with pods: revision 0 until its first pod.
        Some(inner.revision.get(name).copied().unwrap_or(0))
    }

    fn pods_revisions(&self, names: &[String]) -> Vec<Option<u64>> {
        let inner = self.pods.inner.read().unwrap_or_else(PoisonError::into_inner);
        names.iter().map(|n| Some(inner.revision.get(n.as_str()).copied().unwrap_or(0))).collect()
    }
}

fn slim_meta(meta: &mut ObjectMeta, keep_annotation: &str) {
    let annotations = meta.annotations.take().map(|mut a| {
        a.retain(|k, _| k == keep_annotation);
        a
    });
    *meta = ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        uid: meta.uid.take(),
        resource_version: meta.resource_version.take(),
        creation_timestamp: meta.creation_timestamp.take(),
        annotations: annotations.filter(|a| !a.is_empty()),
        ..ObjectMeta::default()
    };
}

/// Keep what the extender reads from a pod.
pub fn slim_pod(pod: &mut Pod) {
    slim_meta(&mut pod.metadata, GPU_IDS_ANNOTATION);
    let slim_container = |c: &mut Container| Container {
        name: std::mem::take(&mut c.name),
        resources: c.resources.take(),
        restart_policy: c.restart_policy.take(),
        ..Container::default()
    };
    if let Some(spec) = &mut pod.spec {
        *spec = PodSpec {
            containers: spec.containers.iter_mut().map(slim_container).collect(),
            init_containers: spec.init_containers.as_mut().map(|v| v.iter_mut().map(slim_container).collect()),
            node_name: spec.node_name.take(),
            ..PodSpec::default()
        };
    }
    if let Some(status) = &mut pod.status {
        *status = PodStatus { phase: status.phase.take(), ..PodStatus::default() };
    }
}

/// Keep what the extender reads from a node: its names, topology annotation and labels.
pub fn slim_node(node: &mut Node) {
    // Labels describe the cluster's network (gang plans, crate::gang).
    let labels = node.metadata.labels.take();
    slim_meta(&mut node.metadata, TOPOLOGY_ANNOTATION);
    node.metadata.labels = labels;
    node.spec = None;
    node.status = None;
}
