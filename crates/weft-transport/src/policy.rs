//! The sender's and receiver's decisions, as pure functions and small data structures with no
//! I/O: which link a message goes to, how long to wait before reconnecting, which ids are
//! duplicates, what the input watermark is, and whether a message fits the in-flight bound.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::protocol::NO_WATERMARK;

// ---------------------------------------------------------------------------------------------
// Selection

/// How the sender picks a link for each message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Selection {
    /// Each message to the next live link in turn.
    #[default]
    RoundRobin,
    /// Each message to the live link with the fewest unacknowledged messages; ties go round
    /// robin. Slow or busy receivers get less.
    LeastOutstanding,
}

/// What selection sees of one link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Can take new messages (connected and its peer still in the peer set).
    pub open: bool,
    /// Messages assigned to it and not yet acknowledged.
    pub outstanding: usize,
}

/// The index of the link the next message goes to, or `None` when no link is open. `cursor` is
/// the rotation state the caller keeps between calls; `avoid` is a link not to use unless it is
/// the only open one (the one that just refused the message).
pub fn pick(policy: Selection, links: &[Candidate], cursor: &mut usize, avoid: Option<usize>) -> Option<usize> {
    let n = links.len();
    if n == 0 {
        return None;
    }
    let start = *cursor % n;
    let usable = |i: usize, allow_avoided: bool| links[i].open && (allow_avoided || Some(i) != avoid);
    for allow_avoided in [false, true] {
        let order = (0..n).map(|k| (start + k) % n);
        let chosen = match policy {
            Selection::RoundRobin => order.clone().find(|&i| usable(i, allow_avoided)),
            Selection::LeastOutstanding => order
                .clone()
                .filter(|&i| usable(i, allow_avoided))
                // min_by_key keeps the first of equals, i.e. the next in rotation.
                .min_by_key(|&i| links[i].outstanding),
        };
        if let Some(i) = chosen {
            *cursor = i + 1;
            return Some(i);
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------
// Backoff

/// Exponential backoff for reconnecting and re-resolving: `initial`, doubling per failed
/// attempt up to `max`, with up to `jitter` (0..=1) of each delay taken off at random so peers
/// that lost the same receiver do not reconnect in lockstep.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { initial: Duration::from_millis(50), max: Duration::from_secs(5), jitter: 0.5 }
    }
}

impl Backoff {
    /// The delay before attempt `attempt` (0 = the first retry), with `unit` a random number in
    /// `[0, 1)`. Never more than `max`, never less than `(1 - jitter)` of the un-jittered delay.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let base = self.initial.saturating_mul(2u32.saturating_pow(attempt.min(30))).min(self.max);
        let jitter = self.jitter.clamp(0.0, 1.0) * unit.clamp(0.0, 1.0);
        base.mul_f64(1.0 - jitter)
    }
}

// ---------------------------------------------------------------------------------------------
// In-flight bound

/// What the sender does when the in-flight bound is reached: Numaflow's `onFull` choices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnFull {
    /// Wait until acknowledgements make room (Numaflow's `retryUntilSuccess`, the default).
    #[default]
    RetryUntilSuccess,
    /// Drop the message, count it, and say so (Numaflow's `discardLatest`).
    DiscardLatest,
}

/// The sender's in-flight limits: messages and bytes (payload plus encoded header) sent or
/// queued and not yet acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlightLimit {
    pub messages: usize,
    pub bytes: usize,
}

impl Default for InFlightLimit {
    fn default() -> Self {
        Self { messages: 512, bytes: 256 * 1024 * 1024 }
    }
}

impl InFlightLimit {
    /// Whether one more message of `size` bytes fits on top of `messages`/`bytes` in flight.
    pub fn fits(&self, messages: usize, bytes: usize, size: usize) -> bool {
        messages < self.messages && bytes.saturating_add(size) <= self.bytes
    }
}

// ---------------------------------------------------------------------------------------------
// Dedup

/// What the receiver knows of a message id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Not seen (or forgotten): now marked in progress; run the handler.
    New,
    /// A handler for this id is running: wait for its outcome.
    InProgress,
    /// A handler for this id succeeded: acknowledge without running it again.
    Done,
}

/// The receiver's memory of message ids, bounded in count and age.
///
/// An id is *in progress* while its handler runs and *done* once it succeeded; a failed handler
/// forgets the id, so a resend runs the handler again. Done ids are kept until there are more
/// than `capacity` of them or they are older than `ttl`, oldest first; a duplicate that arrives
/// after its id was forgotten runs the handler again (at-least-once). In-progress ids are not
/// counted: they are bounded by the handlers running and waiting.
///
/// The ids come from peers, so the map's hasher is keyed (foldhash's per-process random seed),
/// and fast: every message costs one map operation when it arrives, two when its handler
/// finishes, and one when its id expires.
#[derive(Debug)]
pub struct DedupWindow {
    capacity: usize,
    ttl: Duration,
    states: HashMap<Arc<str>, Seen, foldhash::fast::RandomState>,
    done: VecDeque<(Arc<str>, Instant)>,
}

impl DedupWindow {
    /// A window of at most `capacity` done ids, each kept at most `ttl`.
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        Self { capacity, ttl, states: HashMap::default(), done: VecDeque::new() }
    }

    /// Looks `id` up, marking it in progress when it is new.
    pub fn begin(&mut self, id: &str, now: Instant) -> Seen {
        self.expire(now);
        // One lookup; the key is needed for a new id anyway (duplicates are the rare case).
        match self.states.entry(Arc::from(id)) {
            Entry::Occupied(seen) => *seen.get(),
            Entry::Vacant(slot) => {
                slot.insert(Seen::InProgress);
                Seen::New
            }
        }
    }

    /// The handler for `id` finished: done when `ok`, forgotten otherwise.
    pub fn finish(&mut self, id: &str, ok: bool, now: Instant) {
        if !ok {
            self.states.remove(id);
        } else if let Some((key, seen)) = self.states.get_key_value(id)
            && *seen == Seen::InProgress
        {
            let key = key.clone();
            if let Some(seen) = self.states.get_mut(id) {
                *seen = Seen::Done;
            }
            self.done.push_back((key, now));
        }
        self.expire(now);
    }

    /// Done ids remembered now.
    pub fn done_len(&self) -> usize {
        self.done.len()
    }

    fn expire(&mut self, now: Instant) {
        while let Some((_, at)) = self.done.front() {
            let too_many = self.done.len() > self.capacity;
            let too_old = now.saturating_duration_since(*at) > self.ttl;
            if !too_many && !too_old {
                break;
            }
            let Some((id, _)) = self.done.pop_front() else {
                break;
            };
            // Done ids go; one whose state is something else now keeps it.
            if let Some(other @ Seen::InProgress) = self.states.remove(&id) {
                self.states.insert(id, other);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Watermarks

/// The input watermark from the upstream senders' watermarks: their minimum (a sender with no
/// watermark yet, [`NO_WATERMARK`], holds it at "none"), never below `previous` (watermarks do
/// not go back), and `previous` unchanged when there are no senders.
pub fn input_watermark(previous: i64, senders: impl IntoIterator<Item = i64>) -> i64 {
    match senders.into_iter().min() {
        None => previous,
        Some(min) if min == NO_WATERMARK => previous,
        Some(min) => min.max(previous),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(outstanding: usize) -> Candidate {
        Candidate { open: true, outstanding }
    }
    const CLOSED: Candidate = Candidate { open: false, outstanding: 0 };

    #[test]
    fn round_robin_rotates_over_open_links() {
        let links = [open(0), CLOSED, open(9), open(0)];
        let mut cursor = 0;
        let picks: Vec<_> = (0..6).map(|_| pick(Selection::RoundRobin, &links, &mut cursor, None)).collect();
        assert_eq!(picks, [Some(0), Some(2), Some(3), Some(0), Some(2), Some(3)]);
    }

    #[test]
    fn least_outstanding_prefers_the_least_loaded_and_rotates_ties() {
        let links = [open(5), open(1), open(1), open(3)];
        let mut cursor = 0;
        assert_eq!(pick(Selection::LeastOutstanding, &links, &mut cursor, None), Some(1));
        assert_eq!(pick(Selection::LeastOutstanding, &links, &mut cursor, None), Some(2));
        assert_eq!(pick(Selection::LeastOutstanding, &links, &mut cursor, None), Some(1));
    }

    #[test]
    fn avoided_link_is_used_only_when_it_is_the_only_one() {
        let mut cursor = 0;
        let links = [open(0), open(0)];
        assert_eq!(pick(Selection::RoundRobin, &links, &mut cursor, Some(0)), Some(1));
        let links = [open(0), CLOSED];
        assert_eq!(pick(Selection::LeastOutstanding, &links, &mut cursor, Some(0)), Some(0));
    }

    #[test]
    fn nothing_open_picks_nothing() {
        let mut cursor = 3;
        assert_eq!(pick(Selection::RoundRobin, &[], &mut cursor, None), None);
        assert_eq!(pick(Selection::LeastOutstanding, &[CLOSED, CLOSED], &mut cursor, None), None);
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_jitter_only_shortens() {
        let b = Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(1), jitter: 0.5 };
        assert_eq!(b.delay(0, 0.0), Duration::from_millis(100));
        assert_eq!(b.delay(1, 0.0), Duration::from_millis(200));
        assert_eq!(b.delay(3, 0.0), Duration::from_millis(800));
        assert_eq!(b.delay(4, 0.0), Duration::from_secs(1));
        assert_eq!(b.delay(u32::MAX, 0.0), Duration::from_secs(1));
        assert_eq!(b.delay(0, 1.0), Duration::from_millis(50));
        for unit in [0.0, 0.3, 0.99] {
            let d = b.delay(10, unit);
            assert!(d <= b.max && d >= b.max / 2, "{d:?}");
        }
    }

    #[test]
    fn in_flight_limit_counts_messages_and_bytes() {
        let l = InFlightLimit { messages: 2, bytes: 100 };
        assert!(l.fits(0, 0, 100));
        assert!(!l.fits(0, 0, 101));
        assert!(l.fits(1, 50, 50));
        assert!(!l.fits(1, 51, 50));
        assert!(!l.fits(2, 0, 1));
    }

    #[test]
    fn dedup_tracks_progress_done_and_failure() {
        let now = Instant::now();
        let mut w = DedupWindow::new(10, Duration::from_secs(60));
        assert_eq!(w.begin("a", now), Seen::New);
        assert_eq!(w.begin("a", now), Seen::InProgress);
        w.finish("a", true, now);
        assert_eq!(w.begin("a", now), Seen::Done);
        assert_eq!(w.begin("b", now), Seen::New);
        w.finish("b", false, now);
        assert_eq!(w.begin("b", now), Seen::New, "a failed id runs again");
    }

    #[test]
    fn dedup_forgets_the_oldest_past_capacity_and_age() {
        let t0 = Instant::now();
        let mut w = DedupWindow::new(3, Duration::from_secs(60));
        for id in ["a", "b", "c", "d"] {
            assert_eq!(w.begin(id, t0), Seen::New);
            w.finish(id, true, t0);
        }
        assert_eq!(w.done_len(), 3);
        assert_eq!(w.begin("a", t0), Seen::New, "the oldest is forgotten");
        assert_eq!(w.begin("d", t0), Seen::Done);
        let later = t0 + Duration::from_secs(61);
        assert_eq!(w.begin("d", later), Seen::New, "too old");
        assert_eq!(w.done_len(), 0);
    }

    #[test]
    fn watermark_is_the_minimum_and_never_goes_back() {
        assert_eq!(input_watermark(NO_WATERMARK, []), NO_WATERMARK);
        assert_eq!(input_watermark(NO_WATERMARK, [300, 100, 200]), 100);
        assert_eq!(input_watermark(150, [300, 100]), 150, "monotone");
        assert_eq!(input_watermark(50, [300, NO_WATERMARK]), 50, "a sender without a watermark holds it");
        assert_eq!(input_watermark(70, []), 70);
    }
}
