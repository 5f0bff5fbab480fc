//! The two halves of a shared-memory link: [`ShmWriter`] fills the ring the peer reads,
//! [`ShmReader`] reads the ring the peer fills and hands payloads out as leases.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{Ordering, fence};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;

use super::link::Link;
use super::region::Region;
use crate::backend::{Frame, FrameReader, FrameWriter};

/// Records start on 64-byte boundaries (a cache line; payloads land aligned).
pub(super) const ALIGN: u64 = 64;
/// Size of a record's own header: tag, frame-header length, payload length.
const RECORD_HEADER: u64 = 16;
/// A frame: header bytes after the record header, the payload at the next 64-byte boundary.
const TAG_FRAME: u32 = u32::from_le_bytes(*b"FRM1");
/// The rest of the ring up to its end is unused; the next record is at offset 0.
const TAG_SKIP: u32 = u32::from_le_bytes(*b"SKP1");

fn pad(n: u64) -> Option<u64> {
    n.checked_add(ALIGN - 1).map(|n| n & !(ALIGN - 1))
}

/// Ring bytes a frame takes: record header and frame header padded to 64, payload padded to 64.
pub(super) fn record_size(header_len: u64, payload_len: u64) -> Option<u64> {
    pad(RECORD_HEADER.checked_add(header_len)?)?.checked_add(pad(payload_len)?)
}

/// How full a ring is and who is parked on it, as both sides see the same control page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingState {
    /// Data bytes in the ring.
    pub capacity: u64,
    /// Bytes published and not yet given back (unread records plus payloads still leased).
    pub in_use: u64,
    /// The writer is parked until the reader gives space back.
    pub writer_waiting: bool,
    /// The reader is parked until the writer publishes.
    pub reader_waiting: bool,
}

fn ring_state(region: &Region) -> RingState {
    let tail = region.tail().load(Ordering::Acquire);
    let head = region.head().load(Ordering::Acquire);
    RingState {
        capacity: region.capacity() as u64,
        in_use: head.saturating_sub(tail),
        writer_waiting: region.writer_waiting().load(Ordering::Acquire) != 0,
        reader_waiting: region.reader_waiting().load(Ordering::Acquire) != 0,
    }
}

/// A remembered error: every later call on a broken half fails the same way.
#[derive(Clone)]
struct Broken(io::ErrorKind, String);

impl Broken {
    fn error(&self) -> io::Error {
        io::Error::new(self.0, self.1.clone())
    }
}

/// The sending half of a shared-memory link.
pub struct ShmWriter {
    link: Arc<Link>,
    region: Region,
    /// Bytes published so far; this side alone writes the ring's head, so it never reads it back.
    head: u64,
    /// The last tail seen, to check the reader's counter only ever moves forward.
    tail_seen: u64,
    broken: Option<Broken>,
}

impl ShmWriter {
    pub(super) fn new(link: Arc<Link>, region: Region) -> Self {
        Self { link, region, head: 0, tail_seen: 0, broken: None }
    }

    /// The ring this writer fills.
    pub fn ring_state(&self) -> RingState {
        ring_state(&self.region)
    }

    #[cfg(test)]
    pub(super) fn region(&self) -> &Region {
        &self.region
    }

    /// Dies as a killed process would: the socket ends, no flag is set (the halves are leaked).
    #[cfg(test)]
    pub(super) fn die(self, reader: ShmReader) {
        self.link.kill();
        std::mem::forget(self);
        std::mem::forget(reader);
    }

    fn corrupt(&mut self, what: String) -> io::Error {
        let b = Broken(io::ErrorKind::InvalidData, format!("{}: {what}", self.link.name));
        self.broken = Some(b.clone());
        b.error()
    }

    /// The reader's tail, checked: monotone, not past what we published, leaving the ring
    /// holding at most its capacity.
    fn tail(&mut self) -> io::Result<u64> {
        let tail = self.region.tail().load(Ordering::Acquire);
        let cap = self.region.capacity() as u64;
        if tail < self.tail_seen || tail > self.head || self.head - tail > cap {
            return Err(self.corrupt(format!(
                "the peer's reader reported tail {tail} (previously {}, head {}, ring {cap} bytes)",
                self.tail_seen, self.head
            )));
        }
        self.tail_seen = tail;
        Ok(tail)
    }

    /// Publishes everything written up to `self.head` and wakes the reader if it is parked.
    fn publish(&self) {
        self.region.head().store(self.head, Ordering::Release);
        // Pairs with the fence in `ShmReader::park`: either the reader sees the new head, or
        // we see its waiting flag and ring.
        fence(Ordering::SeqCst);
        if self.region.reader_waiting().load(Ordering::Relaxed) != 0
            && self.region.reader_waiting().swap(0, Ordering::AcqRel) != 0
        {
            self.link.ring();
        }
    }

    fn check_peer(&self) -> io::Result<()> {
        if self.region.reader_closed().load(Ordering::Acquire) != 0 {
            return Err(self.link.error(io::ErrorKind::BrokenPipe, "the peer closed its reader"));
        }
        if self.link.peer_gone() {
            return Err(self.link.error(io::ErrorKind::BrokenPipe, "the peer is gone"));
        }
        Ok(())
    }

    /// Waits until the reader gives space back (or something else changes).
    async fn park(&mut self, needed: u64) -> io::Result<()> {
        let link = Arc::clone(&self.link);
        let notified = link.wake.space.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        self.region.writer_waiting().store(1, Ordering::Relaxed);
        // Pairs with the fence in the reader's release: either we see its new tail below, or
        // it sees our waiting flag and rings.
        fence(Ordering::SeqCst);
        let cap = self.region.capacity() as u64;
        let free = cap - (self.head - self.tail()?);
        if free < needed && self.check_peer().is_ok() {
            notified.await;
        }
        self.region.writer_waiting().store(0, Ordering::Relaxed);
        Ok(())
    }

    async fn write(&mut self, header: &[u8], payload: &[u8]) -> io::Result<()> {
        if let Some(b) = &self.broken {
            return Err(b.error());
        }
        let cap = self.region.capacity() as u64;
        let header_len = u32::try_from(header.len()).ok();
        let size = header_len.and_then(|_| record_size(header.len() as u64, payload.len() as u64));
        let size = match size {
            Some(size) if size <= cap => size,
            _ => {
                return Err(self.link.error(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "a frame of {} bytes (header {} + payload {}) does not fit the shm ring of {cap} bytes",
                        header.len() as u128 + payload.len() as u128,
                        header.len(),
                        payload.len()
                    ),
                ));
            }
        };
        loop {
            self.check_peer()?;
            let tail = self.tail()?;
            let free = cap - (self.head - tail);
            let off = self.head % cap;
            if off + size > cap {
                // Not enough room before the end: mark the rest unused and go on at offset 0.
                let rest = cap - off;
                if rest > free {
                    self.park(rest).await?;
                    continue;
                }
                let mut skip = [0u8; 16];
                skip[..4].copy_from_slice(&TAG_SKIP.to_le_bytes());
                if !self.region.write(off as usize, &[&skip]) {
                    return Err(self.corrupt(format!("skip marker at {off} outside the ring")));
                }
                self.head += rest;
                self.publish();
                continue;
            }
            if size > free {
                self.park(size).await?;
                continue;
            }
            let mut rec = [0u8; 16];
            rec[..4].copy_from_slice(&TAG_FRAME.to_le_bytes());
            rec[4..8].copy_from_slice(&(header.len() as u32).to_le_bytes());
            rec[8..].copy_from_slice(&(payload.len() as u64).to_le_bytes());
            let payload_off = pad(RECORD_HEADER + header.len() as u64).unwrap_or(u64::MAX);
            let ok = self.region.write(off as usize, &[&rec, header])
                && self.region.write((off + payload_off) as usize, &[payload]);
            if !ok {
                return Err(self.corrupt(format!("record of {size} bytes at {off} outside the ring")));
            }
            self.head += size;
            self.publish();
            return Ok(());
        }
    }
}

impl FrameWriter for ShmWriter {
    fn write_frame(&mut self, header: &[u8], payload: &Bytes) -> impl Future<Output = io::Result<()>> + Send {
        self.write(header, payload)
    }
}

impl Drop for ShmWriter {
    fn drop(&mut self) {
        self.region.writer_closed().store(1, Ordering::Release);
        fence(Ordering::SeqCst);
        self.link.ring();
    }
}

/// Records read but not yet given back, in ring order. Space returns to the writer only over
/// the released prefix, so a lease dropped early never frees space a held lease still uses.
#[derive(Debug, Default)]
pub(super) struct ReleaseQueue {
    /// Sequence number of `entries[0]`.
    base: u64,
    /// End position of each record and whether it has been released.
    entries: VecDeque<(u64, bool)>,
    /// Everything before this position is given back.
    tail: u64,
}

impl ReleaseQueue {
    /// Appends a record ending at `end`; returns its sequence number.
    pub(super) fn push(&mut self, end: u64, released: bool) -> u64 {
        self.entries.push_back((end, released));
        self.base + self.entries.len() as u64 - 1
    }

    /// Marks record `seq` released; returns the new tail if it moved.
    pub(super) fn release(&mut self, seq: u64) -> Option<u64> {
        let i = usize::try_from(seq.checked_sub(self.base)?).ok()?;
        self.entries.get_mut(i)?.1 = true;
        self.advance()
    }

    /// Moves the tail over the released prefix; returns it if it moved.
    pub(super) fn advance(&mut self) -> Option<u64> {
        let before = self.tail;
        while let Some(&(end, true)) = self.entries.front() {
            self.entries.pop_front();
            self.base += 1;
            self.tail = end;
        }
        (self.tail != before).then_some(self.tail)
    }

    pub(super) fn tail(&self) -> u64 {
        self.tail
    }
}

/// The reader's side of a ring, shared with the payload leases it hands out.
struct RxShared {
    link: Arc<Link>,
    region: Region,
    queue: Mutex<ReleaseQueue>,
}

impl RxShared {
    fn release(&self, seq: u64) {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let moved = q.release(seq);
        self.give_back(q, moved);
    }

    /// Stores a tail that moved (under the queue's lock, so concurrent releases cannot store
    /// out of order), then rings the writer if it is parked.
    fn give_back(&self, q: std::sync::MutexGuard<'_, ReleaseQueue>, moved: Option<u64>) {
        let Some(tail) = moved else { return };
        self.region.tail().store(tail, Ordering::Release);
        drop(q);
        // Pairs with the fence in `ShmWriter::park`.
        fence(Ordering::SeqCst);
        if self.region.writer_waiting().load(Ordering::Relaxed) != 0
            && self.region.writer_waiting().swap(0, Ordering::AcqRel) != 0
        {
            self.link.ring();
        }
    }
}

/// A payload in the ring: the bytes stay where the writer put them until the last clone of the
/// `Bytes` over them is dropped, and then the space goes back to the writer.
struct Lease {
    shared: Arc<RxShared>,
    seq: u64,
    off: usize,
    len: usize,
}

impl AsRef<[u8]> for Lease {
    fn as_ref(&self) -> &[u8] {
        // The range was checked against the ring when the record was read.
        self.shared.region.slice(self.off, self.len).unwrap_or(&[])
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.shared.release(self.seq);
    }
}

/// The receiving half of a shared-memory link.
pub struct ShmReader {
    shared: Arc<RxShared>,
    /// Bytes consumed so far (records read, leased or not).
    pos: u64,
    /// The last head seen, to check the writer's counter only ever moves forward.
    head_seen: u64,
    broken: Option<Broken>,
}

impl ShmReader {
    pub(super) fn new(link: Arc<Link>, region: Region) -> Self {
        let shared = RxShared { link, region, queue: Mutex::new(ReleaseQueue::default()) };
        Self { shared: Arc::new(shared), pos: 0, head_seen: 0, broken: None }
    }

    /// The ring this reader reads.
    pub fn ring_state(&self) -> RingState {
        ring_state(&self.shared.region)
    }

    #[cfg(test)]
    pub(super) fn region(&self) -> &Region {
        &self.shared.region
    }

    fn corrupt(&mut self, what: String) -> io::Error {
        let b = Broken(io::ErrorKind::InvalidData, format!("{}: {what}", self.shared.link.name));
        self.broken = Some(b.clone());
        b.error()
    }

    /// The writer's head, checked: monotone, 64-aligned, and never more than a ring ahead of
    /// what we have given back.
    fn head(&mut self) -> io::Result<u64> {
        let head = self.shared.region.head().load(Ordering::Acquire);
        let cap = self.shared.region.capacity() as u64;
        let tail = self.shared.queue.lock().unwrap_or_else(PoisonError::into_inner).tail();
        if head < self.head_seen || !head.is_multiple_of(ALIGN) || head - tail > cap {
            return Err(self.corrupt(format!(
                "the peer's writer reported head {head} (previously {}, given back up to {tail}, ring {cap} bytes)",
                self.head_seen
            )));
        }
        self.head_seen = head;
        Ok(head)
    }

    /// Appends a record to the release queue, released at once (skip markers, empty payloads).
    fn consumed(&self, end: u64) {
        let mut q = self.shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
        q.push(end, true);
        let moved = q.advance();
        self.shared.give_back(q, moved);
    }

    /// The record at `self.pos` (there is at least one published byte there).
    fn take(&mut self, head: u64) -> io::Result<Option<Frame>> {
        let cap = self.shared.region.capacity() as u64;
        let off = self.pos % cap;
        let Some(rec) = self.shared.region.read_16(off as usize) else {
            return Err(self.corrupt(format!("record header at ring offset {off} outside the ring")));
        };
        let tag = u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]);
        let header_len = u32::from_le_bytes([rec[4], rec[5], rec[6], rec[7]]) as u64;
        let payload_len = u64::from_le_bytes([rec[8], rec[9], rec[10], rec[11], rec[12], rec[13], rec[14], rec[15]]);
        match tag {
            TAG_SKIP => {
                let end = self.pos + (cap - off);
                if end > head {
                    return Err(self.corrupt(format!(
                        "skip marker at ring offset {off} runs past the published data (head {head})"
                    )));
                }
                self.pos = end;
                self.consumed(end);
                Ok(None)
            }
            TAG_FRAME => {
                let size = record_size(header_len, payload_len);
                let end = size.and_then(|s| self.pos.checked_add(s));
                let fits = size.is_some_and(|s| s <= cap - off);
                let Some(end) = end.filter(|e| fits && *e <= head) else {
                    return Err(self.corrupt(format!(
                        "record at ring offset {off} claims a header of {header_len} and a payload of {payload_len} bytes, \
                         past the ring end ({cap} bytes) or the published data (head {head})"
                    )));
                };
                let region = &self.shared.region;
                let header_off = (off + RECORD_HEADER) as usize;
                let payload_off = (off + pad(RECORD_HEADER + header_len).unwrap_or(u64::MAX)) as usize;
                let header = region.slice(header_off, header_len as usize).map(Bytes::copy_from_slice);
                let payload_ok = region.slice(payload_off, payload_len as usize).is_some();
                let Some(header) = header.filter(|_| payload_ok) else {
                    return Err(self.corrupt(format!("record at ring offset {off} outside the ring")));
                };
                self.pos = end;
                if payload_len == 0 {
                    self.consumed(end);
                    return Ok(Some(Frame { header, payload: Bytes::new() }));
                }
                let seq = self.shared.queue.lock().unwrap_or_else(PoisonError::into_inner).push(end, false);
                let lease =
                    Lease { shared: Arc::clone(&self.shared), seq, off: payload_off, len: payload_len as usize };
                Ok(Some(Frame { header, payload: Bytes::from_owner(lease) }))
            }
            other => {
                Err(self
                    .corrupt(format!("unknown record tag {other:#010x} at ring offset {off} (position {})", self.pos)))
            }
        }
    }

    /// Waits until the writer publishes (or something else changes).
    async fn park(&mut self) -> io::Result<()> {
        let link = Arc::clone(&self.shared.link);
        let notified = link.wake.data.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let region = &self.shared.region;
        region.reader_waiting().store(1, Ordering::Relaxed);
        // Pairs with the fence in `ShmWriter::publish`: either we see its new head below, or
        // it sees our waiting flag and rings.
        fence(Ordering::SeqCst);
        let closed = region.writer_closed().load(Ordering::Acquire) != 0;
        if self.head()? == self.pos && !closed && !link.peer_gone() {
            notified.await;
        }
        self.shared.region.reader_waiting().store(0, Ordering::Relaxed);
        Ok(())
    }

    async fn read(&mut self) -> io::Result<Option<Frame>> {
        if let Some(b) = &self.broken {
            return Err(b.error());
        }
        loop {
            // Flags first, then the head: a writer that closed or died published everything
            // before that, so an empty ring after these loads is final.
            let closed = self.shared.region.writer_closed().load(Ordering::Acquire) != 0;
            let gone = self.shared.link.peer_gone();
            let head = self.head()?;
            if head > self.pos {
                if let Some(frame) = self.take(head)? {
                    return Ok(Some(frame));
                }
                continue;
            }
            if closed {
                return Ok(None);
            }
            if gone {
                let e = Broken(
                    io::ErrorKind::UnexpectedEof,
                    format!("{}: the peer is gone without closing its writer", self.shared.link.name),
                );
                self.broken = Some(e.clone());
                return Err(e.error());
            }
            self.park().await?;
        }
    }
}

impl FrameReader for ShmReader {
    fn read_frame(&mut self) -> impl Future<Output = io::Result<Option<Frame>>> + Send {
        self.read()
    }
}

impl Drop for ShmReader {
    fn drop(&mut self) {
        let region = &self.shared.region;
        region.reader_closed().store(1, Ordering::Release);
        fence(Ordering::SeqCst);
        self.shared.link.ring();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn record_sizes() {
        assert_eq!(record_size(0, 0), Some(64));
        assert_eq!(record_size(48, 0), Some(64));
        assert_eq!(record_size(49, 1), Some(192));
        assert_eq!(record_size(10, 4 << 20), Some(64 + (4 << 20)));
        assert_eq!(record_size(0, u64::MAX), None);
    }

    #[test]
    fn tail_moves_only_over_the_released_prefix() {
        let mut q = ReleaseQueue::default();
        let a = q.push(64, false);
        let b = q.push(128, false);
        let c = q.push(256, false);
        assert_eq!(q.release(b), None);
        assert_eq!(q.release(c), None);
        assert_eq!(q.tail(), 0);
        assert_eq!(q.release(a), Some(256));
        assert_eq!(q.push(320, true), 3);
        assert_eq!(q.advance(), Some(320));
        // Unknown or repeated sequence numbers change nothing.
        assert_eq!(q.release(a), None);
        assert_eq!(q.release(99), None);
    }

    proptest! {
        #[test]
        fn any_release_order_gives_the_released_prefix(order in Just((0..40u64).collect::<Vec<_>>()).prop_shuffle()) {
            let mut q = ReleaseQueue::default();
            for i in 0..40u64 {
                q.push((i + 1) * 64, false);
            }
            let mut released = [false; 40];
            for seq in order {
                q.release(seq);
                released[seq as usize] = true;
                let prefix = released.iter().take_while(|r| **r).count() as u64;
                prop_assert_eq!(q.tail(), prefix * 64);
            }
        }
    }
}
