//! The RDMA verbs backend (feature `rdma`): one reliable-connected (RC) queue pair per link,
//! set up over a TCP side channel, frames moved by RDMA WRITE with immediate data into a ring
//! the peer registered, credits flowing back as small SENDs.
//!
//! # What runs where
//!
//! Building needs libibverbs to link against (Debian: `apt-get install -y libibverbs-dev`); no
//! cmake, clang or rdma-core sources. Running needs an RDMA device (a Mellanox/NVIDIA NIC, or
//! soft-RoCE `rxe` over any Ethernet interface) and its user-space provider
//! (`ibverbs-providers`, which libibverbs-dev pulls in).
//!
//! **Not yet run on RDMA hardware or rxe**: the machine this was written on has neither. What
//! has run there:
//! - the pure parts: ring and credit accounting, the side-channel encoding, and the handshake
//!   exchange over real TCP sockets;
//! - a check that every struct layout, offset and constant of the hand-written declarations
//!   matches the installed `verbs.h` (a C program compiled against it);
//! - the whole backend above the C API — verbs wrappers, link setup with QP state changes, the
//!   driver, credits, close and failure handling — against an in-process stand-in for
//!   libibverbs (unit tests only, `emu.rs`): the backend conformance suite, thousands of frames
//!   wrapping a 64 KiB ring, a held payload never overwritten, a peer that vanishes, a dropped
//!   reader. The stand-in checks what an RC QP would refuse, but it is not a NIC.
//!
//! `tests/rdma.rs` has the device tests (the conformance suite, wrap-around under credits, a
//! held payload, a peer process killed mid-stream); they run when `ibv_get_device_list` finds
//! a device with an active port and skip with a message otherwise.
//!
//! # Bindings and the inline verbs
//!
//! The libibverbs declarations are written by hand (`ffi.rs`): on a Debian box with only
//! libibverbs-dev, `ibverbs`/`ibverbs-sys` and `rdma-mummy-sys` (under `sideway`) need cmake to
//! build the rdma-core they vendor, and `rdma-sys` needs libclang for bindgen and
//! librdmacm-dev. `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and `ibv_req_notify_cq` are
//! `static inline` in `verbs.h` (libibverbs exports no such symbols): the header calls the
//! provider's function pointers in the `ops` table embedded in `struct ibv_context`, through
//! the QP's or CQ's `context` pointer, and so do we — the context's layout is declared up to
//! the end of that table and those four entries are called the same way. `ibv_query_port`
//! and `ibv_reg_mr` are macros over exported symbols, which we call as the header's fallback
//! does.
//!
//! # Link setup
//!
//! [`RdmaBackend::bind`] listens on TCP at the given address (the second NIC's, as for the TCP
//! backend: the side channel and the RDMA traffic use the same NIC). A link starts with a TCP
//! connection. Each side picks its RDMA port from the connection's local address (a RoCE GID
//! equal to that address, preferring RoCE v2; on InfiniBand the only active port, or the
//! configured one), creates a completion channel and queue, an RC QP (moved to INIT), and
//! registers its receive ring. Both send a hello (LID, GID, QPN, first PSN, ring address,
//! capacity and rkey, records allowed in flight, largest header — [`wire`] has the layout)
//! and read the peer's; each then registers a staging buffer the size of the peer's ring,
//! posts its receives and moves the QP through RTR to RTS. Then both send a status byte
//! (ready, or refused with the reason); only after both are ready does any data flow, so no
//! write can reach a QP that is not ready for it. Setup waits at most
//! [`RdmaConfig::connect_timeout`]; the side channel has TCP keepalive on (10 s idle, then 3
//! probes 5 s apart).
//!
//! # Data path: why RDMA WRITE with immediate into a ring
//!
//! The alternative, SEND into pre-posted receive buffers, fixes the largest message at the
//! receive buffer's size, so a 4 MiB frame would be cut into slot-sized pieces and copied back
//! together (or land scattered). With WRITE-with-immediate the sender places each frame
//! contiguously in the peer's ring, at an offset it chooses by the same rules as the shared
//! memory ring, so any frame up to the ring's size lands in one piece and is handed to the
//! reader in place. The immediate data (32 bits) carries the record's offset in 64-byte units;
//! the receiver checks it is exactly where the rules say (next to the previous record, or at 0
//! when the record did not fit before the end) and within the space it gave back — a peer that
//! breaks the rules fails the link with an error saying how, it is never trusted blindly.
//!
//! A record is a 16-byte record header (header length, magic, payload length), the frame header,
//! padding to 64 bytes, the payload. The writer copies it into its registered staging buffer at
//! the same offset it will occupy in the peer's ring and posts one signalled write: one copy on
//! the sending side (registering each caller's payload would cost more than copying it at these
//! sizes; a registration cache for very large payloads is planned), none on the receiving side:
//! the payload is handed out with [`Bytes::from_owner`](bytes::Bytes::from_owner) over the
//! registered ring, and the record is given back when the last clone is dropped.
//!
//! # Credits and bounded queues
//!
//! Space comes back in order: the receiver's tail moves over released records up to the first
//! one still held, and it tells the sender with a 24-byte SEND (tail position, records released)
//! from one of 16 control slots. The sender reuses ring space only when both the credit arrived
//! and its own write from that staging range completed. It also keeps at most the peer's
//! `max_records` records in flight, which bounds the receive entries it consumes. Receive
//! entries are sized so they can never run out: the peer's data consumes at most our
//! `max_records`; its credits each report at least one newly released record of ours, all among
//! the records we sent that the peer has not yet reported — at most the peer's `max_records`. So
//! each side posts `ours + theirs + 8` receives and reposts each as soon as it completes; the QP
//! also retries forever on receiver-not-ready (`rnr_retry` 7), which would only cost time.
//! A frame larger than the peer's ring is an `InvalidInput` error naming both sizes
//! ([`RdmaConfig::largest_payload`] is the bound).
//!
//! # Completions, close and failure
//!
//! Each link has a driver task: it waits on the completion channel's descriptor (non-blocking,
//! registered with tokio), takes and acknowledges events, re-arms the CQ and polls it dry; it
//! reposts receives, queues arrived records for the reader, applies credits, and sends credits
//! when records are released. The TCP side channel stays open for the life of the link: a
//! dropped writer sends *writer closed after n frames* (the peer's reader returns `None` once it
//! has all n), a dropped reader *reader closed* (the peer's writer fails, as on TCP), and the
//! end of the stream without those means the peer's process is gone, so the reader fails
//! (after the frames that did arrive) and the writer fails. A failed completion (e.g. transport
//! retries exhausted) fails both halves with the verbs status text. When both halves are
//! dropped the driver waits for our writes to complete (at most
//! [`RdmaConfig::close_timeout`]) and closes the side channel; the verbs resources are freed
//! when the last payload of the link is dropped.
//!
//! A peer is trusted as far as the shared-memory backend trusts one: it can write anywhere in
//! the ring we registered for it, so a peer that ignores credits can change bytes of a payload
//! we handed out. The checks above catch a confused peer, not a malicious one.

#[cfg(test)]
mod emu;
mod ffi;
mod link;
pub mod ring;
mod verbs;
pub mod wire;

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::backend::{Backend, FrameListener, Setups};
use crate::protocol::DEFAULT_MAX_HEADER;

pub use link::{RdmaReader, RdmaWriter};
pub use verbs::device_names;

use link::{CONTROL_SLOT, CONTROL_SLOTS, RECV_SLACK, Resources, Terms};
use ring::{RECORD_ALIGN, RECORD_HEADER};
use verbs::{CompChannel, Context, Cq, Pd, PeerPath, Qp, Region};
use wire::Hello;

/// Environment variable naming the RDMA device ([`RdmaConfig::from_env`]).
pub const DEVICE_ENV: &str = "WEFT_RDMA_DEVICE";
/// Environment variable with the device port number.
pub const PORT_ENV: &str = "WEFT_RDMA_PORT";
/// Environment variable with the GID index.
pub const GID_INDEX_ENV: &str = "WEFT_RDMA_GID_INDEX";
/// The largest ring accepted (the verbs length of one write is 32 bits; 1 GiB is plenty).
pub const MAX_RING_SIZE: usize = 1 << 30;

/// Settings of the RDMA backend.
#[derive(Clone, Debug)]
pub struct RdmaConfig {
    /// The device (`mlx5_0`, `rxe0`); `None` picks the one whose port carries the link's local
    /// address.
    pub device: Option<String>,
    /// The port; `None` picks it as for the device.
    pub port: Option<u8>,
    /// The GID index; `None` picks the GID equal to the local address (RoCE) or index 0
    /// (InfiniBand).
    pub gid_index: Option<u32>,
    /// The receive ring's size per link, and so the largest frame the peer can send us. A
    /// multiple of 4096, at most [`MAX_RING_SIZE`]. Each link registers this much twice on
    /// each side (our ring and the staging copy of the peer's).
    pub ring_size: usize,
    /// Records the peer may have in flight to us before we release some.
    pub max_records: u32,
    /// The largest frame header we accept.
    pub max_header: usize,
    /// How long link setup may take.
    pub connect_timeout: Duration,
    /// How long a closing link waits for its last writes (and a reader for frames announced
    /// by a peer that closed); a hang guard, not a tuning knob.
    pub close_timeout: Duration,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        Self {
            device: None,
            port: None,
            gid_index: None,
            ring_size: 32 << 20,
            max_records: 256,
            max_header: DEFAULT_MAX_HEADER,
            connect_timeout: Duration::from_secs(5),
            close_timeout: Duration::from_secs(10),
        }
    }
}

impl RdmaConfig {
    /// The defaults, with device, port and GID index from [`DEVICE_ENV`], [`PORT_ENV`] and
    /// [`GID_INDEX_ENV`] when set.
    pub fn from_env() -> io::Result<Self> {
        let mut c = Self::default();
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        c.device = var(DEVICE_ENV);
        if let Some(v) = var(PORT_ENV) {
            c.port = Some(
                v.parse().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{PORT_ENV}={v:?}: {e}")))?,
            );
        }
        if let Some(v) = var(GID_INDEX_ENV) {
            c.gid_index = Some(
                v.parse()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{GID_INDEX_ENV}={v:?}: {e}")))?,
            );
        }
        Ok(c)
    }

    /// The largest payload that fits in a ring of [`ring_size`](Self::ring_size) with a frame
    /// header of `header_len` bytes.
    pub fn largest_payload(&self, header_len: usize) -> usize {
        self.ring_size.saturating_sub(ring::payload_offset(header_len) as usize)
    }

    fn check(&self) -> io::Result<()> {
        let bad = |why: String| Err(io::Error::new(io::ErrorKind::InvalidInput, why));
        if self.ring_size < 4096 || !self.ring_size.is_multiple_of(4096) || self.ring_size > MAX_RING_SIZE {
            return bad(format!(
                "RDMA ring size {} must be a multiple of 4096 between 4096 and {MAX_RING_SIZE}",
                self.ring_size
            ));
        }
        if self.max_records == 0 || self.max_records > 8192 {
            return bad(format!("RDMA records in flight {} must be between 1 and 8192", self.max_records));
        }
        if self.max_header > u32::MAX as usize || self.max_header + RECORD_HEADER > self.ring_size {
            return bad(format!(
                "RDMA largest header {} does not fit the ring of {} bytes",
                self.max_header, self.ring_size
            ));
        }
        Ok(())
    }
}

/// An RDMA port chosen for a local address.
struct Port {
    ctx: Arc<Context>,
    pd: Arc<Pd>,
    port: u8,
    link_layer: u8,
    lid: u16,
    mtu: u32,
    gid_index: u32,
    gid: [u8; 16],
}

/// An active port and the address its GID carries (RoCE), as found on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The device name.
    pub device: String,
    /// The port number.
    pub port: u8,
    /// 1 InfiniBand, 2 Ethernet (RoCE).
    pub link_layer: u8,
    /// The GID index.
    pub gid_index: u32,
    /// The IP address the GID carries (RoCE); `None` on InfiniBand.
    pub ip: Option<IpAddr>,
}

fn sysfs_ports(device: &str) -> Vec<u8> {
    let dir = format!("/sys/class/infiniband/{device}/ports");
    let mut ports: Vec<u8> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    ports.sort_unstable();
    if ports.is_empty() {
        ports.push(1);
    }
    ports
}

fn gid_is_roce_v2(device: &str, port: u8, index: u32) -> bool {
    std::fs::read_to_string(format!("/sys/class/infiniband/{device}/ports/{port}/gid_attrs/types/{index}"))
        .is_ok_and(|t| t.trim().eq_ignore_ascii_case("RoCE v2"))
}

fn gid_ip(gid: &[u8; 16]) -> Option<IpAddr> {
    if gid == &[0u8; 16] {
        return None;
    }
    let v6 = std::net::Ipv6Addr::from(*gid);
    if v6.is_unicast_link_local() {
        return None;
    }
    Some(match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    })
}

fn ip_gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// Active ports on this machine with the addresses their GIDs carry: what a link can be set up
/// on. Empty when there is no device.
pub fn endpoints() -> io::Result<Vec<Endpoint>> {
    let mut out = Vec::new();
    for device in device_names()? {
        let ctx = Context::open(&device)?;
        for port in sysfs_ports(&device) {
            let Ok(attr) = ctx.port(port) else { continue };
            if attr.state != ffi::IBV_PORT_ACTIVE {
                continue;
            }
            if attr.link_layer != ffi::IBV_LINK_LAYER_ETHERNET {
                out.push(Endpoint {
                    device: device.clone(),
                    port,
                    link_layer: attr.link_layer,
                    gid_index: 0,
                    ip: None,
                });
                continue;
            }
            for index in 0..attr.gid_table_len {
                let Ok(gid) = ctx.gid(port, index) else { continue };
                if let Some(ip) = gid_ip(&gid)
                    && (gid_is_roce_v2(&device, port, index) || !out.iter().any(|e: &Endpoint| e.ip == Some(ip)))
                {
                    out.retain(|e: &Endpoint| e.ip != Some(ip));
                    out.push(Endpoint {
                        device: device.clone(),
                        port,
                        link_layer: attr.link_layer,
                        gid_index: index,
                        ip: Some(ip),
                    });
                }
            }
        }
    }
    Ok(out)
}

/// Finds the port for `ip`: see [`RdmaConfig::device`] and the module docs.
fn find_port(config: &RdmaConfig, ip: IpAddr) -> io::Result<Port> {
    let devices = match &config.device {
        Some(d) => vec![d.clone()],
        None => device_names()?,
    };
    if devices.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "no RDMA device on this machine (ibv_get_device_list found none)",
        ));
    }
    let want = ip_gid(ip);
    let mut infiniband = Vec::new();
    let mut seen = Vec::new();
    for device in &devices {
        let ctx = Context::open(device)?;
        let ports = config.port.map(|p| vec![p]).unwrap_or_else(|| sysfs_ports(device));
        for port in ports {
            let attr = ctx.port(port)?;
            if attr.state != ffi::IBV_PORT_ACTIVE {
                seen.push(format!("{device} port {port} (not active)"));
                continue;
            }
            let chosen = if let Some(index) = config.gid_index {
                Some((index, ctx.gid(port, index)?))
            } else if attr.link_layer == ffi::IBV_LINK_LAYER_ETHERNET {
                let mut best: Option<(u32, [u8; 16])> = None;
                for index in 0..attr.gid_table_len {
                    let Ok(gid) = ctx.gid(port, index) else { continue };
                    if gid == want {
                        let v2 = gid_is_roce_v2(device, port, index);
                        if best.is_none() || v2 {
                            best = Some((index, gid));
                        }
                        if v2 {
                            break;
                        }
                    }
                }
                best
            } else {
                infiniband.push((ctx.clone(), port, attr));
                None
            };
            seen.push(format!("{device} port {port}"));
            if let Some((gid_index, gid)) = chosen {
                let pd = Pd::new(&ctx)?;
                return Ok(Port {
                    ctx: ctx.clone(),
                    pd,
                    port,
                    link_layer: attr.link_layer,
                    lid: attr.lid,
                    mtu: attr.active_mtu,
                    gid_index,
                    gid,
                });
            }
        }
    }
    // InfiniBand GIDs do not carry IP addresses: with exactly one active InfiniBand port that
    // is the one (IPoIB carries the side channel); with several, the configuration must say.
    if let [(ctx, port, attr)] = &infiniband[..] {
        let pd = Pd::new(ctx)?;
        return Ok(Port {
            ctx: ctx.clone(),
            pd,
            port: *port,
            link_layer: attr.link_layer,
            lid: attr.lid,
            mtu: attr.active_mtu,
            gid_index: 0,
            gid: ctx.gid(*port, 0)?,
        });
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "no RDMA port for local address {ip}: no RoCE GID equals it on {} (bind to the \
             RDMA NIC's address, or set {DEVICE_ENV}/{PORT_ENV}/{GID_INDEX_ENV})",
            seen.join(", ")
        ),
    ))
}

struct Inner {
    config: RdmaConfig,
    ports: Mutex<HashMap<IpAddr, Arc<Port>>>,
}

/// The RDMA verbs backend. Cheap to clone; devices are opened on first use and kept.
#[derive(Clone)]
pub struct RdmaBackend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RdmaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaBackend").field("config", &self.inner.config).finish()
    }
}

impl RdmaBackend {
    /// A backend with these settings.
    pub fn new(config: RdmaConfig) -> io::Result<Self> {
        config.check()?;
        Ok(Self { inner: Arc::new(Inner { config, ports: Mutex::new(HashMap::new()) }) })
    }

    /// The settings.
    pub fn config(&self) -> &RdmaConfig {
        &self.inner.config
    }

    fn port_for(&self, ip: IpAddr) -> io::Result<Arc<Port>> {
        let mut ports = self.inner.ports.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = ports.get(&ip) {
            return Ok(p.clone());
        }
        let p = Arc::new(find_port(&self.inner.config, ip)?);
        ports.insert(ip, p.clone());
        Ok(p)
    }

    /// Sets up a link over a connected side channel (either end).
    async fn establish(&self, mut stream: TcpStream, peer: SocketAddr) -> io::Result<(RdmaWriter, RdmaReader)> {
        let config = self.inner.config.clone();
        let context = |e: io::Error| io::Error::new(e.kind(), format!("RDMA link with {peer}: {e}"));
        let setup = async {
            stream.set_nodelay(true)?;
            // The side channel is the liveness signal: keepalive notices a peer whose machine
            // vanished (no FIN) even when this side only reads.
            let keepalive = socket2::TcpKeepalive::new()
                .with_time(Duration::from_secs(10))
                .with_interval(Duration::from_secs(5))
                .with_retries(3);
            socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive)?;
            let local = stream.local_addr()?.ip();
            let this = self.clone();
            let (port, half) = tokio::task::spawn_blocking(move || {
                let port = this.port_for(local)?;
                let half = begin(&port, &this.inner.config)?;
                Ok::<_, io::Error>((port, half))
            })
            .await
            .map_err(io::Error::other)??;
            let psn = rand::random::<u32>() & 0xff_ffff;
            let ours = Hello {
                link_layer: port.link_layer,
                mtu: port.mtu as u8,
                lid: port.lid,
                port: port.port,
                gid: port.gid,
                qpn: half.qp.qpn(),
                psn,
                ring_addr: half.recv_ring.addr(),
                ring_capacity: config.ring_size as u64,
                ring_rkey: half.recv_ring.rkey(),
                max_records: config.max_records,
                max_header: config.max_header as u32,
            };
            let theirs = wire::exchange_hello(&mut stream, &ours).await?;
            let finished = match agree(&config, &ours, &theirs) {
                Ok(()) => {
                    let (port, cfg, theirs2) = (port.clone(), config.clone(), theirs.clone());
                    tokio::task::spawn_blocking(move || finish(half, &port, &cfg, &theirs2, psn))
                        .await
                        .map_err(io::Error::other)?
                        .map_err(|e| e.to_string())
                }
                Err(why) => Err(why),
            };
            wire::exchange_status(&mut stream, finished.as_ref().map(|_| ()).map_err(|s| s.as_str())).await?;
            let res = finished.map_err(io::Error::other)?;
            let terms = Terms {
                peer,
                ring_capacity: config.ring_size as u64,
                peer_ring_addr: theirs.ring_addr,
                peer_ring_capacity: theirs.ring_capacity,
                peer_rkey: theirs.ring_rkey,
                max_records: config.max_records as u64,
                peer_max_records: theirs.max_records as u64,
                max_header: config.max_header,
                peer_max_header: theirs.max_header as usize,
                close_timeout: config.close_timeout,
            };
            Ok::<_, io::Error>((res, terms))
        };
        let (res, terms) = match tokio::time::timeout(config.connect_timeout, setup).await {
            Ok(r) => r.map_err(context)?,
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("RDMA link with {peer}: setup took longer than {:?}", config.connect_timeout),
                ));
            }
        };
        link::start(res, terms, stream).map_err(context)
    }
}

/// Receive entries to post: the peer's data and its credits (see the module docs).
fn recv_entries(config: &RdmaConfig, theirs: &Hello) -> u32 {
    config.max_records + theirs.max_records + RECV_SLACK
}

/// Whether the peer's terms work with ours; the reason when not.
fn agree(config: &RdmaConfig, ours: &Hello, theirs: &Hello) -> Result<(), String> {
    if theirs.link_layer != ours.link_layer {
        return Err(format!(
            "link layers differ: this side {} , the peer {} (1 InfiniBand, 2 Ethernet)",
            ours.link_layer, theirs.link_layer
        ));
    }
    if theirs.max_records > config.max_records {
        return Err(format!(
            "the peer allows {} records in flight, this side's queues are sized for {}; \
             configure both sides alike",
            theirs.max_records, config.max_records
        ));
    }
    Ok(())
}

/// A link's resources before the peer is known: CQ, QP in INIT, our ring and control slots.
struct Half {
    qp: Qp,
    cq: Arc<Cq>,
    recv_ring: Region,
    control_recv: Region,
    control_send: Region,
}

fn begin(port: &Port, config: &RdmaConfig) -> io::Result<Half> {
    let send_wr = config.max_records + CONTROL_SLOTS as u32 + RECV_SLACK;
    let recv_wr = 2 * config.max_records + RECV_SLACK;
    let channel = CompChannel::new(&port.ctx)?;
    let cq = Cq::new(&port.ctx, &channel, send_wr + recv_wr)?;
    let qp = Qp::new(&port.pd, &cq, send_wr, recv_wr)?;
    qp.to_init(port.port)?;
    let recv_ring = Region::new(&port.pd, config.ring_size, true)?;
    let control_recv = Region::new(&port.pd, recv_wr as usize * CONTROL_SLOT, false)?;
    let control_send = Region::new(&port.pd, CONTROL_SLOTS * CONTROL_SLOT, false)?;
    debug_assert_eq!(port.pd.context().name(), port.ctx.name());
    Ok(Half { qp, cq, recv_ring, control_recv, control_send })
}

fn finish(half: Half, port: &Port, config: &RdmaConfig, theirs: &Hello, psn: u32) -> io::Result<Resources> {
    let staging = Region::new(&port.pd, theirs.ring_capacity as usize, false)?;
    let res = Resources {
        qp: half.qp,
        cq: half.cq,
        recv_ring: half.recv_ring,
        staging,
        control_recv: half.control_recv,
        control_send: half.control_send,
    };
    link::post_receives(&res, recv_entries(config, theirs))?;
    let path = PeerPath {
        qpn: theirs.qpn,
        psn: theirs.psn,
        mtu: port.mtu.min(theirs.mtu as u32),
        lid: theirs.lid,
        gid: theirs.gid,
        global: (port.link_layer == ffi::IBV_LINK_LAYER_ETHERNET).then_some(port.gid_index as u8),
    };
    res.qp.to_rtr(port.port, &path)?;
    res.qp.to_rts(psn)?;
    debug_assert!(res.recv_ring.len() >= config.ring_size);
    debug_assert_eq!(config.ring_size as u64 % RECORD_ALIGN, 0);
    Ok(res)
}

impl Backend for RdmaBackend {
    type Writer = RdmaWriter;
    type Reader = RdmaReader;
    type Listener = RdmaListener;

    fn name(&self) -> &'static str {
        "rdma"
    }

    async fn connect(&self, peer: SocketAddr) -> io::Result<(RdmaWriter, RdmaReader)> {
        let socket = if peer.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        let timeout = self.inner.config.connect_timeout;
        let stream = match tokio::time::timeout(timeout, socket.connect(peer)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                return Err(io::Error::new(e.kind(), format!("RDMA side channel to {peer}: {e}")));
            }
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("RDMA side channel to {peer}: no answer within {timeout:?}"),
                ));
            }
        };
        self.establish(stream, peer).await
    }

    async fn bind(&self, local: SocketAddr) -> io::Result<RdmaListener> {
        let socket = if local.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        socket.set_reuseaddr(true)?;
        socket.bind(local).map_err(|e| io::Error::new(e.kind(), format!("binding {local}: {e}")))?;
        RdmaListener::new(socket.listen(1024)?, self.clone())
    }
}

/// Accepts RDMA links: a TCP accept, then the link setup (up to
/// [`RdmaConfig::connect_timeout`]). Setups run side by side, so a peer slow in its setup holds
/// up only its own link; a failed setup comes out of `accept` as a
/// [`SetupFailed`](crate::backend::SetupFailed) error naming the peer, and the listener goes on.
pub struct RdmaListener {
    setups: Setups<(RdmaWriter, RdmaReader, SocketAddr)>,
    local: SocketAddr,
}

impl std::fmt::Debug for RdmaListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaListener").field("local", &self.local).finish_non_exhaustive()
    }
}

impl RdmaListener {
    fn new(listener: TcpListener, backend: RdmaBackend) -> io::Result<Self> {
        let local = listener.local_addr()?;
        let setups = Setups::start(
            listener,
            move |(stream, peer)| {
                let backend = backend.clone();
                async move {
                    let (w, r) = backend.establish(stream, peer).await?;
                    Ok((w, r, peer))
                }
            },
            format!("RDMA listener {local}"),
        );
        Ok(Self { setups, local })
    }
}

impl FrameListener for RdmaListener {
    type Writer = RdmaWriter;
    type Reader = RdmaReader;

    async fn accept(&mut self) -> io::Result<(RdmaWriter, RdmaReader, SocketAddr)> {
        self.setups.next().await
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_map_to_addresses_and_back() {
        let v4: IpAddr = "10.1.2.3".parse().expect("ip");
        let gid = ip_gid(v4);
        assert_eq!(gid[10..12], [0xff, 0xff]);
        assert_eq!(gid_ip(&gid), Some(v4));
        let v6: IpAddr = "fd00::5".parse().expect("ip");
        assert_eq!(gid_ip(&ip_gid(v6)), Some(v6));
        assert_eq!(gid_ip(&[0; 16]), None);
        let link_local: IpAddr = "fe80::1".parse().expect("ip");
        assert_eq!(gid_ip(&ip_gid(link_local)), None);
    }

    #[test]
    fn config_is_checked() {
        assert!(RdmaBackend::new(RdmaConfig::default()).is_ok());
        for bad in [
            RdmaConfig { ring_size: 5000, ..Default::default() },
            RdmaConfig { ring_size: 2 << 30, ..Default::default() },
            RdmaConfig { max_records: 0, ..Default::default() },
            RdmaConfig { ring_size: 4096, max_header: 8192, ..Default::default() },
        ] {
            let err = RdmaBackend::new(bad).expect_err("refused");
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        }
        let c = RdmaConfig::default();
        assert_eq!(c.largest_payload(40), (32 << 20) - 64);
    }

    #[test]
    fn terms_must_agree() {
        let config = RdmaConfig::default();
        let ours = Hello {
            link_layer: 2,
            mtu: 5,
            lid: 0,
            port: 1,
            gid: [0; 16],
            qpn: 1,
            psn: 0,
            ring_addr: 0,
            ring_capacity: 1 << 20,
            ring_rkey: 0,
            max_records: 256,
            max_header: 1024,
        };
        assert_eq!(agree(&config, &ours, &ours), Ok(()));
        let ib = Hello { link_layer: 1, ..ours.clone() };
        assert!(agree(&config, &ours, &ib).expect_err("layers").contains("link layers"));
        let more = Hello { max_records: 257, ..ours.clone() };
        assert!(agree(&config, &ours, &more).expect_err("records").contains("257"));
        assert_eq!(recv_entries(&config, &ours), 256 + 256 + RECV_SLACK);
    }
}
