//! GPUs and VFs decided by bind but not yet visible through the watch (kube-scheduler calls this
//! "assume"): filter, prioritize and the next bind count them as used, so two pods bound in quick
//! succession never get the same GPU. A reservation ends when the view shows its pod on the node
//! (its `weft.io/gpu-ids` then counts through the normal accounting), when its bind fails, or after
//! a bounded time (a pod deleted before the watch showed it).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

/// The in-flight GPU decisions of this extender, per node.
#[derive(Debug)]
pub struct Reservations {
    ttl: Duration,
    by_node: Mutex<HashMap<String, Vec<Held>>>,
    /// Running pods a vc-scheduler session evicted (preempt, reclaim), per node, until when.
    evicted: Mutex<HashMap<String, Vec<(String, Instant)>>>,
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
    /// A ledger whose reservations last at most `ttl`.
    pub fn new(ttl: Duration) -> Reservations {
        Reservations { ttl, by_node: Mutex::new(HashMap::new()), evicted: Mutex::new(HashMap::new()) }
    }

    /// Marks the running pod `pod_uid` on `node` as evicted by a vc-scheduler session
    /// (`Statement.Evict` calls DeallocateFunc for it) until `now` + the ttl: a task the session
    /// pipelines onto the node may be given its devices ([`Reservations::evicted`]).
    pub fn evict(&self, node: &str, pod_uid: &str, now: Instant) {
        let mut evicted = self.evicted.lock().unwrap_or_else(PoisonError::into_inner);
        let list = evicted.entry(node.to_string()).or_default();
        list.retain(|(uid, _)| uid != pod_uid);
        list.push((pod_uid.to_string(), now + self.ttl));
    }

    /// Ends `pod_uid`'s eviction mark on `node` (the session discarded the eviction:
    /// `Statement.unevict` calls AllocateFunc for the victim).
    pub fn unevict(&self, node: &str, pod_uid: &str) {
        let mut evicted = self.evicted.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(list) = evicted.get_mut(node) {
            list.retain(|(uid, _)| uid != pod_uid);
            if list.is_empty() {
                evicted.remove(node);
            }
        }
    }

    /// The pods marked evicted on `node` at `now`; expired marks end here.
    pub fn evicted(&self, node: &str, now: Instant) -> BTreeSet<String> {
        let mut evicted = self.evicted.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(list) = evicted.get_mut(node) else { return BTreeSet::new() };
        list.retain(|(_, until)| *until > now);
        let out = list.iter().map(|(uid, _)| uid.clone()).collect();
        if list.is_empty() {
            evicted.remove(node);
        }
        out
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

    #[test]
    fn eviction_marks_last_until_unevicted_or_expired() {
        let r = Reservations::new(TTL);
        let t = Instant::now();
        r.evict("n1", "v1", t);
        r.evict("n1", "v2", t);
        r.evict("n1", "v1", t + TTL / 2);
        assert_eq!(r.evicted("n1", t), BTreeSet::from(["v1".to_string(), "v2".to_string()]));
        assert!(r.evicted("n2", t).is_empty());
        r.unevict("n1", "v2");
        assert_eq!(r.evicted("n1", t), BTreeSet::from(["v1".to_string()]));
        assert_eq!(r.evicted("n1", t + TTL).len(), 1, "v1's mark was renewed at ttl/2");
        assert!(r.evicted("n1", t + TTL / 2 + TTL).is_empty(), "and expired a ttl later");
        assert!(r.evicted("n1", t).is_empty(), "the expired mark was dropped");
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
