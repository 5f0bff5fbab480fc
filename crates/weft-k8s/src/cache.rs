//! Topology annotations read once: node → `PreparedNode`, reused until the annotation changes.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Node;
use weft_alloc::PreparedNode;
use weft_topology::inventory;

use crate::TOPOLOGY_ANNOTATION;

/// A node's prepared topology, or why there is none.
pub type Resolved = Result<Arc<PreparedNode>, Arc<str>>;

/// Requests between sweeps of entries for nodes no longer asked about.
const SWEEP_EVERY: u64 = 256;

/// Caches each node's prepared topology.
///
/// An entry is reused while the node's `resourceVersion` is unchanged, or, when it changed (or the
/// node has none), while the annotation text hashes and measures the same. Failures (unreadable
/// annotations) are cached the same way, so a bad annotation is reported once per change, not once
/// per request. Entries for nodes not asked about for 256 requests are dropped.
#[derive(Debug)]
pub struct TopologyCache {
    inner: Mutex<Inner>,
    missing: Arc<str>,
    not_in_view: Arc<str>,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    tick: u64,
    parses: u64,
}

#[derive(Debug)]
struct Entry {
    resource_version: Option<String>,
    digest: (u64, usize),
    value: Resolved,
    last_used: u64,
}

impl Default for TopologyCache {
    fn default() -> Self {
        TopologyCache {
            inner: Mutex::default(),
            missing: format!("node has no {TOPOLOGY_ANNOTATION} annotation").into(),
            not_in_view: Arc::from("node is not in the extender's node cache"),
        }
    }
}

impl TopologyCache {
    /// An empty cache.
    pub fn new() -> TopologyCache {
        TopologyCache::default()
    }

    /// Resolve a batch of nodes (one request's candidates); `None` stands for a node the view does
    /// not know.
    pub fn resolve_all<'a>(&self, nodes: impl IntoIterator<Item = Option<&'a Node>>) -> Vec<Resolved> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.tick += 1;
        let out = nodes
            .into_iter()
            .map(|node| match node {
                None => Err(self.not_in_view.clone()),
                Some(node) => inner.resolve(node, &self.missing),
            })
            .collect();
        if inner.tick.is_multiple_of(SWEEP_EVERY) {
            inner.sweep();
        }
        out
    }

    /// Resolve one node.
    pub fn resolve(&self, node: &Node) -> Resolved {
        self.resolve_all([Some(node)]).pop().unwrap_or_else(|| Err(self.missing.clone()))
    }

    /// Number of nodes cached.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).entries.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many annotations have been parsed since the cache was made (for tests and metrics).
    pub fn parses(&self) -> u64 {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).parses
    }
}

impl Inner {
    fn resolve(&mut self, node: &Node, missing: &Arc<str>) -> Resolved {
        let name = node.metadata.name.as_deref().unwrap_or("");
        let Some(text) = node.metadata.annotations.as_ref().and_then(|a| a.get(TOPOLOGY_ANNOTATION)) else {
            self.entries.remove(name);
            return Err(missing.clone());
        };
        let rv = node.metadata.resource_version.as_deref();
        let tick = self.tick;
        if let Some(e) = self.entries.get_mut(name) {
            if rv.is_some() && e.resource_version.as_deref() == rv {
                e.last_used = tick;
                return e.value.clone();
            }
            if e.digest == digest(text) {
                e.resource_version = rv.map(str::to_string);
                e.last_used = tick;
                return e.value.clone();
            }
        }
        let value = self.parse(name, text);
        self.entries.insert(
            name.to_string(),
            Entry {
                resource_version: rv.map(str::to_string),
                digest: digest(text),
                value: value.clone(),
                last_used: tick,
            },
        );
        value
    }

    fn parse(&mut self, name: &str, text: &str) -> Resolved {
        self.parses += 1;
        let source = format!("node {name}: annotation {TOPOLOGY_ANNOTATION}");
        if !text.trim_start().starts_with('{') {
            return Err(format!("{source}: not weft inventory JSON (apiVersion {})", inventory::API_VERSION).into());
        }
        let topology = weft_topology::parse_node(text, &source).map_err(|e| Arc::<str>::from(e.to_string()))?;
        let prepared = PreparedNode::new(&topology).map_err(|e| Arc::<str>::from(format!("{source}: {e}")))?;
        Ok(Arc::new(prepared))
    }

    fn sweep(&mut self) {
        let horizon = self.tick.saturating_sub(SWEEP_EVERY);
        self.entries.retain(|_, e| e.last_used >= horizon);
    }
}

fn digest(text: &str) -> (u64, usize) {
    let mut h = DefaultHasher::new();
    text.hash(&mut h);
    (h.finish(), text.len())
}
