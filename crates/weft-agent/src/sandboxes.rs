//! Which sandboxes each pod has: the kubelet re-creates a dead sandbox as a new one under the same
//! pod UID (attempt + 1) and garbage-collects the old, stopped one later while the new one runs
//! (kuberuntime_gc.go `evictSandboxes`: a sandbox that is not ready, holds no containers and is
//! not the pod's newest). A pod's resources are released when its **last** sandbox is removed,
//! never on the removal of an older one. Pure bookkeeping, no I/O.

use std::collections::{BTreeMap, BTreeSet};

/// Sandbox ids by pod UID.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sandboxes {
    by_pod: BTreeMap<String, BTreeSet<String>>,
}

impl Sandboxes {
    /// Sandbox `id` of pod `uid` exists (RunPodSandbox, or found at a Synchronize).
    pub fn started(&mut self, uid: &str, id: &str) {
        self.by_pod.entry(uid.to_string()).or_default().insert(id.to_string());
    }

    /// Sandbox `id` of pod `uid` was removed. Returns whether the pod has no sandbox left, and so
    /// is gone: true also when weft knew none of its sandboxes (nothing else is known to run it).
    pub fn removed(&mut self, uid: &str, id: &str) -> bool {
        let Some(ids) = self.by_pod.get_mut(uid) else { return true };
        ids.remove(id);
        if ids.is_empty() {
            self.by_pod.remove(uid);
            true
        } else {
            false
        }
    }

    /// Forget every sandbox of pod `uid` (the pod was released).
    pub fn forget(&mut self, uid: &str) {
        self.by_pod.remove(uid);
    }

    /// Replace everything with `(uid, sandbox id)` pairs: the runtime's full list at a Synchronize.
    pub fn replace<'a>(&mut self, pairs: impl IntoIterator<Item = (&'a str, &'a str)>) {
        self.by_pod.clear();
        for (uid, id) in pairs {
            self.started(uid, id);
        }
    }

    /// The sandbox ids of pod `uid`.
    pub fn of(&self, uid: &str) -> impl Iterator<Item = &str> {
        self.by_pod.get(uid).into_iter().flatten().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removing_an_older_sandbox_leaves_the_pod_while_a_newer_one_exists() {
        let mut s = Sandboxes::default();
        s.started("u", "sb-0");
        s.started("u", "sb-1");
        assert!(!s.removed("u", "sb-0"), "attempt 1 still exists");
        assert_eq!(s.of("u").collect::<Vec<_>>(), ["sb-1"]);
        assert!(s.removed("u", "sb-1"), "the last sandbox");
        assert_eq!(s.of("u").count(), 0);
    }

    #[test]
    fn a_removal_for_a_pod_without_known_sandboxes_says_gone() {
        let mut s = Sandboxes::default();
        assert!(s.removed("u", "sb-0"));
        s.started("v", "sb-v");
        assert!(!s.removed("v", "sb-other"), "an unknown sandbox of a pod with a known one");
    }

    #[test]
    fn replace_keeps_only_the_listed_pairs() {
        let mut s = Sandboxes::default();
        s.started("old", "sb-old");
        s.replace([("u", "sb-0"), ("u", "sb-1"), ("v", "sb-v")]);
        assert_eq!(s.of("old").count(), 0);
        assert_eq!(s.of("u").count(), 2);
        s.forget("u");
        assert_eq!(s.of("u").count(), 0);
        assert_eq!(s.of("v").count(), 1);
    }
}
