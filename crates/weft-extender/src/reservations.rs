//! GPUs and VFs decided by bind but not yet visible through the watch (kube-scheduler calls this
//! "assume"): filter, prioritize and the next bind count them as used, so two pods bound in quick
//! succession never get the same GPU. A reservation ends when the view shows its pod on the node
//! (its `weft.io/gpu-ids` then counts through the normal accounting), when its bind fails, or after
//! a bounded time (a pod deleted before the watch showed it).
//!
//! Replicas share the decisions through a [`NodeRecord`] per node, kept on the API server (a
//! Lease, [`record_name`]) and written with a resourceVersion precondition before the pod's
//! Binding: the API server serialises two replicas' decisions for one node, and the loser decides
//! again over the winner's devices (docs/scheduler-extender.md, "Replicas"). The in-process ledger
//! ([`Reservations`]) stays: it is what this replica's filter and prioritize count.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hasher;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

/// The annotation of a node's record Lease that holds the [`NodeRecord`] (JSON).
pub const RECORD_ANNOTATION: &str = "weft.io/node-reservations";

/// The name prefix of the record Leases.
pub const RECORD_PREFIX: &str = "weft-reservations.";

/// The name of `node`'s record Lease: [`RECORD_PREFIX`] + the node's name; a node name too long
/// for that (over 235 characters) is cut and followed by a hash of the whole name, so every node
/// has its own Lease and every replica computes the same name.
pub fn record_name(node: &str) -> String {
    const MAX: usize = 253;
    let whole = format!("{RECORD_PREFIX}{node}");
    if whole.len() <= MAX {
        return whole;
    }
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(node.as_bytes());
    let hash = format!("{:016x}", hasher.finish());
    let room = MAX - RECORD_PREFIX.len() - hash.len() - 1;
    let cut = node.get(..room).unwrap_or(node).trim_end_matches(['.', '-']);
    format!("{RECORD_PREFIX}{cut}-{hash}")
}

/// One node's in-flight decisions and eviction marks, as every replica sees them: the value of
/// [`RECORD_ANNOTATION`] on the node's record Lease.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Devices decided for pods the deciding replica's watch did not yet show on the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<RecordEntry>,
    /// Running pods a vc-scheduler session evicted on the node (`Statement.Evict`), which a task
    /// the session pipelines onto the node may be given the devices of.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evicted: Vec<RecordEntry>,
}

/// One pod's entry in a [`NodeRecord`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordEntry {
    /// The pod's UID.
    pub pod: String,
    /// GPU indices held.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<usize>,
    /// VFs held (PCI addresses).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vfs: Vec<String>,
    /// When the entry ends (RFC 3339, the writer's clock). One that does not parse has ended.
    pub until: String,
}

impl RecordEntry {
    fn live(&self, now: Timestamp) -> bool {
        self.until.parse::<Timestamp>().is_ok_and(|until| until > now)
    }
}

impl NodeRecord {
    /// The record in a Lease's annotation value; a value that does not parse reads as empty (its
    /// entries would have ended within one ttl anyway), with the reason.
    pub fn parse(value: Option<&str>) -> Result<NodeRecord, String> {
        value.map_or(Ok(NodeRecord::default()), |v| {
            serde_json::from_str(v).map_err(|e| format!("{RECORD_ANNOTATION} is not a node record: {e}"))
        })
    }

    /// The annotation value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Drops the entries that ended at `now`; returns the devices the others' entries hold
    /// (`pod_uid`'s own are kept but do not count against it: only one of its Bindings can
    /// succeed).
    ///
    /// An entry is not dropped when the deciding replica's watch shows its pod: another replica's
    /// watch may lag behind, and for it the entry is the only trace of the pod. A visible pod's
    /// entry and its annotation name the same devices, so counting both costs nothing.
    pub fn settle(&mut self, pod_uid: &str, now: Timestamp) -> Reserved {
        self.held.retain(|e| e.live(now));
        self.evicted.retain(|e| e.live(now));
        self.held.iter().filter(|e| e.pod != pod_uid).fold(Reserved::default(), |mut r, e| {
            r.gpus |= e.gpus.iter().filter(|&&g| g < 128).fold(0u128, |m, &g| m | (1u128 << g));
            r.vfs.extend(e.vfs.iter().cloned());
            r
        })
    }

    /// Holds `devices` for `pod_uid` until `until`, beside the pod's earlier entries (an earlier
    /// attempt to bind it may still land); returns the entry.
    pub fn hold(&mut self, pod_uid: &str, devices: &Reserved, until: Timestamp) -> RecordEntry {
        let entry = RecordEntry {
            pod: pod_uid.to_string(),
            gpus: (0..128).filter(|&g| devices.gpus & (1u128 << g) != 0).collect(),
            vfs: devices.vfs.iter().cloned().collect(),
            until: until.to_string(),
        };
        self.held.push(entry.clone());
        entry
    }

    /// Ends all of `pod_uid`'s entries (an allocation taken back, or replaced by a new one, for a
    /// pod that is not bound).
    pub fn release(&mut self, pod_uid: &str) {
        self.held.retain(|e| e.pod != pod_uid);
    }

    /// Ends one entry (the attempt that wrote it failed for certain).
    pub fn release_entry(&mut self, entry: &RecordEntry) {
        self.held.retain(|e| e != entry);
    }

    /// Marks `pod_uid` evicted until `until`.
    pub fn evict(&mut self, pod_uid: &str, until: Timestamp) {
        self.evicted.retain(|e| e.pod != pod_uid);
        self.evicted.push(RecordEntry {
            pod: pod_uid.to_string(),
            gpus: Vec::new(),
            vfs: Vec::new(),
            until: until.to_string(),
        });
    }

    /// Ends `pod_uid`'s eviction mark.
    pub fn unevict(&mut self, pod_uid: &str) {
        self.evicted.retain(|e| e.pod != pod_uid);
    }

    /// The pods marked evicted at `now`.
    pub fn evicted_at(&self, now: Timestamp) -> BTreeSet<String> {
        self.evicted.iter().filter(|e| e.live(now)).map(|e| e.pod.clone()).collect()
    }
}

/// `now` + `ttl` on the wall clock (the record is read by other replicas, whose `Instant`s mean
/// nothing here).
pub fn wall_until(now: Timestamp, ttl: Duration) -> Timestamp {
    SignedDuration::try_from(ttl).ok().and_then(|d| now.checked_add(d).ok()).unwrap_or(Timestamp::MAX)
}

/// The in-flight GPU decisions of this extender, per node.
#[derive(Debug)]
pub struct Reservations {
    ttl: Duration,
    by_node: Mutex<HashMap<String, Vec<Held>>>,
    /// Per node, the lock whose holder decides there ([`Reservations::turn`]).
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

#[derive(Clone, Debug)]
struct Held {
    pod_uid: String,
    devices: Reserved,
    until: Instant,
}

/// What reservations hold on a node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reserved {
    /// GPUs, as a mask.
    pub gpus: u128,
    /// SR-IOV VFs (PCI addresses).
    pub vfs: BTreeSet<String>,
}

impl Reserved {
    /// Reserved GPUs only.
    pub fn gpus(gpus: u128) -> Reserved {
        Reserved { gpus, vfs: BTreeSet::new() }
    }
}

impl Reservations {
    /// How long a reservation lasts.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A ledger whose reservations last at most `ttl`.
    pub fn new(ttl: Duration) -> Reservations {
        Reservations { ttl, by_node: Mutex::new(HashMap::new()), turns: Mutex::new(HashMap::new()) }
    }

    /// This replica's turn to decide on `node`: one decision per node at a time here, so the
    /// replica's own decisions do not race each other for the node's record; other replicas are
    /// serialised by the record's resourceVersion.
    pub async fn turn(&self, node: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
            turns.entry(node.to_string()).or_default().clone()
        };
        lock.lock_owned().await
    }

    /// GPUs and VFs reserved on `node` at `now`. Reservations that expired, or whose pod `visible`
    /// says the view already shows on the node, end here.
    pub fn held(&self, node: &str, now: Instant, visible: impl Fn(&str) -> bool) -> Reserved {
        let mut by_node = self.by_node.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(list) = by_node.get_mut(node) else { return Reserved::default() };
        let held = prune_and_count(list, now, visible, None);
        if list.is_empty() {
            by_node.remove(node);
        }
        held
    }

    /// The ledger of `node`, locked: no other decision (on any node) and no pruning interleaves
    /// until the returned guard is dropped. Read the view *after* taking it: a reservation may be
    /// dropped as soon as some view snapshot shows its pod, so a decision must not use a snapshot
    /// older than the ledger it reads.
    pub fn lock<'a>(&'a self, node: &str) -> NodeLedger<'a> {
        NodeLedger {
            by_node: self.by_node.lock().unwrap_or_else(PoisonError::into_inner),
            node: node.to_string(),
            ttl: self.ttl,
        }
    }

    /// Ends `pod_uid`'s reservation on `node` (its bind failed).
    pub fn release(&self, node: &str, pod_uid: &str) {
        let mut by_node = self.by_node.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(list) = by_node.get_mut(node) {
            list.retain(|h| h.pod_uid != pod_uid);
            if list.is_empty() {
                by_node.remove(node);
            }
        }
    }

    /// Whether any reservation is held on `node` (expired ones included until a lookup drops them).
    pub fn on_node(&self, node: &str) -> bool {
        self.by_node.lock().unwrap_or_else(PoisonError::into_inner).contains_key(node)
    }

    /// The nodes that hold reservations now (expired ones included until a lookup drops them): one
    /// look for a whole request instead of [`Reservations::on_node`] per candidate.
    pub fn nodes(&self) -> rustc_hash::FxHashSet<String> {
        self.by_node.lock().unwrap_or_else(PoisonError::into_inner).keys().cloned().collect()
    }

    /// Whether `pod_uid` holds a reservation on `node` (expired ones included until a lookup drops
    /// them).
    pub fn holds(&self, node: &str, pod_uid: &str) -> bool {
        let by_node = self.by_node.lock().unwrap_or_else(PoisonError::into_inner);
        by_node.get(node).is_some_and(|list| list.iter().any(|h| h.pod_uid == pod_uid))
    }

    /// Reservations held now, over all nodes (expired ones included until a lookup drops them).
    pub fn len(&self) -> usize {
        self.by_node.lock().unwrap_or_else(PoisonError::into_inner).values().map(Vec::len).sum()
    }

    /// Whether no reservation is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Drops from `list` the reservations that expired at `now`, whose pod `visible` says the view
/// shows, and `replaced`'s own; returns the GPUs and VFs the rest hold.
fn prune_and_count(
    list: &mut Vec<Held>,
    now: Instant,
    visible: impl Fn(&str) -> bool,
    replaced: Option<&str>,
) -> Reserved {
    list.retain(|h| h.until > now && !visible(&h.pod_uid) && Some(h.pod_uid.as_str()) != replaced);
    list.iter().fold(Reserved::default(), |mut r, h| {
        r.gpus |= h.devices.gpus;
        r.vfs.extend(h.devices.vfs.iter().cloned());
        r
    })
}

/// Whether `uid` is among `pods` (the `visible` test of [`Reservations::held`] and
/// [`NodeLedger::others`] over a node's pods as the view shows them).
pub fn shown_in(pods: &[Arc<Pod>]) -> impl Fn(&str) -> bool + '_ {
    move |uid| pods.iter().any(|p| p.metadata.uid.as_deref() == Some(uid))
}

/// One node's reservations, locked (see [`Reservations::lock`]).
pub struct NodeLedger<'a> {
    by_node: MutexGuard<'a, HashMap<String, Vec<Held>>>,
    node: String,
    ttl: Duration,
}

impl NodeLedger<'_> {
    /// GPUs and VFs reserved for pods other than `pod_uid`; reservations that expired or whose pod
    /// `visible` says the view shows on the node end here, as does `pod_uid`'s own.
    pub fn others(&mut self, pod_uid: &str, now: Instant, visible: impl Fn(&str) -> bool) -> Reserved {
        self.by_node
            .get_mut(&self.node)
            .map_or_else(Reserved::default, |list| prune_and_count(list, now, visible, Some(pod_uid)))
    }

    /// Reserves `devices` for `pod_uid` until `now` + the ledger's ttl.
    pub fn reserve(mut self, pod_uid: &str, devices: Reserved, now: Instant) {
        let until = now + self.ttl;
        let held = Held { pod_uid: pod_uid.to_string(), devices, until };
        self.by_node.entry(self.node.clone()).or_default().push(held);
    }
}

impl Drop for NodeLedger<'_> {
    fn drop(&mut self) {
        if self.by_node.get(&self.node).is_some_and(Vec::is_empty) {
            self.by_node.remove(&self.node);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(30);

    /// Takes `gpus` on `node` for `uid` unless another reservation holds one of them.
    fn take(r: &Reservations, node: &str, uid: &str, gpus: u128, now: Instant) -> bool {
        let mut ledger = r.lock(node);
        if ledger.others(uid, now, |_| false).gpus & gpus != 0 {
            return false;
        }
        ledger.reserve(uid, Reserved::gpus(gpus), now);
        true
    }

    #[test]
    fn a_reservation_counts_until_its_pod_is_visible() {
        let r = Reservations::new(TTL);
        let t = Instant::now();
        assert!(take(&r, "n1", "a", 0b11, t));
        assert_eq!(r.held("n1", t, |_| false).gpus, 0b11);
        assert_eq!(r.held("n2", t, |_| false).gpus, 0);
        // Another pod cannot take what is reserved.
        assert!(!take(&r, "n1", "b", 0b10, t));
        assert!(take(&r, "n1", "b", 0b100, t));
        assert_eq!(r.held("n1", t, |_| false).gpus, 0b111);
        // The watch shows pod a: its GPUs are now counted from its annotation, not the ledger.
        assert_eq!(r.held("n1", t, |uid| uid == "a").gpus, 0b100);
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn reservations_expire_and_failed_binds_release_theirs() {
        let r = Reservations::new(TTL);
        let t = Instant::now();
        assert!(take(&r, "n1", "a", 0b1, t));
        assert!(take(&r, "n1", "b", 0b10, t));
        r.release("n1", "b");
        assert_eq!(r.held("n1", t, |_| false).gpus, 0b1);
        assert_eq!(r.held("n1", t + TTL, |_| false).gpus, 0, "expired at the ttl");
        assert!(r.is_empty());
    }

    #[test]
    fn deciding_again_for_a_pod_replaces_its_reservation_and_a_refusal_reserves_nothing() {
        let r = Reservations::new(TTL);
        let t = Instant::now();
        assert!(take(&r, "n1", "a", 0b1, t));
        assert!(take(&r, "n1", "a", 0b1, t), "its own reservation is not in the way");
        assert_eq!(r.len(), 1);
        let mut ledger = r.lock("n2");
        assert_eq!(ledger.others("c", t, |_| false), Reserved::default());
        drop(ledger);
        assert_eq!(r.len(), 1, "looking reserved nothing");
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_record_counts_other_pods_entries_until_they_expire_or_are_released() {
        let t = at("2026-11-28T10:00:00Z");
        let mut r = NodeRecord::default();
        let vfs = BTreeSet::from(["0000:0c:00.2".to_string()]);
        r.hold("a", &Reserved { gpus: 0b11, vfs: vfs.clone() }, at("2026-11-28T10:01:00Z"));
        r.hold("b", &Reserved::gpus(0b100), at("2026-11-28T10:00:30Z"));
        let c = r.hold("c", &Reserved::gpus(0b1000), at("2026-11-28T10:01:00Z"));
        // The record survives its annotation.
        let mut r = NodeRecord::parse(Some(&r.to_annotation())).unwrap();
        assert_eq!(r.clone().settle("x", t), Reserved { gpus: 0b1111, vfs: vfs.clone() });
        // b expired; a's own entries do not count against it, but stay.
        assert_eq!(r.settle("a", at("2026-11-28T10:00:30Z")), Reserved::gpus(0b1000));
        assert_eq!(r.held.len(), 2, "{r:?}");
        // A second attempt for c is held beside the first; ending one attempt keeps the other.
        let c2 = r.hold("c", &Reserved::gpus(0b10000), at("2026-11-28T10:01:00Z"));
        assert_eq!(r.clone().settle("x", t).gpus, 0b11011);
        r.release_entry(&c);
        assert_eq!(r.clone().settle("x", t).gpus, 0b10011);
        r.release_entry(&c2);
        r.release("a");
        assert_eq!(r, NodeRecord::default());
    }

    #[test]
    fn eviction_marks_in_the_record_end_when_undone_or_expired() {
        let t = at("2026-11-28T10:00:00Z");
        let mut r = NodeRecord::default();
        r.evict("v1", at("2026-11-28T10:01:00Z"));
        r.evict("v2", at("2026-11-28T10:00:10Z"));
        assert_eq!(r.evicted_at(t), BTreeSet::from(["v1".to_string(), "v2".to_string()]));
        assert_eq!(r.evicted_at(at("2026-11-28T10:00:10Z")), BTreeSet::from(["v1".to_string()]), "v2's mark expired");
        r.unevict("v1");
        assert_eq!(r.evicted_at(t), BTreeSet::from(["v2".to_string()]));
        r.settle("x", at("2026-11-28T10:00:20Z"));
        assert!(r.evicted.is_empty(), "settling drops expired marks");
    }

    #[test]
    fn bad_records_and_entries_read_as_ended() {
        assert_eq!(NodeRecord::parse(None).unwrap(), NodeRecord::default());
        let error = NodeRecord::parse(Some("[1,2]")).unwrap_err();
        assert!(error.contains(RECORD_ANNOTATION), "{error}");
        let mut r = NodeRecord::parse(Some(r#"{"held":[{"pod":"a","gpus":[0],"until":"soon"}]}"#)).unwrap();
        assert_eq!(r.settle("x", at("2026-11-28T10:00:00Z")), Reserved::default());
        assert!(wall_until(at("2026-11-28T10:00:00Z"), Duration::MAX) > at("9999-01-01T00:00:00Z"));
    }

    #[test]
    fn record_names_are_distinct_valid_names_for_every_node_name() {
        assert_eq!(record_name("n1"), "weft-reservations.n1");
        let long = |c: char| format!("{}.{}", "a".repeat(200), c.to_string().repeat(52));
        let (x, y) = (record_name(&long('x')), record_name(&long('y')));
        assert_ne!(x, y);
        for name in [&x, &y] {
            assert!(name.len() <= 253, "{name}");
            crate::bind::check_subdomain("record", name).unwrap();
        }
        // A cut that would end in '.' or '-' is trimmed.
        let dotted = format!("{}.{}", "a".repeat(217), "b".repeat(40));
        let name = record_name(&dotted);
        assert!(name.starts_with(&format!("weft-reservations.{}-", "a".repeat(217))), "{name}");
        crate::bind::check_subdomain("record", &name).unwrap();
    }

    #[test]
    fn reserved_vfs_count_like_gpus() {
        let r = Reservations::new(TTL);
        let t = Instant::now();
        let vfs = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        r.lock("n1").reserve("a", Reserved { gpus: 0b1, vfs: vfs(&["0000:0c:00.2"]) }, t);
        r.lock("n1").reserve("b", Reserved { gpus: 0b10, vfs: vfs(&["0000:8c:00.2"]) }, t);
        assert_eq!(r.held("n1", t, |_| false).vfs, vfs(&["0000:0c:00.2", "0000:8c:00.2"]));
        assert_eq!(r.lock("n1").others("a", t, |_| false), Reserved { gpus: 0b10, vfs: vfs(&["0000:8c:00.2"]) });
        assert_eq!(
            r.held("n1", t, |uid| uid == "b").vfs,
            BTreeSet::new(),
            "a's own reservation was replaced; b is visible"
        );
    }
}
