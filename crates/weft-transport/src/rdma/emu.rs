//! Unit tests only: an in-process stand-in for libibverbs, so the whole backend above the C
//! API (verbs wrappers, link setup, the driver, credits, close) runs here, where there is no
//! RDMA device. In test builds [`super::ffi`] re-exports these functions instead of linking
//! libibverbs; the calls made through the context's ops table (`post_send`, `post_recv`,
//! `poll_cq`, `req_notify_cq`) go through an ops table this module fills, exactly as a
//! provider's would be used.
//!
//! One device, `emu0`, port 1, Ethernet link layer, its GID table holding a link-local GID and
//! `::ffff:127.0.0.1`. Queue pairs of the process find each other by QP number. It checks what
//! a real RC QP would refuse: state transitions with their required attribute masks, a GRH on
//! RoCE, writes only within a registered region that allows remote writes and with its rkey,
//! sends no longer than the receive buffer; a message waits (as receiver-not-ready retries
//! would) until the target has a receive posted and is at least RTR; the sender's completion
//! is produced when the message is delivered. A write to a destroyed QP completes with
//! "transport retry counter exceeded", as it would after the retries. Not emulated: packet
//! loss, MTU, PSNs, timing.
#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::ptr;
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::ffi::*;

const EINVAL: c_int = 22;
const RETRY_EXC_ERR: u32 = 12;
const WC_SEND: u32 = 0;
const WC_RDMA_WRITE: u32 = 1;

struct Incoming {
    opcode: u32,
    data: Vec<u8>,
    remote_addr: u64,
    rkey: u32,
    imm: u32,
    from_qpn: u32,
    wr_id: u64,
    signaled: bool,
}

struct QpState {
    state: u32,
    dest: u32,
    global: bool,
    send_cq: usize,
    recv_cq: usize,
    recvs: VecDeque<(u64, u64, u32)>,
    pending: VecDeque<Incoming>,
}

struct CqState {
    queue: VecDeque<IbvWc>,
    armed: bool,
    channel: usize,
}

#[derive(Default)]
struct World {
    next_qpn: u32,
    next_key: u32,
    mrs: HashMap<u32, (u64, u64, bool)>,
    cqs: HashMap<usize, CqState>,
    qps: HashMap<u32, QpState>,
}

fn world() -> MutexGuard<'static, World> {
    static WORLD: OnceLock<Mutex<World>> = OnceLock::new();
    WORLD
        .get_or_init(|| Mutex::new(World { next_qpn: 0x100, next_key: 0x1000, ..Default::default() }))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

#[repr(C)]
struct EmuPd {
    context: *mut IbvContext,
}

#[repr(C)]
struct EmuChannel {
    ch: IbvCompChannel,
    reader: UnixStream,
    writer: UnixStream,
    cq: usize,
}

#[repr(C)]
struct EmuCq {
    cq: IbvCq,
    channel: *mut EmuChannel,
}

impl World {
    fn push(&mut self, cq: usize, wc: IbvWc) {
        let Some(c) = self.cqs.get_mut(&cq) else { return };
        c.queue.push_back(wc);
        if c.armed && c.channel != 0 {
            c.armed = false;
            // SAFETY: the channel outlives its CQ (the backend destroys the CQ first).
            let ch = unsafe { &*(c.channel as *const EmuChannel) };
            let _ = (&ch.writer).write(&[1]);
        }
    }

    /// Delivers what waits for `qpn` while it has receives.
    fn deliver(&mut self, qpn: u32) {
        loop {
            let Some(q) = self.qps.get_mut(&qpn) else { return };
            if q.state < IBV_QPS_RTR || q.recvs.is_empty() || q.pending.is_empty() {
                return;
            }
            let (Some(m), Some((recv_id, addr, cap))) = (q.pending.pop_front(), q.recvs.pop_front()) else {
                return;
            };
            let recv_cq = q.recv_cq;
            let mut wc = IbvWc { wr_id: recv_id, byte_len: m.data.len() as u32, qp_num: qpn, ..Default::default() };
            let mut status = IBV_WC_SUCCESS;
            if m.opcode == IBV_WR_RDMA_WRITE_WITH_IMM {
                let ok = self.mrs.get(&m.rkey).is_some_and(|&(base, len, remote)| {
                    remote && m.remote_addr >= base && m.remote_addr + m.data.len() as u64 <= base + len
                });
                if ok {
                    // SAFETY: inside a registered region (checked above), which stays mapped
                    // while registered.
                    unsafe { ptr::copy_nonoverlapping(m.data.as_ptr(), m.remote_addr as *mut u8, m.data.len()) };
                    wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
                    wc.imm_data = m.imm;
                    wc.wc_flags = IBV_WC_WITH_IMM;
                } else {
                    status = 10; // IBV_WC_REM_ACCESS_ERR
                }
            } else if m.data.len() <= cap as usize {
                // SAFETY: the receive buffer was registered and posted with `cap` bytes.
                unsafe { ptr::copy_nonoverlapping(m.data.as_ptr(), addr as *mut u8, m.data.len()) };
                wc.opcode = IBV_WC_RECV;
            } else {
                status = 1; // IBV_WC_LOC_LEN_ERR at the receiver
            }
            wc.status = status;
            self.push(recv_cq, wc);
            if let Some(from) = self.qps.get(&m.from_qpn)
                && (m.signaled || status != IBV_WC_SUCCESS)
            {
                let cq = from.send_cq;
                self.push(
                    cq,
                    IbvWc {
                        wr_id: m.wr_id,
                        status: if status == IBV_WC_SUCCESS { status } else { 10 },
                        opcode: if m.opcode == IBV_WR_SEND { WC_SEND } else { WC_RDMA_WRITE },
                        qp_num: m.from_qpn,
                        ..Default::default()
                    },
                );
            }
        }
    }
}

unsafe extern "C" fn emu_poll_cq(cq: *mut IbvCq, n: c_int, wc: *mut IbvWc) -> c_int {
    let mut w = world();
    let Some(c) = w.cqs.get_mut(&(cq as usize)) else { return -1 };
    let mut got = 0;
    while got < n {
        let Some(e) = c.queue.pop_front() else { break };
        // SAFETY: the caller gave room for `n` entries.
        unsafe { *wc.add(got as usize) = e };
        got += 1;
    }
    got
}

unsafe extern "C" fn emu_req_notify_cq(cq: *mut IbvCq, _solicited: c_int) -> c_int {
    match world().cqs.get_mut(&(cq as usize)) {
        Some(c) => {
            c.armed = true;
            0
        }
        None => EINVAL,
    }
}

unsafe extern "C" fn emu_post_send(qp: *mut IbvQp, wr: *mut IbvSendWr, _bad: *mut *mut IbvSendWr) -> c_int {
    let mut w = world();
    // SAFETY: live QP and request (the caller's contract).
    let (qpn, wr) = unsafe { ((*qp).qp_num, &*wr) };
    let Some(q) = w.qps.get(&qpn) else { return EINVAL };
    if q.state != IBV_QPS_RTS || wr.num_sge != 1 || !wr.next.is_null() {
        return EINVAL;
    }
    if wr.opcode != IBV_WR_RDMA_WRITE_WITH_IMM && wr.opcode != IBV_WR_SEND {
        return EINVAL;
    }
    // SAFETY: one scatter entry (checked).
    let sge = unsafe { &*wr.sg_list };
    let local_ok = w.mrs.iter().any(|(&key, &(base, len, _))| {
        key == sge.lkey && sge.addr >= base && sge.addr + sge.length as u64 <= base + len
    });
    if !local_ok {
        return EINVAL;
    }
    let mut data = vec![0u8; sge.length as usize];
    // SAFETY: within a registered region (checked).
    unsafe { ptr::copy_nonoverlapping(sge.addr as *const u8, data.as_mut_ptr(), data.len()) };
    let (dest, send_cq) = (q.dest, q.send_cq);
    let m = Incoming {
        opcode: wr.opcode,
        data,
        remote_addr: wr.remote_addr,
        rkey: wr.rkey,
        imm: wr.imm_data,
        from_qpn: qpn,
        wr_id: wr.wr_id,
        signaled: wr.send_flags & IBV_SEND_SIGNALED != 0,
    };
    match w.qps.get_mut(&dest) {
        Some(d) => {
            d.pending.push_back(m);
            w.deliver(dest);
        }
        None => w.push(send_cq, IbvWc { wr_id: m.wr_id, status: RETRY_EXC_ERR, qp_num: qpn, ..Default::default() }),
    }
    0
}

unsafe extern "C" fn emu_post_recv(qp: *mut IbvQp, wr: *mut IbvRecvWr, _bad: *mut *mut IbvRecvWr) -> c_int {
    let mut w = world();
    // SAFETY: live QP and request (the caller's contract).
    let (qpn, wr) = unsafe { ((*qp).qp_num, &*wr) };
    if wr.num_sge != 1 || !wr.next.is_null() {
        return EINVAL;
    }
    // SAFETY: one scatter entry (checked).
    let sge = unsafe { &*wr.sg_list };
    let Some(q) = w.qps.get_mut(&qpn) else { return EINVAL };
    if q.state == 0 {
        return EINVAL; // receives may be posted from INIT on
    }
    q.recvs.push_back((wr.wr_id, sge.addr, sge.length));
    w.deliver(qpn);
    0
}

fn context_box() -> *mut IbvContext {
    let mut ops = IbvContextOps::empty();
    ops.poll_cq = Some(emu_poll_cq);
    ops.req_notify_cq = Some(emu_req_notify_cq);
    ops.post_send = Some(emu_post_send);
    ops.post_recv = Some(emu_post_recv);
    Box::into_raw(Box::new(IbvContext { device: ptr::dangling_mut(), ops }))
}

const NAME: &[u8] = b"emu0\0";

pub unsafe fn ibv_get_device_list(n: *mut c_int) -> *mut *mut IbvDevice {
    // SAFETY: out-pointer from the caller.
    unsafe { *n = 1 };
    Box::into_raw(Box::new([ptr::dangling_mut::<IbvDevice>(), ptr::null_mut()])).cast()
}

pub unsafe fn ibv_free_device_list(list: *mut *mut IbvDevice) {
    // SAFETY: made by `ibv_get_device_list` above.
    drop(unsafe { Box::from_raw(list.cast::<[*mut IbvDevice; 2]>()) });
}

pub unsafe fn ibv_get_device_name(_d: *mut IbvDevice) -> *const c_char {
    NAME.as_ptr().cast()
}

pub unsafe fn ibv_open_device(_d: *mut IbvDevice) -> *mut IbvContext {
    context_box()
}

pub unsafe fn ibv_close_device(ctx: *mut IbvContext) -> c_int {
    // SAFETY: made by `ibv_open_device`.
    drop(unsafe { Box::from_raw(ctx) });
    0
}

pub unsafe fn ibv_query_port(_c: *mut IbvContext, port: u8, attr: *mut IbvPortAttr) -> c_int {
    if port != 1 {
        return EINVAL;
    }
    // SAFETY: out-pointer from the caller.
    let a = unsafe { &mut *attr };
    a.state = IBV_PORT_ACTIVE;
    a.active_mtu = 3;
    a.gid_tbl_len = 2;
    a.lid = 0;
    a.link_layer = IBV_LINK_LAYER_ETHERNET;
    0
}

pub unsafe fn ibv_query_gid(_c: *mut IbvContext, port: u8, index: c_int, gid: *mut IbvGid) -> c_int {
    let raw = match (port, index) {
        (1, 0) => [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        (1, 1) => [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1],
        _ => return EINVAL,
    };
    // SAFETY: out-pointer from the caller.
    unsafe { (*gid).raw = raw };
    0
}

pub unsafe fn ibv_alloc_pd(ctx: *mut IbvContext) -> *mut IbvPd {
    Box::into_raw(Box::new(EmuPd { context: ctx })).cast()
}

pub unsafe fn ibv_dealloc_pd(pd: *mut IbvPd) -> c_int {
    // SAFETY: made by `ibv_alloc_pd`.
    drop(unsafe { Box::from_raw(pd.cast::<EmuPd>()) });
    0
}

pub unsafe fn ibv_reg_mr(pd: *mut IbvPd, addr: *mut c_void, len: usize, access: c_int) -> *mut IbvMr {
    let mut w = world();
    w.next_key += 1;
    let key = w.next_key;
    w.mrs.insert(key, (addr as u64, len as u64, access & IBV_ACCESS_REMOTE_WRITE != 0));
    Box::into_raw(Box::new(IbvMr {
        // SAFETY: `pd` is an `EmuPd`.
        context: unsafe { (*pd.cast::<EmuPd>()).context },
        pd,
        addr,
        length: len,
        handle: key,
        lkey: key,
        rkey: key,
    }))
}

pub unsafe fn ibv_dereg_mr(mr: *mut IbvMr) -> c_int {
    // SAFETY: made by `ibv_reg_mr`.
    let mr = unsafe { Box::from_raw(mr) };
    world().mrs.remove(&mr.lkey);
    0
}

pub unsafe fn ibv_create_comp_channel(ctx: *mut IbvContext) -> *mut IbvCompChannel {
    let Ok((reader, writer)) = UnixStream::pair() else { return ptr::null_mut() };
    let fd = reader.as_raw_fd();
    Box::into_raw(Box::new(EmuChannel { ch: IbvCompChannel { context: ctx, fd, refcnt: 0 }, reader, writer, cq: 0 }))
        .cast()
}

pub unsafe fn ibv_destroy_comp_channel(ch: *mut IbvCompChannel) -> c_int {
    // SAFETY: made by `ibv_create_comp_channel`.
    drop(unsafe { Box::from_raw(ch.cast::<EmuChannel>()) });
    0
}

pub unsafe fn ibv_create_cq(
    ctx: *mut IbvContext,
    _cqe: c_int,
    _cq_ctx: *mut c_void,
    channel: *mut IbvCompChannel,
    _vector: c_int,
) -> *mut IbvCq {
    let cq = Box::into_raw(Box::new(EmuCq { cq: IbvCq { context: ctx }, channel: channel.cast() }));
    if !channel.is_null() {
        // SAFETY: a live `EmuChannel`.
        unsafe { (*channel.cast::<EmuChannel>()).cq = cq as usize };
    }
    world().cqs.insert(cq as usize, CqState { queue: VecDeque::new(), armed: false, channel: channel as usize });
    cq.cast()
}

pub unsafe fn ibv_destroy_cq(cq: *mut IbvCq) -> c_int {
    world().cqs.remove(&(cq as usize));
    // SAFETY: made by `ibv_create_cq`.
    drop(unsafe { Box::from_raw(cq.cast::<EmuCq>()) });
    0
}

pub unsafe fn ibv_get_cq_event(ch: *mut IbvCompChannel, cq: *mut *mut IbvCq, _ctx: *mut *mut c_void) -> c_int {
    // SAFETY: a live `EmuChannel`.
    let ch = unsafe { &*ch.cast::<EmuChannel>() };
    let mut b = [0u8; 1];
    // A real read on the (non-blocking) descriptor, so errno is EAGAIN when nothing is queued,
    // as with libibverbs.
    match (&ch.reader).read(&mut b) {
        Ok(1) => {
            // SAFETY: out-pointer from the caller.
            unsafe { *cq = ch.cq as *mut IbvCq };
            0
        }
        _ => -1,
    }
}

pub unsafe fn ibv_ack_cq_events(_cq: *mut IbvCq, _n: c_uint) {}

pub unsafe fn ibv_create_qp(pd: *mut IbvPd, attr: *mut IbvQpInitAttr) -> *mut IbvQp {
    // SAFETY: the caller's attributes.
    let attr = unsafe { &*attr };
    if attr.qp_type != IBV_QPT_RC || attr.send_cq.is_null() || attr.recv_cq.is_null() {
        return ptr::null_mut();
    }
    let mut w = world();
    w.next_qpn += 1;
    let qpn = w.next_qpn;
    w.qps.insert(
        qpn,
        QpState {
            state: 0,
            dest: 0,
            global: false,
            send_cq: attr.send_cq as usize,
            recv_cq: attr.recv_cq as usize,
            recvs: VecDeque::new(),
            pending: VecDeque::new(),
        },
    );
    Box::into_raw(Box::new(IbvQp {
        // SAFETY: `pd` is an `EmuPd`.
        context: unsafe { (*pd.cast::<EmuPd>()).context },
        qp_context: ptr::null_mut(),
        pd,
        send_cq: attr.send_cq,
        recv_cq: attr.recv_cq,
        srq: ptr::null_mut(),
        handle: qpn,
        qp_num: qpn,
    }))
}

pub unsafe fn ibv_modify_qp(qp: *mut IbvQp, attr: *mut IbvQpAttr, mask: c_int) -> c_int {
    // SAFETY: live QP and the caller's attributes.
    let (qpn, a) = unsafe { ((*qp).qp_num, &*attr) };
    let mut w = world();
    let Some(q) = w.qps.get_mut(&qpn) else { return EINVAL };
    let has = |m: c_int| mask & m == m;
    let ok = match (q.state, a.qp_state) {
        (0, s) if s == IBV_QPS_INIT => {
            has(IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) && a.port_num == 1
        }
        (s0, s) if s0 == IBV_QPS_INIT && s == IBV_QPS_RTR => {
            // RoCE needs a GRH with the destination GID.
            has(IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER)
                && a.ah_attr.is_global == 1
                && a.ah_attr.grh.dgid.raw != [0; 16]
                && (1..=5).contains(&a.path_mtu)
        }
        (s0, s) if s0 == IBV_QPS_RTR && s == IBV_QPS_RTS => has(IBV_QP_STATE
            | IBV_QP_SQ_PSN
            | IBV_QP_TIMEOUT
            | IBV_QP_RETRY_CNT
            | IBV_QP_RNR_RETRY
            | IBV_QP_MAX_QP_RD_ATOMIC),
        _ => false,
    };
    if !ok {
        return EINVAL;
    }
    q.state = a.qp_state;
    if a.qp_state == IBV_QPS_RTR {
        q.dest = a.dest_qp_num;
        q.global = a.ah_attr.is_global == 1;
    }
    w.deliver(qpn);
    0
}

pub unsafe fn ibv_destroy_qp(qp: *mut IbvQp) -> c_int {
    // SAFETY: made by `ibv_create_qp`.
    let qp = unsafe { Box::from_raw(qp) };
    let mut w = world();
    if let Some(q) = w.qps.remove(&qp.qp_num) {
        // What was on its way to it fails at the senders, after their retries.
        for m in q.pending {
            if let Some(from) = w.qps.get(&m.from_qpn) {
                let cq = from.send_cq;
                w.push(cq, IbvWc { wr_id: m.wr_id, status: RETRY_EXC_ERR, qp_num: m.from_qpn, ..Default::default() });
            }
        }
    }
    0
}

pub unsafe fn ibv_wc_status_str(status: u32) -> *const c_char {
    match status {
        0 => c"success".as_ptr(),
        12 => c"transport retry counter exceeded".as_ptr(),
        _ => c"emulated error".as_ptr(),
    }
}

/// Links over the emulation: the conformance suite and the ring's corner cases.
#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use bytes::Bytes;

    use crate::backend::{Backend, FrameListener, FrameReader, FrameWriter};
    use crate::conformance;
    use crate::rdma::{RdmaBackend, RdmaConfig};

    fn local() -> SocketAddr {
        "127.0.0.1:0".parse().expect("addr")
    }

    fn payload(i: usize, len: usize) -> Bytes {
        Bytes::from((0..len).map(|j| (i.wrapping_mul(131) ^ j.wrapping_mul(7)) as u8).collect::<Vec<u8>>())
    }

    async fn link(
        backend: &RdmaBackend,
    ) -> (crate::rdma::RdmaWriter, crate::rdma::RdmaReader, crate::rdma::RdmaWriter, crate::rdma::RdmaReader) {
        let mut listener = backend.bind(local()).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (a, c) = tokio::join!(listener.accept(), backend.connect(addr));
        let (sw, sr, _) = a.expect("accept");
        let (cw, cr) = c.expect("connect");
        (cw, cr, sw, sr)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn emulated_links_pass_the_conformance_suite() {
        let backend = RdmaBackend::new(RdmaConfig { ring_size: 4 << 20, ..Default::default() }).expect("backend");
        let largest = backend.config().largest_payload(64);
        conformance::run_all(&backend, local(), largest).await.expect("conformance");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connector_that_never_sets_up_does_not_hold_up_the_next_link() {
        // Setup may take an hour: only running setups side by side lets the second link through.
        let config = RdmaConfig { connect_timeout: std::time::Duration::from_secs(3600), ..Default::default() };
        let backend = RdmaBackend::new(config).expect("backend");
        let mut listener = backend.bind(local()).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let _silent = tokio::net::TcpStream::connect(addr).await.expect("silent connect");
        let (a, c) = tokio::time::timeout(std::time::Duration::from_secs(60), async {
            tokio::join!(listener.accept(), backend.connect(addr))
        })
        .await
        .expect("the second link was held up behind the silent one");
        let (mut sw, _sr, _) = a.expect("accept");
        let (_cw, mut cr) = c.expect("connect");
        sw.write_frame(b"h", &payload(1, 100)).await.expect("write");
        assert_eq!(cr.read_frame().await.expect("read").expect("frame").payload, payload(1, 100));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn emulated_small_ring_wraps_many_times_under_credits() {
        let backend = RdmaBackend::new(RdmaConfig {
            ring_size: 64 * 1024,
            max_records: 8,
            max_header: 4096,
            ..Default::default()
        })
        .expect("backend");
        let (cw, _cr, _sw, mut sr) = link(&backend).await;
        let sizes = [0usize, 1, 63, 64, 65, 4000, 20_000, 31_000, 777];
        conformance::many_frames_in_order(cw, &mut sr, &sizes, 3000).await.expect("laps of the ring");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn emulated_held_payload_is_never_overwritten() {
        let backend = RdmaBackend::new(RdmaConfig { ring_size: 64 * 1024, max_header: 4096, ..Default::default() })
            .expect("backend");
        let (cw, _cr, _sw, mut sr) = link(&backend).await;
        conformance::held_payload_then_released(cw, &mut sr, 8000).await.expect("held payload");
    }

    /// A frame larger than the peer's ring is refused up front, naming both sizes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn emulated_oversized_frame_is_refused() {
        let backend = RdmaBackend::new(RdmaConfig { ring_size: 64 * 1024, max_header: 4096, ..Default::default() })
            .expect("backend");
        let (mut cw, _cr, _sw, _sr) = link(&backend).await;
        let err = cw.write_frame(b"h", &payload(0, 64 * 1024)).await.expect_err("too large");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("65536"), "{err}");
    }

    /// The peer's side of the link vanishes without closing (its runtime is torn down, its
    /// halves never dropped — what a killed process looks like from here): the reader gets
    /// the frames that arrived, then an error; the writer fails.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn emulated_peer_that_vanishes_fails_both_halves_after_its_frames() {
        let backend = RdmaBackend::new(RdmaConfig { ring_size: 1 << 20, ..Default::default() }).expect("backend");
        let mut listener = backend.bind(local()).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (die_tx, die_rx) = std::sync::mpsc::channel::<()>();
        let peer_backend = backend.clone();
        let peer = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            let (mut w, r) = rt.block_on(peer_backend.connect(addr)).expect("connect");
            rt.block_on(async {
                for i in 0..10 {
                    w.write_frame(format!("c{i}").as_bytes(), &payload(i, 50_000)).await.expect("write");
                }
            });
            die_rx.recv().expect("told to die");
            // Never dropped: no close message is sent.
            std::mem::forget((w, r));
            drop(rt);
        });
        let (mut w, mut r, _) = listener.accept().await.expect("accept");
        for i in 0..10 {
            let f = r.read_frame().await.expect("read").expect("frame");
            assert_eq!(f.header, Bytes::from(format!("c{i}")));
            assert!(f.payload == payload(i, 50_000));
        }
        die_tx.send(()).expect("signal");
        peer.join().expect("peer thread");
        let end = r.read_frame().await;
        let err = end.expect_err("a vanished peer fails the reader");
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
        assert!(err.to_string().contains("without closing, after 10 frames"), "{err}");
        let mut failed = None;
        for _ in 0..10_000 {
            if let Err(e) = w.write_frame(b"x", &payload(0, 1000)).await {
                failed = Some(e);
                break;
            }
        }
        let e = failed.expect("the writer fails");
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }

    /// A peer that drops only its reader: our writer fails (as on TCP), our reader still works.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn emulated_peer_reader_dropped_fails_our_writer_only() {
        let backend = RdmaBackend::new(RdmaConfig { ring_size: 1 << 20, ..Default::default() }).expect("backend");
        let (mut cw, mut cr, mut sw, sr) = link(&backend).await;
        drop(sr);
        let mut failed = None;
        for _ in 0..10_000 {
            if let Err(e) = cw.write_frame(b"x", &payload(0, 1000)).await {
                failed = Some(e);
                break;
            }
        }
        let e = failed.expect("the writer fails");
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe);
        assert!(e.to_string().contains("stopped reading"), "{e}");
        sw.write_frame(b"still", &payload(1, 10)).await.expect("server writes on");
        let f = cr.read_frame().await.expect("read").expect("frame");
        assert_eq!(&f.header[..], b"still");
        drop(sw);
        assert!(cr.read_frame().await.expect("clean end").is_none());
    }
}
