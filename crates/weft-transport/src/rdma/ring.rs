//! Ring and credit accounting of an RDMA link, without any verbs: where the next record goes
//! in the peer's receive ring, when the sender must wait, and which space the receiver can give
//! back. Positions are monotone byte counts (never wrap); the offset in the ring is the
//! position modulo the capacity. The link's driver feeds these from completions and credit
//! messages; everything here is plain arithmetic, tested on its own.

use std::collections::VecDeque;
use std::fmt;

/// Records start and end on this boundary.
pub const RECORD_ALIGN: u64 = 64;
/// The record header before the frame header: header length (`u32`), magic (`u32`), payload
/// length (`u64`), little-endian.
pub const RECORD_HEADER: usize = 16;
/// The record header's magic, `b"WRec"` read as a little-endian `u32`.
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"WRec");
/// The smallest ring accepted.
pub const MIN_RING: u64 = 4096;
/// The largest ring: the record offset travels in 32 bits of immediate data, in units of
/// [`RECORD_ALIGN`].
pub const MAX_RING: u64 = (u32::MAX as u64 + 1) * RECORD_ALIGN;

fn align(n: u64) -> Option<u64> {
    n.checked_add(RECORD_ALIGN - 1).map(|n| n & !(RECORD_ALIGN - 1))
}

/// The bytes a frame takes in the ring: the record header and frame header padded to
/// [`RECORD_ALIGN`], then the payload padded likewise. `None` on overflow.
pub fn record_len(header: usize, payload: usize) -> Option<u64> {
    let head = align((RECORD_HEADER as u64).checked_add(header as u64)?)?;
    head.checked_add(align(payload as u64)?)
}

/// Where the payload starts inside a record whose frame header is `header` bytes.
pub fn payload_offset(header: usize) -> u64 {
    // RECORD_HEADER + header is at most a few MiB: no overflow.
    (RECORD_HEADER as u64 + header as u64).div_ceil(RECORD_ALIGN) * RECORD_ALIGN
}

/// The 16-byte record header.
pub fn encode_record_header(header: usize, payload: usize) -> [u8; RECORD_HEADER] {
    let mut out = [0u8; RECORD_HEADER];
    out[0..4].copy_from_slice(&(header as u32).to_le_bytes());
    out[4..8].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    out[8..16].copy_from_slice(&(payload as u64).to_le_bytes());
    out
}

/// Reads a record header: (frame header length, payload length).
pub fn decode_record_header(bytes: &[u8]) -> Result<(usize, u64), String> {
    let Some(b) = bytes.get(..RECORD_HEADER) else {
        return Err(format!("record header needs {RECORD_HEADER} bytes, {} available", bytes.len()));
    };
    let word = |r: std::ops::Range<usize>| b[r].iter().rev().fold(0u64, |a, &x| a << 8 | x as u64);
    let header = word(0..4) as usize;
    let magic = word(4..8) as u32;
    let payload = word(8..16);
    if magic != RECORD_MAGIC {
        return Err(format!("record magic {magic:#010x}, expected {RECORD_MAGIC:#010x}"));
    }
    Ok((header, payload))
}

/// Where a record goes in the peer's ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Its start position (after skipping the end of the ring when it did not fit there).
    pub pos: u64,
    /// Its offset in the ring.
    pub offset: u64,
    /// Its length.
    pub len: u64,
}

impl Placement {
    /// The position after it.
    pub fn end(&self) -> u64 {
        self.pos + self.len
    }
}

/// Why a record cannot be placed now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blocked {
    /// The record is larger than the ring: it never fits.
    TooLarge { len: u64, capacity: u64 },
    /// Not enough space has been given back yet.
    Space { need: u64, free: u64 },
    /// The peer allows no more records in flight until it releases some.
    Records { in_flight: u64, limit: u64 },
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Blocked::TooLarge { len, capacity } => {
                write!(f, "a record of {len} bytes does not fit in the peer's ring of {capacity} bytes")
            }
            Blocked::Space { need, free } => {
                write!(f, "needs {need} bytes of the peer's ring, {free} free")
            }
            Blocked::Records { in_flight, limit } => {
                write!(f, "{in_flight} records in flight, the peer allows {limit}")
            }
        }
    }
}

/// The sender's view of the peer's receive ring. Space is free again once the peer gave it
/// back (a credit) *and* our own write from the staging copy at the same offset completed, so
/// the staging buffer (same size, same offsets) needs no accounting of its own.
#[derive(Clone, Debug)]
pub struct SendRing {
    capacity: u64,
    max_records: u64,
    head: u64,
    credited: u64,
    completed: u64,
    sent: u64,
    released: u64,
}

impl SendRing {
    /// A ring of `capacity` bytes (a multiple of [`RECORD_ALIGN`]) that allows `max_records`
    /// records in flight.
    pub fn new(capacity: u64, max_records: u64) -> Self {
        Self { capacity, max_records, head: 0, credited: 0, completed: 0, sent: 0, released: 0 }
    }

    /// The ring's capacity.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes written (the next record's position before any skip).
    pub fn head(&self) -> u64 {
        self.head
    }

    /// Records written.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Where a record of `len` bytes would go now, or why it cannot.
    pub fn place(&self, len: u64) -> Result<Placement, Blocked> {
        if len > self.capacity {
            return Err(Blocked::TooLarge { len, capacity: self.capacity });
        }
        let in_flight = self.sent - self.released;
        if in_flight >= self.max_records {
            return Err(Blocked::Records { in_flight, limit: self.max_records });
        }
        let offset = self.head % self.capacity;
        let (pos, offset) =
            if offset + len > self.capacity { (self.head + (self.capacity - offset), 0) } else { (self.head, offset) };
        let tail = self.credited.min(self.completed);
        let need = pos + len - tail;
        if need > self.capacity {
            return Err(Blocked::Space { need: pos + len - self.head, free: self.capacity - (self.head - tail) });
        }
        Ok(Placement { pos, offset, len })
    }

    /// Takes the placement [`place`](Self::place) returned.
    pub fn commit(&mut self, p: &Placement) {
        self.head = p.end();
        self.sent += 1;
    }

    /// The peer gave back its ring up to `tail` and released `released` records in all.
    pub fn credit(&mut self, tail: u64, released: u64) -> Result<(), String> {
        if tail < self.credited || tail > self.head {
            return Err(format!(
                "credit to position {tail}, outside [{}, {}] (given back, written)",
                self.credited, self.head
            ));
        }
        if released < self.released || released > self.sent {
            return Err(format!(
                "credit for {released} records, outside [{}, {}] (released, sent)",
                self.released, self.sent
            ));
        }
        self.credited = tail;
        self.released = released;
        Ok(())
    }

    /// Our write of the record ending at `end` completed.
    pub fn completed(&mut self, end: u64) -> Result<(), String> {
        if end < self.completed || end > self.head {
            return Err(format!(
                "completion up to {end}, outside [{}, {}] (completed, written)",
                self.completed, self.head
            ));
        }
        self.completed = end;
        Ok(())
    }

    /// Whether every write posted has completed.
    pub fn all_completed(&self) -> bool {
        self.completed == self.head
    }
}

/// A record that arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// Its number on this link, from 0; [`RecvRing::release`] takes it.
    pub index: u64,
    /// Its position.
    pub pos: u64,
    /// Its offset in the ring.
    pub offset: u64,
}

/// The receiver's view of its own ring: records arrive in order, are released in any order
/// (a payload handed out is dropped whenever its user is done), and space is given back up to
/// the first record still held.
#[derive(Clone, Debug)]
pub struct RecvRing {
    capacity: u64,
    max_records: u64,
    arrived: u64,
    tail: u64,
    /// End position and released flag of each record not yet given back, oldest first.
    held: VecDeque<(u64, bool)>,
    /// The index of `held`'s first entry, which is also the number of records given back.
    first: u64,
    reported: (u64, u64),
}

impl RecvRing {
    /// A ring of `capacity` bytes that allows the peer `max_records` records in flight.
    pub fn new(capacity: u64, max_records: u64) -> Self {
        Self { capacity, max_records, arrived: 0, tail: 0, held: VecDeque::new(), first: 0, reported: (0, 0) }
    }

    /// Records that arrived in all.
    pub fn arrived_records(&self) -> u64 {
        self.first + self.held.len() as u64
    }

    /// Records arrived and not yet given back.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// A record of `len` bytes arrived at ring offset `offset` (from the immediate data).
    /// Checks it is where the sender's rules put it and within the space we gave.
    pub fn arrive(&mut self, offset: u64, len: u64) -> Result<Arrival, String> {
        let expected = self.arrived % self.capacity;
        if len == 0 || !len.is_multiple_of(RECORD_ALIGN) || !offset.is_multiple_of(RECORD_ALIGN) {
            return Err(format!("record at offset {offset} of {len} bytes: not aligned to {RECORD_ALIGN}"));
        }
        if offset.checked_add(len).is_none_or(|e| e > self.capacity) {
            return Err(format!(
                "record at offset {offset} of {len} bytes overruns the ring of {} bytes",
                self.capacity
            ));
        }
        let pos = if offset == expected {
            self.arrived
        } else if offset == 0 && expected + len > self.capacity {
            self.arrived + (self.capacity - expected)
        } else {
            return Err(format!("record at offset {offset}, expected {expected} (or 0 after a skip)"));
        };
        if pos + len - self.tail > self.capacity {
            return Err(format!(
                "record at position {pos} of {len} bytes: the peer wrote past the space given \
                 back (up to {})",
                self.tail + self.capacity
            ));
        }
        if self.held.len() as u64 >= self.max_records {
            return Err(format!("the peer has more than {} records in flight", self.max_records));
        }
        let index = self.arrived_records();
        self.held.push_back((pos + len, false));
        self.arrived = pos + len;
        Ok(Arrival { index, pos, offset })
    }

    /// Releases record `index`; the space is given back once all records before it are too.
    pub fn release(&mut self, index: u64) -> Result<(), String> {
        let slot = index.checked_sub(self.first).and_then(|i| self.held.get_mut(i as usize));
        match slot {
            Some((_, released)) if !*released => *released = true,
            _ => return Err(format!("record {index} is not held")),
        }
        while let Some(&(end, true)) = self.held.front() {
            self.tail = end;
            self.held.pop_front();
            self.first += 1;
        }
        Ok(())
    }

    /// What to tell the sender, when it has not been told yet: (space given back up to this
    /// position, records given back).
    pub fn credit_due(&self) -> Option<(u64, u64)> {
        let now = (self.tail, self.first);
        (now != self.reported).then_some(now)
    }

    /// The sender was told `credit`.
    pub fn reported(&mut self, credit: (u64, u64)) {
        self.reported = credit;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_lengths_are_aligned_and_overflow_is_none() {
        assert_eq!(record_len(0, 0), Some(64));
        assert_eq!(record_len(48, 0), Some(64));
        assert_eq!(record_len(49, 1), Some(192));
        assert_eq!(record_len(10, 4096), Some(64 + 4096));
        assert_eq!(payload_offset(48), 64);
        assert_eq!(payload_offset(49), 128);
        assert_eq!(record_len(0, usize::MAX), None);
    }

    #[test]
    fn record_header_round_trips_and_bad_magic_is_named() {
        let h = encode_record_header(300, 5_000_000);
        assert_eq!(decode_record_header(&h), Ok((300, 5_000_000)));
        let mut bad = h;
        bad[4] ^= 1;
        let err = decode_record_header(&bad).expect_err("bad magic");
        assert!(err.contains("magic"), "{err}");
        assert!(decode_record_header(&h[..8]).is_err());
    }

    #[test]
    fn sender_waits_for_both_credit_and_completion() {
        let mut s = SendRing::new(1024, 100);
        for _ in 0..4 {
            let p = s.place(256).expect("room");
            s.commit(&p);
        }
        assert_eq!(s.place(64), Err(Blocked::Space { need: 64, free: 0 }));
        // Credit without completion frees nothing: the staging copy may still be read.
        s.credit(256, 1).expect("credit");
        assert!(matches!(s.place(64), Err(Blocked::Space { .. })));
        s.completed(512).expect("completed");
        let p = s.place(256).expect("room after both");
        assert_eq!((p.pos, p.offset), (1024, 0));
    }

    #[test]
    fn sender_skips_the_end_of_the_ring_when_a_record_does_not_fit() {
        let mut s = SendRing::new(1024, 100);
        let p = s.place(832).expect("room");
        s.commit(&p);
        s.credit(832, 1).expect("credit");
        s.completed(832).expect("completed");
        // 192 bytes left before the end; a 256-byte record starts at the next lap.
        let p = s.place(256).expect("room");
        assert_eq!(p, Placement { pos: 1024, offset: 0, len: 256 });
        s.commit(&p);
        assert_eq!(s.head(), 1280);
        // ...and a 128-byte one would have fitted at the end.
        let mut t = SendRing::new(1024, 100);
        let p = t.place(832).expect("room");
        t.commit(&p);
        t.credit(832, 1).expect("credit");
        t.completed(832).expect("completed");
        assert_eq!(t.place(128).map(|p| p.offset), Ok(832));
    }

    #[test]
    fn sender_limits_records_in_flight_and_refuses_oversized_records() {
        let mut s = SendRing::new(1 << 20, 2);
        for _ in 0..2 {
            let p = s.place(64).expect("room");
            s.commit(&p);
        }
        assert_eq!(s.place(64), Err(Blocked::Records { in_flight: 2, limit: 2 }));
        s.credit(64, 1).expect("credit");
        assert!(s.place(64).is_ok());
        assert!(matches!(s.place((1 << 20) + 64), Err(Blocked::TooLarge { .. })));
    }

    #[test]
    fn credits_and_completions_outside_what_was_written_are_errors() {
        let mut s = SendRing::new(1024, 10);
        let p = s.place(128).expect("room");
        s.commit(&p);
        assert!(s.credit(256, 1).is_err(), "past the head");
        assert!(s.credit(128, 2).is_err(), "more records than sent");
        s.credit(128, 1).expect("credit");
        assert!(s.credit(64, 1).is_err(), "going back");
        assert!(s.completed(192).is_err());
        s.completed(128).expect("completed");
        assert!(s.all_completed());
    }

    #[test]
    fn receiver_gives_back_space_only_up_to_the_first_held_record() {
        let mut r = RecvRing::new(1024, 10);
        let a = r.arrive(0, 128).expect("a");
        let b = r.arrive(128, 64).expect("b");
        let c = r.arrive(192, 256).expect("c");
        assert_eq!((a.index, b.index, c.index), (0, 1, 2));
        assert_eq!(r.credit_due(), None);
        r.release(b.index).expect("release b");
        assert_eq!(r.credit_due(), None, "a still held");
        r.release(a.index).expect("release a");
        assert_eq!(r.credit_due(), Some((192, 2)));
        r.reported((192, 2));
        assert_eq!(r.credit_due(), None);
        assert!(r.release(a.index).is_err(), "double release");
        r.release(c.index).expect("release c");
        assert_eq!(r.credit_due(), Some((448, 3)));
        assert_eq!(r.held(), 0);
    }

    #[test]
    fn receiver_follows_the_senders_skip_and_rejects_anything_else() {
        let mut r = RecvRing::new(1024, 10);
        let a = r.arrive(0, 832).expect("a");
        r.release(a.index).expect("release");
        // A 256-byte record cannot fit in the last 192 bytes: the sender skipped to 0.
        let b = r.arrive(0, 256).expect("b after skip");
        assert_eq!(b.pos, 1024);
        r.release(b.index).expect("release");
        assert_eq!(r.credit_due(), Some((1280, 2)));

        let mut r = RecvRing::new(1024, 10);
        r.arrive(0, 832).expect("a");
        assert!(r.arrive(0, 128).is_err(), "128 bytes fit at the end: no skip");
        assert!(r.arrive(64, 64).is_err(), "wrong offset");
        assert!(r.arrive(832, 256).is_err(), "overruns the ring");
        assert!(r.arrive(832, 100).is_err(), "unaligned");
    }

    #[test]
    fn receiver_rejects_a_sender_that_ignores_credits() {
        let mut r = RecvRing::new(1024, 10);
        r.arrive(0, 512).expect("a");
        r.arrive(512, 512).expect("b");
        let err = r.arrive(0, 64).expect_err("nothing given back");
        assert!(err.contains("past the space"), "{err}");
        let mut r = RecvRing::new(1 << 20, 2);
        r.arrive(0, 64).expect("1");
        r.arrive(64, 64).expect("2");
        let err = r.arrive(128, 64).expect_err("third record");
        assert!(err.contains("records in flight"), "{err}");
    }

    /// A sender and a receiver driven through many laps with random sizes and release orders:
    /// every arrival is accepted where the sender placed it, and all space comes back.
    #[test]
    fn sender_and_receiver_agree_over_many_laps() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(16);
        let cap = 8192;
        let mut s = SendRing::new(cap, 16);
        let mut r = RecvRing::new(cap, 16);
        let mut held: Vec<u64> = Vec::new();
        let mut written = 0u64;
        for _ in 0..20_000 {
            let len = record_len(rng.random_range(0..100), rng.random_range(0..3000)).expect("len");
            match s.place(len) {
                Ok(p) => {
                    s.commit(&p);
                    s.completed(p.end()).expect("completed");
                    let a = r.arrive(p.offset, p.len).expect("arrival");
                    assert_eq!(a.pos, p.pos);
                    held.push(a.index);
                    written += 1;
                }
                Err(Blocked::TooLarge { .. }) => unreachable!("len < cap"),
                Err(_) => {
                    // Release a random held record and pass the credit on.
                    assert!(!held.is_empty(), "blocked with nothing held");
                    let i = rng.random_range(0..held.len());
                    r.release(held.swap_remove(i)).expect("release");
                    if let Some(c) = r.credit_due() {
                        s.credit(c.0, c.1).expect("credit");
                        r.reported(c);
                    }
                }
            }
        }
        for i in held.drain(..) {
            r.release(i).expect("release");
        }
        let c = r.credit_due().expect("final credit");
        s.credit(c.0, c.1).expect("credit");
        assert_eq!(c.0, s.head());
        assert_eq!(c.1, written);
        assert!(written > 1000, "only {written} records written");
    }
}
