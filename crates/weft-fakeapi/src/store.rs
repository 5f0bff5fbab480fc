//! Object storage, the global resourceVersion and the event history that watches replay.

use std::collections::{BTreeMap, VecDeque};

use serde_json::Value;

use crate::controls::{Fault, RecordedRequest};
use crate::registry::{GroupResource, Registry, ResourceSpec};
use crate::selectors::Filter;

/// The type of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One write, as kept for watch replay.
#[derive(Debug, Clone)]
struct HistoryEvent {
    gr: GroupResource,
    namespace: Option<String>,
    kind: EventType,
    /// The object after the write (for deletes, its last state carrying the deletion RV).
    object: Value,
    /// The object before the write (modifications only), to send selector transitions.
    prev: Option<Value>,
}

/// Objects of one resource, ordered by (namespace, name) like the apiserver lists them.
type Bucket = BTreeMap<(String, String), Value>;

/// A watch history position that has been compacted away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gone {
    pub(crate) requested: u64,
    pub(crate) oldest: u64,
}

/// Everything behind the server's lock.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) registry: Registry,
    objects: BTreeMap<GroupResource, Bucket>,
    /// Events with resourceVersions `compacted_rv + 1 ..= rv`, in order (one per RV).
    history: VecDeque<HistoryEvent>,
    compacted_rv: u64,
    rv: u64,
    history_limit: usize,
    id_seed: u64,
    id_counter: u64,
    pub(crate) faults: Vec<Fault>,
    pub(crate) expire_watches: usize,
    pub(crate) requests: Vec<RecordedRequest>,
    /// Bumped by every `clear_requests`, so a request in flight across a clear does not write its
    /// code into someone else's entry.
    pub(crate) requests_epoch: u64,
    pub(crate) open_watches: usize,
}

impl State {
    pub(crate) fn new(history_limit: usize, id_seed: u64) -> Self {
        Self {
            registry: Registry::builtin(),
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            compacted_rv: 1,
            rv: 1,
            history_limit: history_limit.max(1),
            id_seed,
            id_counter: 0,
            faults: Vec::new(),
            expire_watches: 0,
            requests: Vec::new(),
            requests_epoch: 0,
            open_watches: 0,
        }
    }

    /// The current global resourceVersion.
    pub(crate) fn rv(&self) -> u64 {
        self.rv
    }

    /// A fresh UID (UUID-shaped, unique within this server).
    pub(crate) fn next_uid(&mut self) -> String {
        self.id_counter += 1;
        let x = self.id_seed ^ self.id_counter.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            (x >> 32) as u32,
            (x >> 16) as u16,
            (x & 0xfff) as u16,
            (self.id_counter >> 48) & 0xfff,
            self.id_counter & 0xffff_ffff_ffff
        )
    }

    /// A fresh 5-character suffix for `generateName`, from the apiserver's alphabet.
    pub(crate) fn next_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        self.id_counter += 1;
        let mut x = (self.id_seed ^ self.id_counter.wrapping_mul(0x2545_F491_4F6C_DD1D)).rotate_left(17);
        let mut out = String::with_capacity(5);
        for _ in 0..5 {
            out.push(char::from(ALPHABET[(x % ALPHABET.len() as u64) as usize]));
            x /= ALPHABET.len() as u64;
        }
        out
    }

    pub(crate) fn get(&self, gr: &GroupResource, namespace: Option<&str>, name: &str) -> Option<&Value> {
        self.objects.get(gr)?.get(&(namespace.unwrap_or_default().to_owned(), name.to_owned()))
    }

    /// Objects matching a filter, ordered by namespace and name, starting after `after`.
    pub(crate) fn list(&self, gr: &GroupResource, filter: &Filter, after: Option<&(String, String)>) -> Vec<&Value> {
        let Some(bucket) = self.objects.get(gr) else { return Vec::new() };
        let iter: Box<dyn Iterator<Item = (&(String, String), &Value)>> = match after {
            Some(key) => Box::new(
                bucket
                    .range::<(String, String), _>((std::ops::Bound::Excluded(key.clone()), std::ops::Bound::Unbounded)),
            ),
            None => Box::new(bucket.iter()),
        };
        iter.filter(|(_, v)| filter.matches(v)).map(|(_, v)| v).collect()
    }

    /// Stores a write: bumps the global RV, stamps it into the object, records the event and
    /// returns the stored object. For deletes the object is removed and returned with the new RV.
    pub(crate) fn commit(
        &mut self,
        spec: &ResourceSpec,
        kind: EventType,
        mut object: Value,
        prev: Option<Value>,
    ) -> Value {
        self.rv += 1;
        crate::meta::set_meta(&mut object, "resourceVersion", Value::String(self.rv.to_string()));
        let gr = spec.group_resource();
        let namespace = if spec.namespaced { crate::meta::namespace(&object).map(str::to_owned) } else { None };
        let key = (namespace.clone().unwrap_or_default(), crate::meta::name(&object).unwrap_or_default().to_owned());
        let bucket = self.objects.entry(gr.clone()).or_default();
        match kind {
            EventType::Deleted => {
                bucket.remove(&key);
            }
            EventType::Added | EventType::Modified => {
                bucket.insert(key, object.clone());
            }
        }
        self.history.push_back(HistoryEvent { gr, namespace, kind, object: object.clone(), prev });
        while self.history.len() > self.history_limit {
            self.history.pop_front();
            self.compacted_rv += 1;
        }
        object
    }

    /// Forgets the whole event history: watches from any older resourceVersion get 410 Gone.
    pub(crate) fn compact(&mut self) {
        self.history.clear();
        self.compacted_rv = self.rv;
    }

    /// Drops every object of a resource without events (used when a CRD goes away).
    pub(crate) fn drop_resource(&mut self, gr: &GroupResource) {
        self.objects.remove(gr);
    }

    /// Watch events for `gr` after `cursor` as a filtered watcher sees them, and the RV the
    /// watcher has then seen up to.
    pub(crate) fn events_since(
        &self,
        gr: &GroupResource,
        filter: &Filter,
        cursor: u64,
    ) -> Result<(Vec<(EventType, Value)>, u64), Gone> {
        if cursor < self.compacted_rv {
            return Err(Gone { requested: cursor, oldest: self.compacted_rv + 1 });
        }
        let start = usize::try_from(cursor - self.compacted_rv).unwrap_or(usize::MAX);
        let mut out = Vec::new();
        for (offset, ev) in self.history.iter().enumerate().skip(start) {
            if ev.gr != *gr {
                continue;
            }
            if let (Some(want), Some(have)) = (&filter.namespace, &ev.namespace)
                && want != have
            {
                continue;
            }
            let now = filter.matches(&ev.object);
            match ev.kind {
                EventType::Added | EventType::Deleted => {
                    if now {
                        out.push((ev.kind, ev.object.clone()));
                    }
                }
                EventType::Modified => {
                    let before = ev.prev.as_ref().is_some_and(|p| filter.matches(p));
                    match (before, now) {
                        (true, true) => out.push((EventType::Modified, ev.object.clone())),
                        (false, true) => out.push((EventType::Added, ev.object.clone())),
                        (true, false) => {
                            // Left the selection: the last matching state, at this event's RV.
                            let mut gone = ev.prev.clone().unwrap_or_else(|| ev.object.clone());
                            let rv = self.compacted_rv + 1 + offset as u64;
                            crate::meta::set_meta(&mut gone, "resourceVersion", Value::String(rv.to_string()));
                            out.push((EventType::Deleted, gone));
                        }
                        (false, false) => {}
                    }
                }
            }
        }
        Ok((out, cursor.max(self.rv)))
    }
}
