//! Owned verbs objects (device context, protection domain, registered regions, completion
//! channel and queue, queue pair) over [`super::ffi`]; each is released in `Drop`, and an `Arc`
//! to its parent keeps the parent alive until then (a QP before its CQ and PD, a region before
//! its PD, the PD before the context).
//!
//! With [`super::ffi`] this is the only code of the RDMA backend that uses `unsafe`. What it
//! hands out is safe to use: regions copy in and hand out slices only within their bounds, and
//! work requests are built here from a region and an offset that are checked against it.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rustix::fs::OFlags;
use rustix::mm::{MapFlags, ProtFlags};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::ffi::{self, IbvWc};

fn last_error(what: impl std::fmt::Display) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn errno_error(rc: i32, what: impl std::fmt::Display) -> io::Error {
    // Verbs calls return the errno value itself (positive), or -1 with errno set.
    let e = if rc > 0 { io::Error::from_raw_os_error(rc) } else { io::Error::last_os_error() };
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// The names of the RDMA devices libibverbs sees (e.g. `mlx5_0`, `rxe0`); empty when there
/// are none (or no kernel support).
pub fn device_names() -> io::Result<Vec<String>> {
    let mut n = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed below.
    let list = unsafe { ffi::ibv_get_device_list(&mut n) };
    if list.is_null() {
        let e = io::Error::last_os_error();
        // ENOSYS: no kernel support at all, which is "no devices" too.
        if e.raw_os_error() == Some(38) {
            return Ok(Vec::new());
        }
        return Err(io::Error::new(e.kind(), format!("ibv_get_device_list: {e}")));
    }
    let mut names = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds `n` device pointers.
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: `dev` is a device from the list; the name is a NUL-terminated string that
        // lives as long as the list, and is copied before the list is freed.
        let name = unsafe { ffi::ibv_get_device_name(dev) };
        if !name.is_null() {
            // SAFETY: non-null, NUL-terminated (see above).
            names.push(unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned());
        }
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { ffi::ibv_free_device_list(list) };
    Ok(names)
}

/// The port facts the backend needs.
#[derive(Clone, Copy, Debug)]
pub struct PortAttr {
    /// `enum ibv_port_state` (4 = active).
    pub state: u32,
    /// `enum ibv_mtu`.
    pub active_mtu: u32,
    /// The LID.
    pub lid: u16,
    /// 1 InfiniBand, 2 Ethernet.
    pub link_layer: u8,
    /// GID table entries.
    pub gid_table_len: u32,
}

/// An open device.
pub(crate) struct Context {
    ptr: NonNull<ffi::IbvContext>,
    name: String,
}

// SAFETY: libibverbs contexts may be used from any thread (the library and providers lock
// internally); we only pass the pointer to verbs calls.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Context {
    /// Opens the device called `name`.
    pub(crate) fn open(name: &str) -> io::Result<Arc<Context>> {
        let mut n = 0;
        // SAFETY: as in `device_names`.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(last_error("ibv_get_device_list"));
        }
        let mut opened = Err(io::Error::new(io::ErrorKind::NotFound, format!("no RDMA device called {name:?}")));
        for i in 0..n.max(0) as usize {
            // SAFETY: the list holds `n` device pointers.
            let dev = unsafe { *list.add(i) };
            if dev.is_null() {
                break;
            }
            // SAFETY: as in `device_names`.
            let dev_name = unsafe { ffi::ibv_get_device_name(dev) };
            // SAFETY: non-null names are NUL-terminated strings owned by the list.
            if dev_name.is_null() || unsafe { CStr::from_ptr(dev_name) }.to_bytes() != name.as_bytes() {
                continue;
            }
            // SAFETY: `dev` is a live device of the list; a context stays valid after the list
            // is freed (documented by libibverbs).
            let ctx = unsafe { ffi::ibv_open_device(dev) };
            opened = NonNull::new(ctx)
                .map(|ptr| Arc::new(Context { ptr, name: name.to_string() }))
                .ok_or_else(|| last_error(format!("ibv_open_device {name}")));
            break;
        }
        // SAFETY: freed once; opened contexts do not depend on it.
        unsafe { ffi::ibv_free_device_list(list) };
        opened
    }

    /// The device's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Queries a port.
    pub(crate) fn port(&self, port: u8) -> io::Result<PortAttr> {
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut attr: ffi::IbvPortAttr = unsafe { std::mem::zeroed() };
        // SAFETY: live context; `attr` is larger than the header's struct (see ffi docs).
        let rc = unsafe { ffi::ibv_query_port(self.ptr.as_ptr(), port, &mut attr) };
        if rc != 0 {
            return Err(errno_error(rc, format!("ibv_query_port {} port {port}", self.name)));
        }
        Ok(PortAttr {
            state: attr.state,
            active_mtu: attr.active_mtu,
            lid: attr.lid,
            link_layer: attr.link_layer,
            gid_table_len: attr.gid_tbl_len.max(0) as u32,
        })
    }

    /// Reads a GID table entry.
    pub(crate) fn gid(&self, port: u8, index: u32) -> io::Result<[u8; 16]> {
        let mut gid = ffi::IbvGid::default();
        // SAFETY: live context; `gid` is a valid out-pointer.
        let rc = unsafe { ffi::ibv_query_gid(self.ptr.as_ptr(), port, index as i32, &mut gid) };
        if rc != 0 {
            return Err(errno_error(rc, format!("ibv_query_gid {} port {port} index {index}", self.name)));
        }
        Ok(gid.raw)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened by us, closed once, after every child (they hold an Arc to us).
        unsafe { ffi::ibv_close_device(self.ptr.as_ptr()) };
    }
}

/// A protection domain.
pub(crate) struct Pd {
    ptr: NonNull<ffi::IbvPd>,
    ctx: Arc<Context>,
}

// SAFETY: see `Context`.
unsafe impl Send for Pd {}
// SAFETY: see `Context`.
unsafe impl Sync for Pd {}

impl Pd {
    pub(crate) fn new(ctx: &Arc<Context>) -> io::Result<Arc<Pd>> {
        // SAFETY: live context.
        let ptr = unsafe { ffi::ibv_alloc_pd(ctx.ptr.as_ptr()) };
        let ptr = NonNull::new(ptr).ok_or_else(|| last_error(format!("ibv_alloc_pd {}", ctx.name)))?;
        Ok(Arc::new(Pd { ptr, ctx: ctx.clone() }))
    }

    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated by us, freed once, after its regions and QPs (they hold an Arc).
        unsafe { ffi::ibv_dealloc_pd(self.ptr.as_ptr()) };
    }
}

/// Page-aligned anonymous memory registered with a protection domain.
///
/// Registered memory is written by the NIC (the receive ring, the control receive slots) or
/// read by it (the staging copy, the control send slots). Who touches which bytes when is the
/// link's protocol: a receive record is handed out only after its completion and is not
/// written again until released; a staging range is written only when its previous write
/// completed. Within that, this type checks every offset and length against the region.
pub(crate) struct Region {
    base: NonNull<u8>,
    len: usize,
    mr: NonNull<ffi::IbvMr>,
    _pd: Arc<Pd>,
}

// SAFETY: the region owns its mapping (unmapped in Drop only); concurrent access is ordered by
// the link's protocol as described above, and every access is bounds-checked.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// Maps `len` bytes (rounded up to pages) and registers them for local write and, with
    /// `remote_write`, for the peer's RDMA writes.
    pub(crate) fn new(pd: &Arc<Pd>, len: usize, remote_write: bool) -> io::Result<Region> {
        let map_len = len.max(1).div_ceil(4096) * 4096;
        // SAFETY: a fresh anonymous private mapping; nothing else refers to it.
        let base = unsafe {
            rustix::mm::mmap_anonymous(ptr::null_mut(), map_len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::PRIVATE)
        }
        .map_err(|e| io::Error::new(e.kind(), format!("mapping {map_len} bytes: {e}")))?;
        let Some(base) = NonNull::new(base.cast::<u8>()) else {
            return Err(io::Error::other("mmap returned a null mapping"));
        };
        let mut access = ffi::IBV_ACCESS_LOCAL_WRITE;
        if remote_write {
            access |= ffi::IBV_ACCESS_REMOTE_WRITE;
        }
        // SAFETY: live PD; the mapping is valid for `map_len` bytes and outlives the MR (the
        // MR is deregistered before the unmap in Drop).
        let mr = unsafe { ffi::ibv_reg_mr(pd.ptr.as_ptr(), base.as_ptr().cast(), map_len, access) };
        let Some(mr) = NonNull::new(mr) else {
            let e = last_error(format!(
                "ibv_reg_mr of {map_len} bytes on {} (is the locked-memory limit, ulimit -l, \
                 large enough?)",
                pd.ctx.name
            ));
            // SAFETY: mapped above, not registered, unmapped once.
            let _ = unsafe { rustix::mm::munmap(base.as_ptr().cast(), map_len) };
            return Err(e);
        };
        Ok(Region { base, len: map_len, mr, _pd: pd.clone() })
    }

    /// The region's length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The address the NIC knows the region by (its virtual address).
    pub(crate) fn addr(&self) -> u64 {
        self.base.as_ptr() as u64
    }

    /// The local key.
    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: the MR is live while `self` is.
        unsafe { self.mr.as_ref() }.lkey
    }

    /// The remote key.
    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: the MR is live while `self` is.
        unsafe { self.mr.as_ref() }.rkey
    }

    fn check(&self, offset: usize, len: usize) -> io::Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{len} bytes at offset {offset} are outside the registered region of {} \
                     bytes",
                    self.len
                ),
            ));
        }
        Ok(())
    }

    /// Copies `parts` one after the other into the region from `offset`.
    pub(crate) fn write(&self, offset: usize, parts: &[&[u8]]) -> io::Result<()> {
        let total = parts.iter().map(|p| p.len()).sum::<usize>();
        self.check(offset, total)?;
        let mut at = offset;
        for p in parts {
            // SAFETY: bounds checked above; the source is a caller's slice, which cannot
            // overlap our private mapping unless it was handed out by `slice` — and the
            // protocol never writes where a slice is live (see the type's docs).
            unsafe { ptr::copy_nonoverlapping(p.as_ptr(), self.base.as_ptr().add(at), p.len()) };
            at += p.len();
        }
        Ok(())
    }

    /// The bytes at `offset..offset + len`.
    pub(crate) fn slice(&self, offset: usize, len: usize) -> io::Result<&[u8]> {
        self.check(offset, len)?;
        // SAFETY: in bounds; the mapping lives as long as `self`; the protocol keeps the NIC
        // and `write` away from these bytes while the slice is in use (see the type's docs).
        Ok(unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(offset), len) })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: registered by us, deregistered once, before the unmap.
        unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
        // SAFETY: mapped by us with this length, unmapped once.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// A completion channel, its descriptor non-blocking.
pub(crate) struct CompChannel {
    ptr: NonNull<ffi::IbvCompChannel>,
    _ctx: Arc<Context>,
}

// SAFETY: see `Context`; the channel's descriptor is only read through ibv_get_cq_event.
unsafe impl Send for CompChannel {}
// SAFETY: as above.
unsafe impl Sync for CompChannel {}

impl CompChannel {
    pub(crate) fn new(ctx: &Arc<Context>) -> io::Result<Arc<CompChannel>> {
        // SAFETY: live context.
        let ptr = unsafe { ffi::ibv_create_comp_channel(ctx.ptr.as_ptr()) };
        let ptr = NonNull::new(ptr).ok_or_else(|| last_error(format!("ibv_create_comp_channel {}", ctx.name)))?;
        let channel = CompChannel { ptr, _ctx: ctx.clone() };
        let fd = channel.fd();
        // SAFETY: the channel's descriptor is open for as long as the channel.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let flags = rustix::fs::fcntl_getfl(borrowed)
            .map_err(|e| io::Error::new(e.kind(), format!("F_GETFL on the completion channel: {e}")))?;
        rustix::fs::fcntl_setfl(borrowed, flags | OFlags::NONBLOCK)
            .map_err(|e| io::Error::new(e.kind(), format!("F_SETFL on the completion channel: {e}")))?;
        Ok(Arc::new(channel))
    }

    /// The descriptor that becomes readable when a completion event is queued.
    fn fd(&self) -> RawFd {
        // SAFETY: the channel is live while `self` is.
        unsafe { self.ptr.as_ref() }.fd
    }

    /// Registers the channel's descriptor with the tokio reactor. The registration holds the
    /// channel, so the descriptor stays open for as long as it is registered.
    pub(crate) fn register(self: &Arc<Self>) -> io::Result<AsyncFd<ChannelFd>> {
        // SAFETY: `ChannelFd` always returns the channel's descriptor, which stays open until
        // the channel is destroyed — after the `AsyncFd` is dropped, since it holds an Arc.
        unsafe { AsyncFd::register_with_interest(ChannelFd(self.clone()), Interest::READABLE) }.map_err(|e| {
            let e: io::Error = e.into();
            io::Error::new(e.kind(), format!("registering the completion channel: {e}"))
        })
    }
}

/// A completion channel's descriptor, as tokio's reactor sees it.
pub(crate) struct ChannelFd(Arc<CompChannel>);

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.fd()
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once, after its CQ (the CQ holds an Arc to us).
        unsafe { ffi::ibv_destroy_comp_channel(self.ptr.as_ptr()) };
    }
}

/// A completion queue bound to a channel.
pub(crate) struct Cq {
    ptr: NonNull<ffi::IbvCq>,
    channel: Arc<CompChannel>,
}

// SAFETY: see `Context`. Polling is done by one task at a time (the link's driver).
unsafe impl Send for Cq {}
// SAFETY: as above.
unsafe impl Sync for Cq {}

impl Cq {
    pub(crate) fn new(ctx: &Arc<Context>, channel: &Arc<CompChannel>, entries: u32) -> io::Result<Arc<Cq>> {
        // SAFETY: live context and channel.
        let ptr =
            unsafe { ffi::ibv_create_cq(ctx.ptr.as_ptr(), entries as i32, ptr::null_mut(), channel.ptr.as_ptr(), 0) };
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| last_error(format!("ibv_create_cq of {entries} entries on {}", ctx.name)))?;
        Ok(Arc::new(Cq { ptr, channel: channel.clone() }))
    }

    /// The channel this CQ reports to.
    pub(crate) fn channel(&self) -> &Arc<CompChannel> {
        &self.channel
    }

    /// Asks for an event on the next completion.
    pub(crate) fn arm(&self) -> io::Result<()> {
        // SAFETY: live CQ.
        let rc = unsafe { ffi::req_notify_cq(self.ptr.as_ptr(), 0) };
        if rc != 0 {
            return Err(errno_error(rc, "ibv_req_notify_cq"));
        }
        Ok(())
    }

    /// Takes one event from the channel and acknowledges it: `Ok(true)` if there was one,
    /// `Ok(false)` when none is queued (the descriptor is non-blocking).
    pub(crate) fn take_event(&self) -> io::Result<bool> {
        let mut cq = ptr::null_mut();
        let mut cq_ctx = ptr::null_mut();
        // SAFETY: live channel; valid out-pointers.
        let rc = unsafe { ffi::ibv_get_cq_event(self.channel.ptr.as_ptr(), &mut cq, &mut cq_ctx) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                return Ok(false);
            }
            return Err(io::Error::new(e.kind(), format!("ibv_get_cq_event: {e}")));
        }
        if cq != self.ptr.as_ptr() {
            return Err(io::Error::other("a completion event for a CQ that is not ours"));
        }
        // SAFETY: `cq` is our live CQ, which reported exactly this one event.
        unsafe { ffi::ibv_ack_cq_events(cq, 1) };
        Ok(true)
    }

    /// Polls up to `out.len()` completions into `out`; returns how many.
    pub(crate) fn poll(&self, out: &mut [IbvWc]) -> io::Result<usize> {
        let n = out.len().min(i32::MAX as usize) as i32;
        // SAFETY: live CQ; `out` has room for `n` entries.
        let got = unsafe { ffi::poll_cq(self.ptr.as_ptr(), n, out.as_mut_ptr()) };
        if got < 0 {
            return Err(io::Error::other(format!("ibv_poll_cq failed ({got})")));
        }
        Ok(got as usize)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once, after its QP (the QP holds an Arc to us);
        // every event taken was acknowledged in `take_event`.
        unsafe { ffi::ibv_destroy_cq(self.ptr.as_ptr()) };
    }
}

/// The text libibverbs gives for a completion status.
pub(crate) fn wc_status_str(status: u32) -> String {
    // SAFETY: returns a static string for any value ("unknown" for unknown ones).
    let s = unsafe { ffi::ibv_wc_status_str(status) };
    if s.is_null() {
        return format!("status {status}");
    }
    // SAFETY: non-null static NUL-terminated string.
    let text = unsafe { CStr::from_ptr(s) }.to_string_lossy();
    format!("{text} ({status})")
}

/// Where to reach the peer's QP.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerPath {
    pub qpn: u32,
    pub psn: u32,
    pub mtu: u32,
    pub lid: u16,
    pub gid: [u8; 16],
    /// Route by GID (RoCE): the local GID index to send from.
    pub global: Option<u8>,
}

/// A reliable-connected queue pair.
pub(crate) struct Qp {
    ptr: NonNull<ffi::IbvQp>,
    _pd: Arc<Pd>,
    _cq: Arc<Cq>,
}

// SAFETY: see `Context`; posting to a QP from several threads is allowed by libibverbs (the
// providers lock their queues).
unsafe impl Send for Qp {}
// SAFETY: as above.
unsafe impl Sync for Qp {}

impl Qp {
    /// Creates an RC QP on `cq` (sends and receives) with these queue depths.
    pub(crate) fn new(pd: &Arc<Pd>, cq: &Arc<Cq>, send_wr: u32, recv_wr: u32) -> io::Result<Qp> {
        let mut init = ffi::IbvQpInitAttr {
            qp_context: ptr::null_mut(),
            send_cq: cq.ptr.as_ptr(),
            recv_cq: cq.ptr.as_ptr(),
            srq: ptr::null_mut(),
            cap: ffi::IbvQpCap {
                max_send_wr: send_wr,
                max_recv_wr: recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: live PD and CQ; `init` is a valid attribute struct.
        let ptr = unsafe { ffi::ibv_create_qp(pd.ptr.as_ptr(), &mut init) };
        let ptr = NonNull::new(ptr).ok_or_else(|| {
            last_error(format!("ibv_create_qp (RC, {send_wr} send / {recv_wr} receive entries) on {}", pd.ctx.name))
        })?;
        Ok(Qp { ptr, _pd: pd.clone(), _cq: cq.clone() })
    }

    /// The QP number.
    pub(crate) fn qpn(&self) -> u32 {
        // SAFETY: live QP.
        unsafe { self.ptr.as_ref() }.qp_num
    }

    fn modify(&self, attr: &mut ffi::IbvQpAttr, mask: i32, what: &str) -> io::Result<()> {
        // SAFETY: live QP; `attr` is a valid attribute struct.
        let rc = unsafe { ffi::ibv_modify_qp(self.ptr.as_ptr(), attr, mask) };
        if rc != 0 {
            return Err(errno_error(rc, format!("moving the QP to {what}")));
        }
        Ok(())
    }

    /// RESET → INIT on `port`, allowing remote writes.
    pub(crate) fn to_init(&self, port: u8) -> io::Result<()> {
        let mut a = ffi::IbvQpAttr {
            qp_state: ffi::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: port,
            qp_access_flags: (ffi::IBV_ACCESS_LOCAL_WRITE | ffi::IBV_ACCESS_REMOTE_WRITE) as u32,
            ..Default::default()
        };
        self.modify(
            &mut a,
            ffi::IBV_QP_STATE | ffi::IBV_QP_PKEY_INDEX | ffi::IBV_QP_PORT | ffi::IBV_QP_ACCESS_FLAGS,
            "INIT",
        )
    }

    /// INIT → RTR towards the peer.
    pub(crate) fn to_rtr(&self, port: u8, peer: &PeerPath) -> io::Result<()> {
        let mut a = ffi::IbvQpAttr {
            qp_state: ffi::IBV_QPS_RTR,
            path_mtu: peer.mtu,
            dest_qp_num: peer.qpn,
            rq_psn: peer.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ..Default::default()
        };
        a.ah_attr.dlid = peer.lid;
        a.ah_attr.port_num = port;
        if let Some(sgid_index) = peer.global {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = ffi::IbvGid { raw: peer.gid };
            a.ah_attr.grh.sgid_index = sgid_index;
            a.ah_attr.grh.hop_limit = 64;
        }
        self.modify(
            &mut a,
            ffi::IBV_QP_STATE
                | ffi::IBV_QP_AV
                | ffi::IBV_QP_PATH_MTU
                | ffi::IBV_QP_DEST_QPN
                | ffi::IBV_QP_RQ_PSN
                | ffi::IBV_QP_MAX_DEST_RD_ATOMIC
                | ffi::IBV_QP_MIN_RNR_TIMER,
            "RTR",
        )
    }

    /// RTR → RTS, sending from `psn`. Retries: 7 transport retries with a ~67 ms timeout, and
    /// unlimited receiver-not-ready retries (7), so a momentarily slow peer is never an error.
    pub(crate) fn to_rts(&self, psn: u32) -> io::Result<()> {
        let mut a = ffi::IbvQpAttr {
            qp_state: ffi::IBV_QPS_RTS,
            sq_psn: psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..Default::default()
        };
        self.modify(
            &mut a,
            ffi::IBV_QP_STATE
                | ffi::IBV_QP_SQ_PSN
                | ffi::IBV_QP_TIMEOUT
                | ffi::IBV_QP_RETRY_CNT
                | ffi::IBV_QP_RNR_RETRY
                | ffi::IBV_QP_MAX_QP_RD_ATOMIC,
            "RTS",
        )
    }

    fn post(&self, wr: &mut ffi::IbvSendWr, what: &str) -> io::Result<()> {
        let mut bad = ptr::null_mut();
        // SAFETY: live QP; `wr` is a single valid request whose scatter entry points into a
        // registered region that outlives the QP (the link holds both); `bad` is an
        // out-pointer.
        let rc = unsafe { ffi::post_send(self.ptr.as_ptr(), wr, &mut bad) };
        if rc != 0 {
            return Err(errno_error(rc, format!("ibv_post_send ({what})")));
        }
        Ok(())
    }

    /// Posts a signalled RDMA WRITE with immediate data of `len` bytes from `local` at
    /// `offset` to `remote_addr` (key `rkey`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn post_write_imm(
        &self,
        wr_id: u64,
        local: &Region,
        offset: usize,
        len: usize,
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    ) -> io::Result<()> {
        local.check(offset, len)?;
        let mut sge = ffi::IbvSge { addr: local.addr() + offset as u64, length: len as u32, lkey: local.lkey() };
        let mut wr = ffi::IbvSendWr::zeroed();
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ffi::IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.send_flags = ffi::IBV_SEND_SIGNALED;
        wr.imm_data = imm.to_be();
        wr.remote_addr = remote_addr;
        wr.rkey = rkey;
        self.post(&mut wr, "RDMA write with immediate")
    }

    /// Posts a signalled SEND of `len` bytes from `local` at `offset`.
    pub(crate) fn post_send(&self, wr_id: u64, local: &Region, offset: usize, len: usize) -> io::Result<()> {
        local.check(offset, len)?;
        let mut sge = ffi::IbvSge { addr: local.addr() + offset as u64, length: len as u32, lkey: local.lkey() };
        let mut wr = ffi::IbvSendWr::zeroed();
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ffi::IBV_WR_SEND;
        wr.send_flags = ffi::IBV_SEND_SIGNALED;
        self.post(&mut wr, "send")
    }

    /// Posts a receive into `local` at `offset` (`len` bytes): a SEND lands there; an RDMA
    /// WRITE with immediate consumes it without touching the buffer.
    pub(crate) fn post_recv(&self, wr_id: u64, local: &Region, offset: usize, len: usize) -> io::Result<()> {
        local.check(offset, len)?;
        let mut sge = ffi::IbvSge { addr: local.addr() + offset as u64, length: len as u32, lkey: local.lkey() };
        let mut wr = ffi::IbvRecvWr { wr_id, next: ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        let mut bad = ptr::null_mut();
        // SAFETY: live QP; `wr` is a single valid request into a registered region that
        // outlives the QP (the link holds both).
        let rc = unsafe { ffi::post_recv(self.ptr.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(errno_error(rc, "ibv_post_recv"));
        }
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by us, destroyed once, before its CQ and PD (we hold Arcs to them).
        unsafe { ffi::ibv_destroy_qp(self.ptr.as_ptr()) };
    }
}
