//! The extender's view of the cluster: nodes by name and the pods bound to each node.
//!
//! [`ClusterView`] is the seam between the decisions and the API server. [`InMemoryView`] is the
//! fake used by tests and the simulator; [`crate::kube_view::KubeClusterView`] is the real one,
//! kept warm by reflectors.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use k8s_openapi::api::core::v1::{Node, Pod};
use rustc_hash::FxHashMap;

use crate::gang::PodGroupSpec;
use weft_gang::HyperNode;

/// Read access to nodes and the pods bound to them. Implementations are caches: lookups are cheap
/// and never block on the network.
pub trait ClusterView: Send + Sync {
    /// The node called `name`, if known.
    fn node(&self, name: &str) -> Option<Arc<Node>>;
    /// The nodes called `names` (one request's candidates), in order; implementations answer them
    /// under one lock where they can.
    fn nodes(&self, names: &[String]) -> Vec<Option<Arc<Node>>> {
        names.iter().map(|n| self.node(n)).collect()
    }
    /// The pods whose `spec.nodeName` is `name` (terminal pods may be included; the accounting
    /// skips them).
    fn pods_on_node(&self, name: &str) -> Vec<Arc<Pod>>;
    /// Every node's name (gang plans are made over the whole cluster).
    fn node_names(&self) -> Vec<String>;
    /// The Volcano PodGroup `namespace/name`'s spec, if the view knows it.
    fn pod_group(&self, _namespace: &str, _name: &str) -> Option<Arc<PodGroupSpec>> {
        None
    }
    /// A value that changes whenever a node comes or goes, a node's labels change, or the
    /// HyperNodes change: what the network gang plans read is reused while it stays the same.
    /// `None`: not tracked (the network is built for every plan).
    fn network_revision(&self) -> Option<u64> {
        None
    }
    /// Volcano's HyperNodes, when the cluster has any (the network gang plans read first).
    fn hypernodes(&self) -> Vec<Arc<HyperNode>> {
        Vec::new()
    }
    /// Whether the view has completed its initial sync (drives `/readyz`).
    fn is_ready(&self) -> bool {
        true
    }
    /// A value that changes whenever the set of pods bound to `name` (or any of them) changes, so
    /// what was derived from [`ClusterView::pods_on_node`] can be reused while it stays the same.
    /// `None`: not tracked (nothing derived is reused).
    fn pods_revision(&self, _name: &str) -> Option<u64> {
        None
    }
    /// [`ClusterView::pods_revision`] of each of `names` (one request's candidates), in order;
    /// implementations answer them under one lock where they can.
    fn pods_revisions(&self, names: &[String]) -> Vec<Option<u64>> {
        names.iter().map(|n| self.pods_revision(n)).collect()
    }
}

/// A [`ClusterView`] held in memory; filled by hand. Ready unless told otherwise.
#[derive(Debug)]
pub struct InMemoryView {
    nodes: RwLock<FxHashMap<String, Arc<Node>>>,
    pods: RwLock<FxHashMap<String, Vec<Arc<Pod>>>>,
    pod_groups: RwLock<FxHashMap<(String, String), Arc<PodGroupSpec>>>,
    hypernodes: RwLock<Vec<Arc<HyperNode>>>,
    /// Bumped on every node and HyperNode change.
    network: std::sync::atomic::AtomicU64,
    /// Bumped on every pod change (one counter for all nodes: a change anywhere invalidates
    /// everything, which is correct and simple for tests and the simulator).
    revision: std::sync::atomic::AtomicU64,
    ready: AtomicBool,
}

impl Default for InMemoryView {
    fn default() -> Self {
        InMemoryView {
            nodes: RwLock::default(),
            pods: RwLock::default(),
            pod_groups: RwLock::default(),
            hypernodes: RwLock::default(),
            network: std::sync::atomic::AtomicU64::new(0),
            revision: std::sync::atomic::AtomicU64::new(0),
            ready: AtomicBool::new(true),
        }
    }
}

impl InMemoryView {
    /// An empty, ready view.
    pub fn new() -> InMemoryView {
        InMemoryView::default()
    }

    /// Add or replace a node (keyed by `metadata.name`).
    pub fn insert_node(&self, node: Node) {
        let name = node.metadata.name.clone().unwrap_or_default();
        self.nodes.write().unwrap_or_else(PoisonError::into_inner).insert(name, Arc::new(node));
        self.network.fetch_add(1, Ordering::AcqRel);
    }

    /// Remove a node.
    pub fn remove_node(&self, name: &str) {
        self.nodes.write().unwrap_or_else(PoisonError::into_inner).remove(name);
        self.network.fetch_add(1, Ordering::AcqRel);
    }

    /// Add or replace a pod (keyed by namespace and name) under its `spec.nodeName`. Pods without a
    /// node are ignored, as the real view's field selector does.
    pub fn insert_pod(&self, pod: Pod) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else { return };
        self.remove_pod(pod.metadata.namespace.as_deref().unwrap_or(""), pod.metadata.name.as_deref().unwrap_or(""));
        self.pods.write().unwrap_or_else(PoisonError::into_inner).entry(node).or_default().push(Arc::new(pod));
        self.revision.fetch_add(1, Ordering::AcqRel);
    }

    /// Remove a pod.
    pub fn remove_pod(&self, namespace: &str, name: &str) {
        let mut pods = self.pods.write().unwrap_or_else(PoisonError::into_inner);
        for list in pods.values_mut() {
            list.retain(|p| {
                p.metadata.namespace.as_deref().unwrap_or("") != namespace
                    || p.metadata.name.as_deref().unwrap_or("") != name
            });
        }
        self.revision.fetch_add(1, Ordering::AcqRel);
    }

    /// Add or replace a Volcano PodGroup's spec.
    pub fn insert_pod_group(&self, namespace: &str, name: &str, spec: PodGroupSpec) {
        let key = (namespace.to_string(), name.to_string());
        self.pod_groups.write().unwrap_or_else(PoisonError::into_inner).insert(key, Arc::new(spec));
    }

    /// Add a Volcano HyperNode.
    pub fn insert_hypernode(&self, hypernode: HyperNode) {
        self.hypernodes.write().unwrap_or_else(PoisonError::into_inner).push(Arc::new(hypernode));
        self.network.fetch_add(1, Ordering::AcqRel);
    }

    /// Set what [`ClusterView::is_ready`] answers.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }
}

impl ClusterView for InMemoryView {
    fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.read().unwrap_or_else(PoisonError::into_inner).get(name).cloned()
    }

    fn nodes(&self, names: &[String]) -> Vec<Option<Arc<Node>>> {
        let nodes = self.nodes.read().unwrap_or_else(PoisonError::into_inner);
        names.iter().map(|n| nodes.get(n.as_str()).cloned()).collect()
    }

    fn node_names(&self) -> Vec<String> {
        let mut names: Vec<String> =
            self.nodes.read().unwrap_or_else(PoisonError::into_inner).keys().cloned().collect();
        names.sort();
        names
    }

    fn network_revision(&self) -> Option<u64> {
        Some(self.network.load(Ordering::Acquire))
    }

    fn hypernodes(&self) -> Vec<Arc<HyperNode>> {
        self.hypernodes.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn pod_group(&self, namespace: &str, name: &str) -> Option<Arc<PodGroupSpec>> {
        let groups = self.pod_groups.read().unwrap_or_else(PoisonError::into_inner);
        groups.get(&(namespace.to_string(), name.to_string())).cloned()
    }

    fn pods_on_node(&self, name: &str) -> Vec<Arc<Pod>> {
        self.pods.read().unwrap_or_else(PoisonError::into_inner).get(name).cloned().unwrap_or_default()
    }

    fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    fn pods_revision(&self, _name: &str) -> Option<u64> {
        Some(self.revision.load(Ordering::Acquire))
    }
}
