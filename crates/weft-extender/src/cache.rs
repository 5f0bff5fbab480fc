//! Topology annotations read once: annotation text → [`PreparedTopology`] (the GPUs prepared for
//! allocation, and the SR-IOV VFs with their NICs' relations when the node publishes any), shared by
//! every node that carries the same text, bounded in entries and bytes.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use rustc_hash::FxHashMap;

use k8s_openapi::api::core::v1::Node;
use weft_alloc::PreparedNode;
use weft_topology::{NodeTopology, inventory};

use weft_record::TOPOLOGY_ANNOTATION;

/// A node's topology as decisions use it: the GPUs prepared for allocation (what it dereferences
/// to) and, when the node publishes SR-IOV VFs, the topology that places them.
#[derive(Debug)]
pub struct PreparedTopology {
    gpus: PreparedNode,
    vfs: Option<NodeTopology>,
}

impl PreparedTopology {
    /// Prepares `topology`, keeping it whole only when it has VFs (a node without them needs only
    /// the GPU matrices).
    pub fn new(topology: NodeTopology) -> Result<PreparedTopology, weft_alloc::AllocError> {
        let gpus = PreparedNode::new(&topology)?;
        Ok(PreparedTopology { gpus, vfs: (!topology.vfs().is_empty()).then_some(topology) })
    }

    /// The topology with its VFs, when the node publishes any.
    pub fn with_vfs(&self) -> Option<&NodeTopology> {
        self.vfs.as_ref()
    }

    /// Estimated heap bytes (`text_len`: the annotation it came from, standing in for the kept
    /// topology).
    fn heap_bytes(&self, text_len: usize) -> usize {
        self.gpus.heap_bytes() + self.vfs.as_ref().map_or(0, |_| text_len)
    }
}

impl std::ops::Deref for PreparedTopology {
    type Target = PreparedNode;
    fn deref(&self) -> &PreparedNode {
        &self.gpus
    }
}

/// A node's prepared topology, or why there is none.
pub type Resolved = Result<Arc<PreparedTopology>, Arc<str>>;

/// Default of [`CacheLimits::max_nodes`].
pub const DEFAULT_MAX_NODES: usize = 20_000;
/// Default of [`CacheLimits::max_bytes`].
pub const DEFAULT_MAX_BYTES: usize = 128 << 20;

/// How much a [`TopologyCache`] may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    /// Node names remembered (each maps to one annotation text).
    pub max_nodes: usize,
    /// Bytes of annotation text, prepared topologies and names together (an estimate of the heap
    /// they use).
    pub max_bytes: usize,
}

impl Default for CacheLimits {
    fn default() -> CacheLimits {
        CacheLimits { max_nodes: DEFAULT_MAX_NODES, max_bytes: DEFAULT_MAX_BYTES }
    }
}

/// Caches each node's prepared topology.
///
/// Entries are keyed by the annotation's text, compared in full, so nodes of one kind share one
/// parsed and prepared topology however many there are. A node name remembers which text it
/// had at which `resourceVersion`, so an unchanged node costs one lookup. Failures (unreadable
/// annotations) are cached the same way, so a bad annotation is reported once per change, not
/// once per request.
///
/// When more than [`CacheLimits::max_nodes`] names or [`CacheLimits::max_bytes`] bytes are held
/// after a request, the least recently used entries go until the cache is at 7/8 of its limits.
/// A request's own results are never evicted while it is being resolved (they are returned as
/// `Arc`s), so the limits bound what stays between requests, not what one request sees.
#[derive(Debug)]
pub struct TopologyCache {
    inner: Mutex<Inner>,
    limits: CacheLimits,
    missing: Arc<str>,
    not_in_view: Arc<str>,
}

#[derive(Debug, Default)]
struct Inner {
    names: FxHashMap<String, NameEntry>,
    texts: HashMap<Arc<str>, Arc<Topology>>,
    bytes: usize,
    tick: u64,
    parses: u64,
}

/// What a node name resolved to at which `resourceVersion`; holds its topology directly, so an
/// unchanged node costs one lookup by name. `object`: the view's node object it was last resolved
/// from ([`TopologyCache::resolve_shared`]); while the view hands out that same object, nothing of
/// it is read again. A `Weak` keeps the allocation's address from being reused for another node
/// while the entry remembers it, without keeping the node itself.
#[derive(Debug)]
struct NameEntry {
    resource_version: Option<String>,
    topology: Arc<Topology>,
    object: Option<Weak<Node>>,
}

/// A node as the cache reads it: its name, `resourceVersion` and topology annotation, which may
/// still be JSON text to decode (a Node in a request body: decoded only when the name's
/// remembered `resourceVersion` differs).
#[derive(Clone, Copy, Debug)]
pub struct NodeKey<'a> {
    /// `metadata.name`.
    pub name: &'a str,
    /// `metadata.resourceVersion`.
    pub resource_version: Option<&'a str>,
    /// The `weft.io/gpu-topology` annotation, if the node has one.
    pub annotation: Option<Annotation<'a>>,
}

/// The topology annotation's value: text, or the JSON string literal that holds it.
#[derive(Clone, Copy, Debug)]
pub enum Annotation<'a> {
    /// The text.
    Text(&'a str),
    /// A JSON string literal (quotes and escapes included), decoded when needed.
    Json(&'a str),
}

impl<'a> Annotation<'a> {
    /// The text (a literal that is not a JSON string reads as an annotation that does not parse).
    fn text(self) -> Cow<'a, str> {
        match self {
            Annotation::Text(t) => Cow::Borrowed(t),
            Annotation::Json(j) => serde_json::from_str::<Cow<'a, str>>(j)
                .unwrap_or_else(|e| Cow::Owned(format!("(not a JSON string: {e})"))),
        }
    }
}

impl<'a> NodeKey<'a> {
    /// The key of a decoded Node.
    pub fn of(node: &'a Node) -> NodeKey<'a> {
        NodeKey {
            name: node.metadata.name.as_deref().unwrap_or(""),
            resource_version: node.metadata.resource_version.as_deref(),
            annotation: node
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(TOPOLOGY_ANNOTATION))
                .map(|t| Annotation::Text(t)),
        }
    }
}

/// One annotation text and what it parsed to, shared by every node carrying that text.
#[derive(Debug)]
struct Topology {
    text: Arc<str>,
    value: Resolved,
    bytes: usize,
    last_used: AtomicU64,
}

/// Fixed cost counted for each name entry besides its strings (map slot, `Arc`, counters).
const NAME_OVERHEAD: usize = 96;

impl Default for TopologyCache {
    fn default() -> Self {
        TopologyCache::with_limits(CacheLimits::default())
    }
}

impl TopologyCache {
    /// An empty cache with the default limits.
    pub fn new() -> TopologyCache {
        TopologyCache::default()
    }

    /// An empty cache with these limits.
    pub fn with_limits(limits: CacheLimits) -> TopologyCache {
        TopologyCache {
            inner: Mutex::default(),
            limits,
            missing: format!("node has no {TOPOLOGY_ANNOTATION} annotation").into(),
            not_in_view: Arc::from("node is not in the extender's node cache"),
        }
    }

    /// Resolve a batch of nodes (one request's candidates); `None` stands for a node the view does
    /// not know.
    pub fn resolve_all<'a>(&self, nodes: impl IntoIterator<Item = Option<&'a Node>>) -> Vec<Resolved> {
        self.resolve_keys(nodes.into_iter().map(|n| n.map(NodeKey::of)))
    }

    /// [`TopologyCache::resolve_all`] over nodes given by what the cache reads of them.
    pub fn resolve_keys<'a>(&self, nodes: impl IntoIterator<Item = Option<NodeKey<'a>>>) -> Vec<Resolved> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.tick += 1;
        let out = nodes
            .into_iter()
            .map(|node| match node {
                None => Err(self.not_in_view.clone()),
                Some(key) => inner.resolve(key, &self.missing).1,
            })
            .collect();
        inner.enforce(self.limits);
        out
    }

    /// [`TopologyCache::resolve_all`] over the view's shared node objects, each with the name it
    /// was looked up by: a name whose entry was resolved from the very object the view hands out
    /// now is answered without reading the node at all (its name, annotation and
    /// `resourceVersion` stay untouched), so an unchanged node costs one lookup by name.
    pub fn resolve_shared<'a>(
        &self,
        nodes: impl IntoIterator<Item = (&'a str, Option<&'a Arc<Node>>)>,
    ) -> Vec<Resolved> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.tick += 1;
        let tick = inner.tick;
        let out = nodes
            .into_iter()
            .map(|(name, node)| {
                let Some(node) = node else { return Err(self.not_in_view.clone()) };
                if let Some(e) = inner.names.get(name)
                    && e.object.as_ref().is_some_and(|o| std::ptr::eq(o.as_ptr(), Arc::as_ptr(node)))
                {
                    e.topology.last_used.store(tick, Ordering::Relaxed);
                    return e.topology.value.clone();
                }
                let (entry, resolved) = inner.resolve(NodeKey { name, ..NodeKey::of(node) }, &self.missing);
                if entry && let Some(e) = inner.names.get_mut(name) {
                    e.object = Some(Arc::downgrade(node));
                }
                resolved
            })
            .collect();
        inner.enforce(self.limits);
        out
    }

    /// Resolve one node.
    pub fn resolve(&self, node: &Node) -> Resolved {
        self.resolve_all([Some(node)]).pop().unwrap_or_else(|| Err(self.missing.clone()))
    }

    /// Number of node names cached.
    pub fn len(&self) -> usize {
        self.lock().names.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of distinct annotation texts cached (each parsed once).
    pub fn distinct_topologies(&self) -> usize {
        self.lock().texts.len()
    }

    /// Estimated bytes held.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// The limits.
    pub fn limits(&self) -> CacheLimits {
        self.limits
    }

    /// How many annotations have been parsed since the cache was made (for tests and metrics).
    pub fn parses(&self) -> u64 {
        self.lock().parses
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Inner {
    /// Resolves one node; the flag says whether its name now has an entry (not when it has no
    /// annotation).
    fn resolve(&mut self, node: NodeKey<'_>, missing: &Arc<str>) -> (bool, Resolved) {
        let name = node.name;
        let Some(annotation) = node.annotation else {
            self.forget_name(name);
            return (false, Err(missing.clone()));
        };
        let rv = node.resource_version;
        let tick = self.tick;
        // The text, decoded at most once and only when the version does not settle it.
        let mut text: Option<Cow<'_, str>> = None;
        // The same node at the same resourceVersion, or with the same text: what it had.
        let mut bytes = self.bytes;
        let remembered = self.names.get_mut(name).and_then(|e| {
            let same_version = rv.is_some() && e.resource_version.as_deref() == rv;
            if !same_version {
                if *e.topology.text != *text.get_or_insert_with(|| annotation.text()) {
                    return None;
                }
                // The same text under another version: remember the version.
                bytes = bytes - e.resource_version.as_ref().map_or(0, String::len) + rv.map_or(0, str::len);
                e.resource_version = rv.map(str::to_string);
                e.object = None;
            }
            Some(e.topology.clone())
        });
        self.bytes = bytes;
        let topology = match remembered {
            Some(t) => t,
            None => {
                let text = text.unwrap_or_else(|| annotation.text());
                let topology = match self.texts.get(&*text) {
                    Some(t) => t.clone(),
                    None => self.parse_new(name, &text),
                };
                self.forget_name(name);
                self.bytes += name.len() + rv.map_or(0, str::len) + NAME_OVERHEAD;
                self.names.insert(
                    name.to_string(),
                    NameEntry { resource_version: rv.map(str::to_string), topology: topology.clone(), object: None },
                );
                topology
            }
        };
        topology.last_used.store(tick, Ordering::Relaxed);
        (true, topology.value.clone())
    }

    /// Parses a text not seen before and keeps it.
    fn parse_new(&mut self, name: &str, text: &str) -> Arc<Topology> {
        let value = self.parse(name, text);
        let bytes = text.len()
            + match &value {
                Ok(p) => p.heap_bytes(text.len()),
                Err(e) => e.len(),
            };
        let text: Arc<str> = Arc::from(text);
        let topology = Arc::new(Topology { text: text.clone(), value, bytes, last_used: AtomicU64::new(self.tick) });
        self.bytes += bytes;
        self.texts.insert(text, topology.clone());
        topology
    }

    fn forget_name(&mut self, name: &str) {
        if let Some(e) = self.names.remove(name) {
            self.bytes =
                self.bytes.saturating_sub(name.len() + e.resource_version.map_or(0, |v| v.len()) + NAME_OVERHEAD);
        }
    }

    fn parse(&mut self, name: &str, text: &str) -> Resolved {
        self.parses += 1;
        let source = format!("node {name}: annotation {TOPOLOGY_ANNOTATION}");
        if !text.trim_start().starts_with('{') {
            return Err(format!("{source}: not weft inventory JSON (apiVersion {})", inventory::API_VERSION).into());
        }
        let topology = weft_topology::parse_node(text, &source).map_err(|e| Arc::<str>::from(e.to_string()))?;
        let prepared = PreparedTopology::new(topology).map_err(|e| Arc::<str>::from(format!("{source}: {e}")))?;
        Ok(Arc::new(prepared))
    }

    /// Evicts least recently used entries until both limits hold with room (7/8 of each).
    fn enforce(&mut self, limits: CacheLimits) {
        if self.names.len() <= limits.max_nodes && self.bytes <= limits.max_bytes {
            return;
        }
        let (node_goal, byte_goal) = (limits.max_nodes / 8 * 7, limits.max_bytes / 8 * 7);
        if self.names.len() > node_goal {
            let mut by_age: Vec<(u64, String)> =
                self.names.iter().map(|(n, e)| (e.topology.last_used.load(Ordering::Relaxed), n.clone())).collect();
            by_age.sort_unstable();
            let excess = self.names.len() - node_goal;
            for (_, name) in by_age.into_iter().take(excess) {
                self.forget_name(&name);
            }
        }
        // Texts no name refers to any more go first, then the least recently used.
        let referenced: std::collections::HashSet<*const Topology> =
            self.names.values().map(|e| Arc::as_ptr(&e.topology)).collect();
        let mut by_age: Vec<(bool, u64, Arc<str>)> = self
            .texts
            .iter()
            .map(|(k, t)| (referenced.contains(&Arc::as_ptr(t)), t.last_used.load(Ordering::Relaxed), k.clone()))
            .collect();
        by_age.sort_unstable_by_key(|a| (a.0, a.1));
        for (is_referenced, _, key) in by_age {
            if self.bytes <= byte_goal && is_referenced {
                break;
            }
            if let Some(t) = self.texts.remove(&key) {
                self.bytes = self.bytes.saturating_sub(t.bytes);
            }
        }
        // Names whose text is gone are read again on their next request; dropping them here lets
        // the evicted topologies be freed.
        let kept: std::collections::HashSet<*const Topology> = self.texts.values().map(Arc::as_ptr).collect();
        let mut freed = 0;
        self.names.retain(|name, e| {
            let keep = kept.contains(&Arc::as_ptr(&e.topology));
            if !keep {
                freed += name.len() + e.resource_version.as_ref().map_or(0, String::len) + NAME_OVERHEAD;
            }
            keep
        });
        self.bytes = self.bytes.saturating_sub(freed);
    }
}
