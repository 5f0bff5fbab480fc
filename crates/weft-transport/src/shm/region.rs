//! One ring's shared mapping: a sealed memfd mapped `MAP_SHARED` in both processes, a 4 KiB
//! control page (counters and flags as atomics) followed by the data area.
//!
//! This is the only module of the shared-memory backend that uses `unsafe`: mapping and
//! unmapping, the atomics placed in the mapping, and the copies into and out of the data area.
//! Everything it hands out is bounds-checked against the mapping, so the ring logic above it
//! is safe code that cannot reach outside the region whatever a peer writes into it.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// Size of the control page in front of the data area.
pub(super) const CONTROL_SIZE: usize = 4096;
/// "WEFTSHMR" in little-endian: marks a ring's control page.
const MAGIC: u64 = u64::from_le_bytes(*b"WEFTSHMR");
/// Layout version of the control page and the records.
pub(super) const VERSION: u64 = 1;

// Control page layout (byte offsets). Fields each side writes often sit on their own 64-byte
// line so the writer and the reader do not bounce one cache line between cores.
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_CAPACITY: usize = 16;
/// Bytes published by the writer (monotone, a multiple of 64). Written by the writer only.
const OFF_HEAD: usize = 64;
/// Set once by the writer when it is dropped.
const OFF_WRITER_CLOSED: usize = 72;
/// Bytes given back by the reader (monotone, at most `head`). Written by the reader only.
const OFF_TAIL: usize = 128;
/// Set once by the reader when it is dropped.
const OFF_READER_CLOSED: usize = 136;
/// Set by the reader before it parks waiting for data; cleared by whoever rings its bell.
const OFF_READER_WAITING: usize = 192;
/// Set by the writer before it parks waiting for space; cleared by whoever rings its bell.
const OFF_WRITER_WAITING: usize = 256;

/// A mapped ring. Both processes map the same memfd; the mapping lives until this value (and so
/// every payload lease holding it) is dropped, even after the peer has died.
pub(super) struct Region {
    base: NonNull<u8>,
    map_len: usize,
    capacity: usize,
}

// SAFETY: `Region` owns its mapping exclusively (it is unmapped only in `Drop`); everything
// reached through it is either atomics or bytes copied with explicit bounds checks, so sharing
// the pointer between threads is sound.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` only gives out atomics, bounds-checked copies and shared slices.
unsafe impl Sync for Region {}

impl Region {
    /// Creates a ring of `capacity` data bytes: memfd, size, seals (no shrinking, so a peer can
    /// never make our accesses fault with SIGBUS), mapping and an initialised control page.
    pub(super) fn create(capacity: usize) -> io::Result<(Region, OwnedFd)> {
        let len = CONTROL_SIZE
            .checked_add(capacity)
            .ok_or_else(|| io::Error::other(format!("shm ring of {capacity} bytes is too large")))?;
        let fd = rustix::fs::memfd_create("weft-shm-ring", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(|e| io::Error::new(e.kind(), format!("memfd_create for a shm ring: {e}")))?;
        rustix::fs::ftruncate(&fd, len as u64)
            .map_err(|e| io::Error::new(e.kind(), format!("sizing a shm ring to {len} bytes: {e}")))?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(|e| io::Error::new(e.kind(), format!("sealing a shm ring: {e}")))?;
        let region = Region::map(&fd, len, capacity)?;
        region.u64_at(OFF_CAPACITY).store(capacity as u64, Ordering::Relaxed);
        region.u64_at(OFF_VERSION).store(VERSION, Ordering::Relaxed);
        region.u64_at(OFF_MAGIC).store(MAGIC, Ordering::Release);
        Ok((region, fd))
    }

    /// Maps a ring a peer created and checks it: sealed against shrinking, sized as its control
    /// page says, a capacity within `max_capacity`, a fresh state. The error says what is wrong.
    pub(super) fn open(fd: &OwnedFd, max_capacity: usize) -> Result<Region, String> {
        let seals =
            rustix::fs::fcntl_get_seals(fd).map_err(|e| format!("cannot read the ring's seals (not a memfd?): {e}"))?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err("the ring is not sealed against shrinking (F_SEAL_SHRINK)".into());
        }
        let stat = rustix::fs::fstat(fd).map_err(|e| format!("fstat of the ring: {e}"))?;
        let size = u64::try_from(stat.st_size)
            .ok()
            .and_then(|s| usize::try_from(s).ok())
            .ok_or_else(|| format!("the ring's size {} is not usable", stat.st_size))?;
        let capacity = size
            .checked_sub(CONTROL_SIZE)
            .filter(|c| *c > 0)
            .ok_or_else(|| format!("the ring is {size} bytes, not larger than its control page"))?;
        check_capacity(capacity, max_capacity)?;
        let region = Region::map(fd, size, capacity).map_err(|e| e.to_string())?;
        let magic = region.u64_at(OFF_MAGIC).load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(format!("the ring's control page has magic {magic:#x}, not {MAGIC:#x}"));
        }
        let version = region.u64_at(OFF_VERSION).load(Ordering::Relaxed);
        if version != VERSION {
            return Err(format!("the ring has layout version {version}, this side speaks {VERSION}"));
        }
        let declared = region.u64_at(OFF_CAPACITY).load(Ordering::Relaxed);
        if declared != capacity as u64 {
            return Err(format!(
                "the ring's control page declares {declared} data bytes but the memfd holds {capacity}"
            ));
        }
        let (head, tail) = (region.head().load(Ordering::Acquire), region.tail().load(Ordering::Acquire));
        if head != 0 || tail != 0 {
            return Err(format!("the ring is not fresh (head {head}, tail {tail})"));
        }
        Ok(region)
    }

    fn map(fd: &OwnedFd, len: usize, capacity: usize) -> io::Result<Region> {
        // SAFETY: a fresh mapping chosen by the kernel (null hint), of a file we hold open and
        // whose size is at least `len` and sealed against shrinking (checked by both `create`
        // and `open`), so every byte of the mapping stays backed for its whole life.
        let ptr = unsafe {
            rustix::mm::mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, fd, 0)
        }
        .map_err(|e| io::Error::new(e.kind(), format!("mapping a shm ring of {len} bytes: {e}")))?;
        let base = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned a null mapping"))?;
        Ok(Region { base, map_len: len, capacity })
    }

    /// Data bytes in the ring.
    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= CONTROL_SIZE);
        // SAFETY: `off` is one of the fixed 8-aligned control-page offsets above (inside the
        // page-aligned, live mapping); every access to these words, in this process and in
        // the peer's, goes through atomics, and the reference cannot outlive `self`.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(off).cast::<u64>()) }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= CONTROL_SIZE);
        // SAFETY: as in `u64_at`, for the 4-aligned flag words.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(off).cast::<u32>()) }
    }

    pub(super) fn head(&self) -> &AtomicU64 {
        self.u64_at(OFF_HEAD)
    }
    pub(super) fn tail(&self) -> &AtomicU64 {
        self.u64_at(OFF_TAIL)
    }
    pub(super) fn writer_closed(&self) -> &AtomicU32 {
        self.u32_at(OFF_WRITER_CLOSED)
    }
    pub(super) fn reader_closed(&self) -> &AtomicU32 {
        self.u32_at(OFF_READER_CLOSED)
    }
    pub(super) fn reader_waiting(&self) -> &AtomicU32 {
        self.u32_at(OFF_READER_WAITING)
    }
    pub(super) fn writer_waiting(&self) -> &AtomicU32 {
        self.u32_at(OFF_WRITER_WAITING)
    }

    /// The data-area range `[off, off + len)`, if it lies inside the ring.
    fn range(&self, off: usize, len: usize) -> Option<usize> {
        let end = off.checked_add(len)?;
        (end <= self.capacity).then_some(CONTROL_SIZE + off)
    }

    /// Copies `parts` one after another into the data area from `off`. `false` (and nothing
    /// written) when they would not fit inside the ring.
    pub(super) fn write(&self, off: usize, parts: &[&[u8]]) -> bool {
        let total = parts.iter().try_fold(0usize, |acc, p| acc.checked_add(p.len()));
        let Some(start) = total.and_then(|t| self.range(off, t)) else {
            return false;
        };
        let mut at = start;
        for part in parts {
            // SAFETY: `range` checked that all parts together fit inside the mapping; `part`
            // is our own memory, which cannot overlap the shared mapping we write into. The
            // protocol gives this range to the writer alone (it is free: the reader released
            // it), so the peer does not read it while we write.
            unsafe {
                std::ptr::copy_nonoverlapping(part.as_ptr(), self.base.as_ptr().add(at), part.len());
            }
            at += part.len();
        }
        true
    }

    /// Reads 16 bytes (a record header) at `off`, once, with a volatile read so the value
    /// checked is the value used even if a faulty peer rewrites it meanwhile.
    pub(super) fn read_16(&self, off: usize) -> Option<[u8; 16]> {
        let start = self.range(off, 16)?;
        // SAFETY: in bounds (checked above); `[u8; 16]` has alignment 1 and no invalid values.
        Some(unsafe { std::ptr::read_volatile(self.base.as_ptr().add(start).cast::<[u8; 16]>()) })
    }

    /// The data-area bytes `[off, off + len)`, borrowed from the mapping.
    ///
    /// A correct peer does not write a published record until the reader has released it; a
    /// faulty one could change these bytes while they are borrowed. That changes the bytes a
    /// handler sees, never where we read: no length or offset is ever re-read from here.
    pub(super) fn slice(&self, off: usize, len: usize) -> Option<&[u8]> {
        let start = self.range(off, len)?;
        // SAFETY: in bounds of the live mapping (checked above), which outlives the borrow of
        // `self`; `u8` has no invalid values.
        Some(unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(start), len) })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `base`/`map_len` are exactly the mapping made in `map`; no reference into it
        // can outlive `self` (slices and atomics borrow `self`, leases hold it by `Arc`).
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.map_len) };
    }
}

/// A ring capacity both sides accept: a multiple of 4 KiB, at least 4 KiB, at most `max`.
pub(super) fn check_capacity(capacity: usize, max: usize) -> Result<(), String> {
    if capacity < 4096 || !capacity.is_multiple_of(4096) {
        return Err(format!("ring size {capacity} bytes is not a positive multiple of 4096"));
    }
    if capacity > max {
        return Err(format!("ring size {capacity} bytes exceeds the limit of {max} bytes"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_ring_opens_and_shares_memory() {
        let (a, fd) = Region::create(64 * 1024).expect("create");
        let b = Region::open(&fd, 1 << 30).expect("open");
        assert_eq!(b.capacity(), 64 * 1024);
        assert!(a.write(4096, &[b"hello ", b"world"]));
        assert_eq!(b.slice(4096, 11), Some(&b"hello world"[..]));
        a.head().store(128, Ordering::Release);
        assert_eq!(b.head().load(Ordering::Acquire), 128);
    }

    #[test]
    fn accesses_outside_the_ring_are_refused() {
        let (a, _fd) = Region::create(4096).expect("create");
        assert!(!a.write(4090, &[b"12345678"]));
        assert!(!a.write(usize::MAX, &[b"1"]));
        assert!(a.slice(4000, 97).is_none());
        assert!(a.read_16(4088).is_none());
        assert!(a.read_16(4080).is_some());
    }

    #[test]
    fn open_rejects_unsealed_wrong_sized_or_used_rings() {
        // A memfd without seals.
        let fd = rustix::fs::memfd_create("t", MemfdFlags::CLOEXEC).expect("memfd");
        rustix::fs::ftruncate(&fd, 8192).expect("truncate");
        let err = Region::open(&fd, 1 << 30).err().expect("unsealed");
        assert!(err.contains("not a memfd") || err.contains("shrinking"), "{err}");

        // Capacity above the limit.
        let (_a, fd) = Region::create(64 * 1024).expect("create");
        let err = Region::open(&fd, 8192).err().expect("too large");
        assert!(err.contains("exceeds the limit"), "{err}");

        // A ring already in use.
        let (a, fd) = Region::create(8192).expect("create");
        a.head().store(64, Ordering::Release);
        let err = Region::open(&fd, 1 << 30).err().expect("used");
        assert!(err.contains("not fresh"), "{err}");

        // A control page that lies about the capacity.
        let (a, fd) = Region::create(8192).expect("create");
        a.u64_at(OFF_CAPACITY).store(4096, Ordering::Relaxed);
        let err = Region::open(&fd, 1 << 30).err().expect("lying");
        assert!(err.contains("declares 4096"), "{err}");
    }

    #[test]
    fn capacity_rules() {
        assert!(check_capacity(4096, 1 << 20).is_ok());
        assert!(check_capacity(0, 1 << 20).is_err());
        assert!(check_capacity(5000, 1 << 20).is_err());
        assert!(check_capacity(2 << 20, 1 << 20).is_err());
    }
}
