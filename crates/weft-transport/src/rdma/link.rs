//! One established RDMA link: the two halves handed to the caller, the payload leases, and the
//! driver task that turns completions and side-channel messages into state changes.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use super::ffi::{IBV_WC_RECV, IBV_WC_RECV_RDMA_WITH_IMM, IBV_WC_SUCCESS, IBV_WC_WITH_IMM, IbvWc};
use super::ring::{
    Blocked, RECORD_ALIGN, RECORD_HEADER, RecvRing, SendRing, decode_record_header, encode_record_header,
    payload_offset, record_len,
};
use super::verbs::{ChannelFd, Cq, Qp, Region, wc_status_str};
use super::wire::{CONTROL_LEN, SIDE_LEN, Side, decode_control, encode_control};
use crate::backend::{Frame, FrameReader, FrameWriter};

/// Size of one control slot (send or receive).
pub(super) const CONTROL_SLOT: usize = 64;
/// Control messages (credits) in flight at once.
pub(super) const CONTROL_SLOTS: usize = 16;
/// Receive entries beyond the proven need (see the module docs).
pub(super) const RECV_SLACK: u32 = 8;
/// `wr_id` bit marking a control send. Data writes carry their end position (far below 2^62),
/// receives [`RECV_BIT`] and their slot, so even a failed completion (whose opcode is not
/// defined) says what it was.
const CONTROL_BIT: u64 = 1 << 63;
/// `wr_id` bit marking a receive.
const RECV_BIT: u64 = 1 << 62;

/// The verbs resources of a link. Field order is drop order: the QP first, then its CQ (and
/// channel), then the registered regions; each holds the PD, which holds the device context.
pub(super) struct Resources {
    pub qp: Qp,
    pub cq: Arc<Cq>,
    /// Our receive ring, written by the peer.
    pub recv_ring: Region,
    /// The staging copy of the peer's ring: records are copied here and written from here.
    pub staging: Region,
    /// One receive slot per posted receive (control messages land here).
    pub control_recv: Region,
    /// [`CONTROL_SLOTS`] slots our control messages are sent from.
    pub control_send: Region,
}

/// What the two sides agreed on.
pub(super) struct Terms {
    pub peer: SocketAddr,
    pub ring_capacity: u64,
    pub peer_ring_addr: u64,
    pub peer_ring_capacity: u64,
    pub peer_rkey: u32,
    /// Records the peer may have in flight to us.
    pub max_records: u64,
    /// Records we may have in flight to the peer.
    pub peer_max_records: u64,
    pub max_header: usize,
    pub peer_max_header: usize,
    pub close_timeout: Duration,
}

struct Ready {
    index: u64,
    offset: u64,
    header_len: usize,
    payload_len: usize,
}

struct State {
    send: SendRing,
    recv: RecvRing,
    ready: VecDeque<Ready>,
    control_in_flight: usize,
    control_seq: u64,
    writer_dropped: bool,
    reader_dropped: bool,
    peer_writer_closed: Option<u64>,
    peer_reader_closed: bool,
    peer_gone: bool,
    /// Fatal: both halves fail (a protocol violation, a local verbs call that failed).
    error: Option<String>,
    /// A work request completed with an error (the transport gave up, e.g. the peer's QP is
    /// gone): the writer fails now; the reader waits for the side channel to say whether the
    /// peer closed cleanly or died, or fails after the close timeout.
    transport_failed: Option<(String, Instant)>,
}

pub(super) struct Shared {
    res: Resources,
    terms: Terms,
    state: Mutex<State>,
    writer_wake: Notify,
    reader_wake: Notify,
    driver_wake: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent counters (every update is a single
        // assignment after its checks), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fail(&self, st: &mut State, why: String) {
        if st.error.is_none() {
            tracing::warn!(peer = %self.terms.peer, error = %why, "RDMA link failed");
            st.error = Some(why);
        }
        self.writer_wake.notify_one();
        self.reader_wake.notify_one();
    }

    fn release(&self, index: u64) {
        let mut st = self.lock();
        if let Err(e) = st.recv.release(index) {
            self.fail(&mut st, format!("releasing a received record: {e}"));
        }
        drop(st);
        self.driver_wake.notify_one();
    }
}

/// Starts a link over established resources; the side channel stays open as the liveness
/// signal and carries the close messages.
pub(super) fn start(res: Resources, terms: Terms, side: TcpStream) -> io::Result<(RdmaWriter, RdmaReader)> {
    let state = State {
        send: SendRing::new(terms.peer_ring_capacity, terms.peer_max_records),
        recv: RecvRing::new(terms.ring_capacity, terms.max_records),
        ready: VecDeque::new(),
        control_in_flight: 0,
        control_seq: 0,
        writer_dropped: false,
        reader_dropped: false,
        peer_writer_closed: None,
        peer_reader_closed: false,
        peer_gone: false,
        error: None,
        transport_failed: None,
    };
    let shared = Arc::new(Shared {
        res,
        terms,
        state: Mutex::new(state),
        writer_wake: Notify::new(),
        reader_wake: Notify::new(),
        driver_wake: Notify::new(),
    });
    let fd = shared.res.cq.channel().register()?;
    shared.res.cq.arm()?;
    tokio::spawn(drive(shared.clone(), fd, side));
    Ok((RdmaWriter { shared: shared.clone() }, RdmaReader { shared }))
}

/// The sending half of an RDMA link.
pub struct RdmaWriter {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RdmaWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaWriter").field("peer", &self.shared.terms.peer).finish()
    }
}

impl RdmaWriter {
    fn invalid(&self, why: String) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidInput, format!("RDMA link to {}: {why}", self.shared.terms.peer))
    }
}

impl FrameWriter for RdmaWriter {
    async fn write_frame(&mut self, header: &[u8], payload: &Bytes) -> io::Result<()> {
        let sh = &self.shared;
        if header.len() > sh.terms.peer_max_header {
            return Err(self.invalid(format!(
                "frame header of {} bytes is over the peer's limit of {} bytes",
                header.len(),
                sh.terms.peer_max_header
            )));
        }
        let len =
            record_len(header.len(), payload.len()).filter(|&l| l <= sh.terms.peer_ring_capacity).ok_or_else(|| {
                self.invalid(format!(
                    "a frame with a {}-byte header and a {}-byte payload does not fit in the \
                     peer's ring of {} bytes",
                    header.len(),
                    payload.len(),
                    sh.terms.peer_ring_capacity
                ))
            })?;
        let placement = loop {
            {
                let mut st = sh.lock();
                if let Some(e) = st.error.as_ref().or(st.transport_failed.as_ref().map(|t| &t.0)) {
                    return Err(io::Error::other(format!("RDMA link to {}: {e}", sh.terms.peer)));
                }
                if st.peer_reader_closed || st.peer_gone {
                    return Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        format!(
                            "RDMA link to {}: the peer {}",
                            sh.terms.peer,
                            if st.peer_gone { "went away" } else { "stopped reading" }
                        ),
                    ));
                }
                match st.send.place(len) {
                    Ok(p) => {
                        st.send.commit(&p);
                        break p;
                    }
                    Err(b @ Blocked::TooLarge { .. }) => return Err(self.invalid(b.to_string())),
                    Err(_) => {}
                }
            }
            sh.writer_wake.notified().await;
        };
        let offset = placement.offset as usize;
        // The padding after the last byte is not sent.
        let wire_len = if payload.is_empty() {
            RECORD_HEADER + header.len()
        } else {
            payload_offset(header.len()) as usize + payload.len()
        };
        let posted = sh
            .res
            .staging
            .write(offset, &[&encode_record_header(header.len(), payload.len()), header])
            .and_then(|()| sh.res.staging.write(offset + payload_offset(header.len()) as usize, &[&payload[..]]))
            .and_then(|()| {
                sh.res.qp.post_write_imm(
                    placement.end(),
                    &sh.res.staging,
                    offset,
                    wire_len,
                    sh.terms.peer_ring_addr + placement.offset,
                    sh.terms.peer_rkey,
                    (placement.offset / RECORD_ALIGN) as u32,
                )
            });
        if let Err(e) = posted {
            let mut st = sh.lock();
            sh.fail(&mut st, format!("posting a write: {e}"));
            return Err(e);
        }
        Ok(())
    }
}

impl Drop for RdmaWriter {
    fn drop(&mut self) {
        self.shared.lock().writer_dropped = true;
        self.shared.driver_wake.notify_one();
    }
}

/// The receiving half of an RDMA link.
pub struct RdmaReader {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RdmaReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaReader").field("peer", &self.shared.terms.peer).finish()
    }
}

/// A received payload: the bytes stay in the registered receive ring until the last clone of
/// the [`Bytes`] is dropped, which gives the record back (and, through a credit, the space to
/// the peer).
struct Lease {
    shared: Arc<Shared>,
    index: u64,
    offset: usize,
    len: usize,
}

impl AsRef<[u8]> for Lease {
    fn as_ref(&self) -> &[u8] {
        // The range was checked against the region when the lease was made.
        self.shared.res.recv_ring.slice(self.offset, self.len).unwrap_or(&[])
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.shared.release(self.index);
    }
}

impl RdmaReader {
    fn frame(&self, r: Ready) -> io::Result<Frame> {
        let sh = &self.shared;
        let at = r.offset as usize;
        let header = sh.res.recv_ring.slice(at + RECORD_HEADER, r.header_len).map(Bytes::copy_from_slice);
        let payload_at = at + payload_offset(r.header_len) as usize;
        let payload = match (&header, r.payload_len) {
            (Err(_), _) | (_, 0) => {
                sh.release(r.index);
                Bytes::new()
            }
            _ => {
                // Checked here so the lease's `as_ref` cannot miss.
                sh.res.recv_ring.slice(payload_at, r.payload_len)?;
                Bytes::from_owner(Lease { shared: sh.clone(), index: r.index, offset: payload_at, len: r.payload_len })
            }
        };
        Ok(Frame { header: header?, payload })
    }
}

impl FrameReader for RdmaReader {
    async fn read_frame(&mut self) -> io::Result<Option<Frame>> {
        let sh = self.shared.clone();
        loop {
            {
                let mut st = sh.lock();
                if let Some(r) = st.ready.pop_front() {
                    drop(st);
                    return self.frame(r).map(Some);
                }
                if let Some(n) = st.peer_writer_closed
                    && st.recv.arrived_records() >= n
                {
                    return Ok(None);
                }
                if let Some(e) = &st.error {
                    return Err(io::Error::other(format!("RDMA link from {}: {e}", sh.terms.peer)));
                }
                if st.peer_gone {
                    let arrived = st.recv.arrived_records();
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        match st.peer_writer_closed {
                            Some(n) => format!(
                                "RDMA link from {}: the peer closed after {n} frames but only \
                                 {arrived} arrived",
                                sh.terms.peer
                            ),
                            None => format!(
                                "RDMA link from {}: the peer went away without closing, after \
                                 {arrived} frames",
                                sh.terms.peer
                            ),
                        },
                    ));
                }
            }
            sh.reader_wake.notified().await;
        }
    }
}

impl Drop for RdmaReader {
    fn drop(&mut self) {
        let ready: Vec<u64> = {
            let mut st = self.shared.lock();
            st.reader_dropped = true;
            st.ready.drain(..).map(|r| r.index).collect()
        };
        for index in ready {
            self.shared.release(index);
        }
        self.shared.driver_wake.notify_one();
    }
}

/// What the driver must do after looking at the state.
struct Todo {
    side: Vec<Side>,
    finished: bool,
}

/// Handles every completion queued now. Errors are fatal to the link.
fn poll_completions(sh: &Shared, wcs: &mut [IbvWc]) -> Result<(), String> {
    loop {
        let n = sh.res.cq.poll(wcs).map_err(|e| e.to_string())?;
        for wc in &wcs[..n] {
            completion(sh, wc)?;
        }
        if n < wcs.len() {
            return Ok(());
        }
    }
}

fn completion(sh: &Shared, wc: &IbvWc) -> Result<(), String> {
    let mut st = sh.lock();
    if wc.status != IBV_WC_SUCCESS {
        // After the first failure the QP is in the error state and flushes everything else.
        if st.transport_failed.is_some() || st.error.is_some() {
            return Ok(());
        }
        let what = if wc.wr_id & RECV_BIT != 0 {
            "a receive"
        } else if wc.wr_id & CONTROL_BIT != 0 {
            "a credit message"
        } else {
            "an RDMA write"
        };
        let why = format!("{what} completed with {} (vendor error {:#x})", wc_status_str(wc.status), wc.vendor_err);
        if !st.peer_gone {
            tracing::debug!(peer = %sh.terms.peer, error = %why, "RDMA transport failure");
        }
        st.transport_failed = Some((why, Instant::now()));
        drop(st);
        sh.writer_wake.notify_one();
        sh.driver_wake.notify_one();
        return Ok(());
    }
    match wc.opcode {
        IBV_WC_RECV_RDMA_WITH_IMM => {
            if wc.wc_flags & IBV_WC_WITH_IMM == 0 {
                return Err("an RDMA write arrived without its immediate data".into());
            }
            let offset = u32::from_be(wc.imm_data) as u64 * RECORD_ALIGN;
            let head = sh
                .res
                .recv_ring
                .slice(offset as usize, RECORD_HEADER)
                .map_err(|e| format!("record at offset {offset}: {e}"))?;
            let (header_len, payload_len) =
                decode_record_header(head).map_err(|e| format!("record at offset {offset}: {e}"))?;
            if header_len > sh.terms.max_header {
                return Err(format!(
                    "record at offset {offset}: frame header of {header_len} bytes is over the \
                     limit of {}",
                    sh.terms.max_header
                ));
            }
            let len = usize::try_from(payload_len)
                .ok()
                .and_then(|p| record_len(header_len, p))
                .ok_or_else(|| format!("record at offset {offset}: payload of {payload_len} bytes"))?;
            let arrival = st.recv.arrive(offset, len)?;
            if let Some(n) = st.peer_writer_closed
                && arrival.index >= n
            {
                return Err(format!("a frame arrived after the peer said it closed after {n} frames"));
            }
            repost(sh, wc.wr_id)?;
            if st.reader_dropped {
                st.recv.release(arrival.index)?;
                drop(st);
                sh.driver_wake.notify_one();
            } else {
                st.ready.push_back(Ready {
                    index: arrival.index,
                    offset,
                    header_len,
                    payload_len: payload_len as usize,
                });
                drop(st);
                sh.reader_wake.notify_one();
            }
        }
        IBV_WC_RECV => {
            let slot = (wc.wr_id & !RECV_BIT) as usize;
            let bytes = sh
                .res
                .control_recv
                .slice(slot * CONTROL_SLOT, CONTROL_SLOT)
                .map_err(|e| format!("control receive slot {slot}: {e}"))?;
            let (tail, released) = decode_control(bytes, wc.byte_len as usize)?;
            st.send.credit(tail, released)?;
            repost(sh, wc.wr_id)?;
            drop(st);
            sh.writer_wake.notify_one();
        }
        _ if wc.wr_id & CONTROL_BIT != 0 => {
            st.control_in_flight = st.control_in_flight.saturating_sub(1);
        }
        _ => {
            st.send.completed(wc.wr_id)?;
            drop(st);
            sh.writer_wake.notify_one();
        }
    }
    Ok(())
}

fn repost(sh: &Shared, wr_id: u64) -> Result<(), String> {
    let slot = wr_id & !RECV_BIT;
    sh.res
        .qp
        .post_recv(RECV_BIT | slot, &sh.res.control_recv, slot as usize * CONTROL_SLOT, CONTROL_SLOT)
        .map_err(|e| e.to_string())
}

/// Posts every receive of a fresh link.
pub(super) fn post_receives(res: &Resources, entries: u32) -> io::Result<()> {
    for slot in 0..entries as u64 {
        res.qp.post_recv(RECV_BIT | slot, &res.control_recv, slot as usize * CONTROL_SLOT, CONTROL_SLOT)?;
    }
    Ok(())
}

/// Sends a credit when one is due and a control slot is free; decides what else to do.
fn housekeeping(sh: &Shared, sent: &mut (bool, bool), eof: bool) -> Result<Todo, String> {
    let mut st = sh.lock();
    if st.error.is_none()
        && st.transport_failed.is_none()
        && st.control_in_flight < CONTROL_SLOTS
        && let Some(credit) = st.recv.credit_due()
    {
        let slot = (st.control_seq % CONTROL_SLOTS as u64) as usize;
        let at = slot * CONTROL_SLOT;
        sh.res
            .control_send
            .write(at, &[&encode_control(credit.0, credit.1)])
            .and_then(|()| sh.res.qp.post_send(CONTROL_BIT | slot as u64, &sh.res.control_send, at, CONTROL_LEN))
            .map_err(|e| format!("sending a credit: {e}"))?;
        st.control_in_flight += 1;
        st.control_seq += 1;
        st.recv.reported(credit);
    }
    let mut side = Vec::new();
    if st.writer_dropped && !sent.0 {
        side.push(Side::WriterClosed(st.send.sent()));
        sent.0 = true;
    }
    if st.reader_dropped && !sent.1 {
        side.push(Side::ReaderClosed);
        sent.1 = true;
    }
    let finished = st.error.is_some()
        || st.peer_gone
        || (st.writer_dropped
            && st.reader_dropped
            && (st.send.all_completed() || eof || st.transport_failed.is_some()));
    Ok(Todo { side, finished })
}

/// The link's driver: completions, credits, side messages, and the end of the link.
async fn drive(sh: Arc<Shared>, fd: AsyncFd<ChannelFd>, side: TcpStream) {
    let peer = sh.terms.peer;
    let (mut rd, mut wr) = side.into_split();
    let mut buf = BytesMut::with_capacity(4 * SIDE_LEN);
    let mut wcs = [IbvWc::default(); 32];
    let mut sent = (false, false);
    let mut eof_at: Option<Instant> = None;
    let mut closing_since: Option<Instant> = None;
    let close_timeout = sh.terms.close_timeout;
    loop {
        if let Err(e) = poll_completions(&sh, &mut wcs) {
            let mut st = sh.lock();
            sh.fail(&mut st, e);
        }
        // After the side channel ended: the peer is gone once every frame it announced has
        // arrived (completions may trail its close by a moment), or after the grace period.
        if let Some(at) = eof_at {
            let mut st = sh.lock();
            let complete = st.peer_writer_closed.is_none_or(|n| st.recv.arrived_records() >= n);
            if !st.peer_gone && (complete || at.elapsed() >= close_timeout) {
                st.peer_gone = true;
                drop(st);
                sh.writer_wake.notify_one();
                sh.reader_wake.notify_one();
            }
        }
        // A transport failure the side channel did not explain within the close timeout fails
        // the reader too.
        let failed_at = {
            let mut st = sh.lock();
            match st.transport_failed.clone() {
                Some((why, at)) if !st.peer_gone && at.elapsed() >= close_timeout => {
                    sh.fail(&mut st, why);
                    None
                }
                t => t.map(|(_, at)| at),
            }
        };
        let todo = match housekeeping(&sh, &mut sent, eof_at.is_some()) {
            Ok(t) => t,
            Err(e) => {
                let mut st = sh.lock();
                sh.fail(&mut st, e);
                Todo { side: Vec::new(), finished: true }
            }
        };
        for m in todo.side {
            if eof_at.is_none()
                && let Err(e) = wr.write_all(&m.encode()).await
            {
                tracing::debug!(%peer, error = %e, "RDMA side channel write failed");
            }
        }
        if todo.finished {
            break;
        }
        {
            let st = sh.lock();
            if st.writer_dropped && st.reader_dropped && closing_since.is_none() {
                closing_since = Some(Instant::now());
            }
        }
        if closing_since.is_some_and(|at| at.elapsed() >= close_timeout) {
            tracing::warn!(%peer, "RDMA link closed with writes still in flight after {close_timeout:?}");
            break;
        }
        let deadline = [eof_at, closing_since, failed_at].into_iter().flatten().map(|at| at + close_timeout).min();
        tokio::select! {
            ready = fd.readable() => match ready {
                Ok(mut guard) => {
                    let drained = loop {
                        match sh.res.cq.take_event() {
                            Ok(true) => {}
                            Ok(false) => break Ok(()),
                            Err(e) => break Err(e),
                        }
                    };
                    guard.clear_ready();
                    if let Err(e) = drained.and_then(|()| sh.res.cq.arm()) {
                        let mut st = sh.lock();
                        sh.fail(&mut st, format!("completion events: {e}"));
                    }
                }
                Err(e) => {
                    let mut st = sh.lock();
                    sh.fail(&mut st, format!("waiting for completion events: {e}"));
                }
            },
            read = rd.read_buf(&mut buf), if eof_at.is_none() => match read {
                Ok(0) | Err(_) => eof_at = Some(Instant::now()),
                Ok(_) => {
                    while buf.len() >= SIDE_LEN {
                        let mut m = [0u8; SIDE_LEN];
                        m.copy_from_slice(&buf.split_to(SIDE_LEN));
                        let mut st = sh.lock();
                        match Side::decode(&m) {
                            Ok(Side::WriterClosed(n)) => {
                                if st.recv.arrived_records() > n {
                                    let why = format!(
                                        "the peer said it closed after {n} frames, {} arrived",
                                        st.recv.arrived_records()
                                    );
                                    sh.fail(&mut st, why);
                                }
                                st.peer_writer_closed = Some(n);
                                drop(st);
                                sh.reader_wake.notify_one();
                            }
                            Ok(Side::ReaderClosed) => {
                                st.peer_reader_closed = true;
                                drop(st);
                                sh.writer_wake.notify_one();
                            }
                            Err(e) => sh.fail(&mut st, format!("side channel: {e}")),
                        }
                    }
                }
            },
            _ = sh.driver_wake.notified() => {}
            _ = sleep_until(deadline) => {}
        }
    }
    // Dropping the side channel tells the peer we are gone; the verbs resources go with the
    // last holder of `sh` (payloads still in use keep the receive ring alive).
    let _ = wr.shutdown().await;
    drop(fd);
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
