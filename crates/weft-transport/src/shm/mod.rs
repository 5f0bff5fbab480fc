//! The shared-memory backend, for peers on the same node: a frame crosses with one copy (the
//! writer's, into the shared ring) and the reader gets its payload as a [`Bytes`](bytes::Bytes) over the ring
//! itself, with no copy out.
//!
//! # Rendezvous
//!
//! Pods on one node share no IPC namespace, and abstract unix sockets are per network
//! namespace, so the two sides meet in a directory both mount (a `hostPath`, by default
//! [`DEFAULT_DIR`], or [`DIR_ENV`] through [`ShmBackend::from_env`]). A listener bound on
//! `10.1.2.3:7000` creates the unix socket `<dir>/10.1.2.3_7000.sock`; the address is the one the
//! same stage listens on over TCP, so a sender that resolved a peer address tries shared memory
//! first and falls back to TCP: [`ShmBackend::connect`] fails with [`io::ErrorKind::NotFound`]
//! when no socket exists for the peer, or when the file is left over with no listener behind it
//! (see also [`ShmBackend::reaches`]). Who may connect is decided by the directory's permissions.
//!
//! # Setup
//!
//! The connecting side creates both rings of the link (a link is two-way: acks flow back), each
//! a memfd sized with `ftruncate`, sealed (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`) and
//! mapped shared, and passes the two descriptors over the unix socket with `SCM_RIGHTS` in a
//! 32-byte hello (magic, version, the connector's own address if it was given one). The listener
//! checks each ring before using it: the seal against shrinking must be there (so a peer can
//! never truncate the file under our mapping and turn our reads into SIGBUS), the size must
//! match the control page and lie within [`ShmConfig::max_ring_size`], the state must be fresh.
//! It answers with an accept or a rejection naming the reason, which the connector returns as
//! its error. The connector's ring size ([`ShmConfig::ring_size`], default 64 MiB so 4 MiB
//! frames pipeline) applies to both directions; memory is charged to whichever process first
//! touches a page, in practice the writer.
//!
//! # Doorbell and liveness
//!
//! After the hello the unix socket stays open as the doorbell: one byte means "look at the rings
//! again", end of stream means the peer is gone (its process died, or it dropped everything of
//! the link). A side parks only after raising its waiting flag in the ring's control page and
//! looking once more (a `SeqCst` fence on each side, the usual flag-and-recheck handshake), and
//! the other side rings only when it sees the flag after publishing or giving space back, so a
//! busy link makes no syscalls at all and an idle one never busy-polls. The socket was chosen
//! over an eventfd because it is needed anyway for the descriptors and it is the one primitive
//! that also reports the peer's death (the kernel closes it); an eventfd would need a second
//! liveness channel, a futex one more. Bells are read by a small task on the runtime that made
//! the link, which wakes both local halves; spurious wake-ups only cost a look at the ring.
//!
//! # Ring layout
//!
//! A ring is a 4 KiB control page — magic, version, capacity; `head` (bytes published, written
//! by the writer alone), `tail` (bytes given back, by the reader alone), each side's `closed`
//! flag and waiting flag, on separate cache lines — then the data area. Positions are monotone
//! byte counts; the offset is the position modulo the capacity. A record is 64-byte aligned: a
//! 16-byte record header (tag, frame-header length, payload length), the frame header, padding
//! to 64, the payload, padding to 64. A record never wraps: when it does not fit before the
//! end, the writer publishes a skip marker for the rest of the ring and carries on at offset 0.
//! The writer copies a record in, then publishes it by storing `head` (`Release`); the reader
//! loads `head` (`Acquire`), so it sees only whole records — a writer killed half-way through a
//! copy leaves nothing visible. A frame larger than the ring is an `InvalidInput` error naming
//! both sizes; a frame that fits but finds the ring full waits for space (backpressure).
//!
//! # Leases and reclaiming space
//!
//! The frame header is copied out (it is small and the protocol layer may keep parts of it);
//! the payload is handed out with [`Bytes::from_owner`](bytes::Bytes::from_owner) over a lease on its record. When the
//! last clone is dropped — on any thread — the record is marked released, and the tail moves
//! over the released *prefix* only: a later record dropped before an earlier one frees nothing
//! until the earlier one goes too. Holding payloads therefore holds ring space, and a writer
//! with a full ring waits until they are dropped. Leases keep the mapping alive, so a payload
//! stays valid after the reader, the link, or the peer process is gone.
//!
//! # Trust
//!
//! The peer is trusted not to be malicious but not to be bug-free. Everything read from the
//! shared region is read once and checked before use: `head` and `tail` are monotone, aligned,
//! and never a ring apart more than the capacity; a record's tag is known and its lengths keep
//! it inside both the ring and the published data. A failed check breaks that half of the link
//! with an `InvalidData` error naming the link; it never reads outside the mapping or panics.
//! What a faulty peer can still do is change payload bytes it has already published, which
//! changes what a handler sees and nothing else.
//!
//! # Closing
//!
//! Dropping a writer marks its ring closed: the peer's reader returns the frames still in the
//! ring, then `Ok(None)`. Dropping a reader marks its ring closed: the peer's writer fails with
//! `BrokenPipe`. If the peer dies, its frames already published are still read, then the reader
//! fails with `UnexpectedEof`; the writer fails with `BrokenPipe`.

mod link;
mod region;
mod ring;

use std::hash::BuildHasher;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{UnixListener, UnixStream};

pub use ring::{RingState, ShmReader, ShmWriter};

use crate::backend::{Backend, FrameListener, Setups, is_setup_failure};
use link::Link;
use region::Region;

/// Where listeners put their sockets unless told otherwise: a `hostPath` every pod of the node
/// that uses shared memory mounts at the same place.
pub const DEFAULT_DIR: &str = "/run/weft/transport";
/// Environment variable [`ShmBackend::from_env`] reads the rendezvous directory from.
pub const DIR_ENV: &str = "WEFT_SHM_DIR";
/// Default ring size per direction: 64 MiB, so 4 MiB frames pipeline.
pub const DEFAULT_RING_SIZE: usize = 64 << 20;
/// Default largest ring a listener accepts from a connector: 1 GiB.
pub const DEFAULT_MAX_RING_SIZE: usize = 1 << 30;

const HELLO_MAGIC: &[u8; 8] = b"WEFTSHMH";
const REPLY_MAGIC: &[u8; 8] = b"WEFTSHMA";
const HELLO_LEN: usize = 32;
/// Longest unix socket path (`sun_path` is 108 bytes including the terminating NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Settings of a [`ShmBackend`].
#[derive(Clone, Debug)]
pub struct ShmConfig {
    /// The rendezvous directory (shared by every pod of the node that uses shared memory).
    pub dir: PathBuf,
    /// Data bytes of each ring this side creates when it connects (a multiple of 4096).
    pub ring_size: usize,
    /// The largest ring a listener accepts from a connecting peer.
    pub max_ring_size: usize,
    /// How long a listener waits for a connecting peer's hello, and a connector for the answer.
    pub handshake_timeout: Duration,
    /// This side's own address, told to the listener in the hello and returned by its
    /// `accept`; without it the listener reports `0.0.0.0:0`.
    pub local_addr: Option<SocketAddr>,
}

impl Default for ShmConfig {
    fn default() -> Self {
        Self {
            dir: PathBuf::from(DEFAULT_DIR),
            ring_size: DEFAULT_RING_SIZE,
            max_ring_size: DEFAULT_MAX_RING_SIZE,
            handshake_timeout: Duration::from_secs(10),
            local_addr: None,
        }
    }
}

/// Frames between processes on one node through shared memory; see the [module docs](self).
#[derive(Clone, Debug)]
pub struct ShmBackend {
    config: Arc<ShmConfig>,
}

impl ShmBackend {
    /// A backend meeting its peers in `dir`, with default settings.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self::with_config(ShmConfig { dir: dir.into(), ..ShmConfig::default() })
    }

    /// A backend with the given settings (checked when a link is made).
    pub fn with_config(config: ShmConfig) -> Self {
        Self { config: Arc::new(config) }
    }

    /// A backend meeting its peers in `$WEFT_SHM_DIR`, or [`DEFAULT_DIR`] when unset.
    pub fn from_env() -> Self {
        Self::new(std::env::var_os(DIR_ENV).map_or_else(|| PathBuf::from(DEFAULT_DIR), PathBuf::from))
    }

    /// Sets the size of the rings this side creates.
    pub fn ring_size(mut self, bytes: usize) -> Self {
        Arc::make_mut(&mut self.config).ring_size = bytes;
        self
    }

    /// Sets this side's own address, reported to the listeners it connects to.
    pub fn local_addr(mut self, addr: SocketAddr) -> Self {
        Arc::make_mut(&mut self.config).local_addr = Some(addr);
        self
    }

    /// The settings in use.
    pub fn config(&self) -> &ShmConfig {
        &self.config
    }

    /// The socket a listener on `addr` binds: `<dir>/<ip>_<port>.sock`.
    pub fn socket_path(&self, addr: SocketAddr) -> PathBuf {
        self.config.dir.join(format!("{}_{}.sock", addr.ip(), addr.port()))
    }

    /// Whether a listener for `peer` has its socket in the rendezvous directory (that is, the
    /// peer is on this node and listens for shared memory). A leftover socket of a listener
    /// that died also counts; `connect` then fails with `NotFound`.
    pub fn reaches(&self, peer: SocketAddr) -> bool {
        std::fs::metadata(self.socket_path(peer)).is_ok_and(|m| m.file_type().is_socket())
    }

    async fn open(&self, peer: SocketAddr) -> io::Result<(ShmWriter, ShmReader)> {
        let cfg = &*self.config;
        let path = self.socket_path(peer);
        let name = format!("shm link to {peer} ({})", path.display());
        region::check_capacity(cfg.ring_size, usize::MAX - region::CONTROL_SIZE)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{name}: {e}")))?;
        let mut stream = match UnixStream::connect(&path).await {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no shm listener for {peer}: {} does not exist", path.display()),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no shm listener for {peer}: nobody listens on {} (left over)", path.display()),
                ));
            }
            Err(e) => return Err(io::Error::new(e.kind(), format!("{name}: connect: {e}"))),
        };
        let (tx, tx_fd) = Region::create(cfg.ring_size)?;
        let (rx, rx_fd) = Region::create(cfg.ring_size)?;
        let hello = encode_hello(cfg.local_addr);
        let handshake = async {
            send_with_fds(&mut stream, &hello, [tx_fd.as_fd(), rx_fd.as_fd()]).await?;
            read_reply(&mut stream).await
        };
        match tokio::time::timeout(cfg.handshake_timeout, handshake).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(reason))) => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!("{name}: the listener rejected the link: {reason}"),
                ));
            }
            Ok(Err(e)) => return Err(io::Error::new(e.kind(), format!("{name}: handshake: {e}"))),
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{name}: no answer to the hello within {:?}", cfg.handshake_timeout),
                ));
            }
        }
        drop((tx_fd, rx_fd));
        let link = Link::start(name, stream);
        Ok((ShmWriter::new(Arc::clone(&link), tx), ShmReader::new(link, rx)))
    }

    async fn listen(&self, local: SocketAddr) -> io::Result<ShmListener> {
        let dir = &self.config.dir;
        std::fs::create_dir_all(dir).map_err(|e| {
            io::Error::new(e.kind(), format!("creating the shm rendezvous directory {}: {e}", dir.display()))
        })?;
        if local.port() != 0 {
            let path = self.socket_path(local);
            let listener = bind_socket(&path, true)?;
            return ShmListener::new(listener, path, local, Arc::clone(&self.config));
        }
        // Port 0: pick a free name in the dynamic port range, as the kernel would pick a port.
        let start = std::collections::hash_map::RandomState::new().hash_one(std::process::id()) as u16;
        for i in 0..16384u16 {
            let addr = SocketAddr::new(local.ip(), 49152 + (start.wrapping_add(i) % 16384));
            let path = self.socket_path(addr);
            match bind_socket(&path, false) {
                Ok(listener) => {
                    return ShmListener::new(listener, path, addr, Arc::clone(&self.config));
                }
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("no free shm socket name for {} in {}", local.ip(), dir.display()),
        ))
    }
}

impl Backend for ShmBackend {
    type Writer = ShmWriter;
    type Reader = ShmReader;
    type Listener = ShmListener;

    fn name(&self) -> &'static str {
        "shm"
    }

    fn connect(&self, peer: SocketAddr) -> impl Future<Output = io::Result<(ShmWriter, ShmReader)>> + Send {
        self.open(peer)
    }

    fn bind(&self, local: SocketAddr) -> impl Future<Output = io::Result<ShmListener>> + Send {
        self.listen(local)
    }
}

/// Binds the unix socket at `path`. A leftover socket with nobody listening is replaced when
/// `replace_stale`; one with a live listener is `AddrInUse`.
fn bind_socket(path: &Path, replace_stale: bool) -> io::Result<UnixListener> {
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("shm socket path {} is {len} bytes; unix sockets allow at most {MAX_SOCKET_PATH}", path.display()),
        ));
    }
    match UnixListener::bind(path) {
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            let live = std::os::unix::net::UnixStream::connect(path).is_ok();
            if live || !replace_stale {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("shm socket {} is in use{}", path.display(), if live { " by a live listener" } else { "" }),
                ));
            }
            std::fs::remove_file(path).map_err(|e| {
                io::Error::new(e.kind(), format!("removing the leftover shm socket {}: {e}", path.display()))
            })?;
            UnixListener::bind(path)
        }
        other => other,
    }
    .map_err(|e| io::Error::new(e.kind(), format!("binding the shm socket {}: {e}", path.display())))
}

/// Accepts shared-memory links on one address.
pub struct ShmListener {
    setups: Setups<(ShmWriter, ShmReader, SocketAddr)>,
    path: PathBuf,
    addr: SocketAddr,
    /// Device and inode of our socket file, so `Drop` removes ours and not a successor's.
    ident: Option<(u64, u64)>,
}

impl ShmListener {
    fn new(listener: UnixListener, path: PathBuf, addr: SocketAddr, config: Arc<ShmConfig>) -> io::Result<Self> {
        let ident = std::fs::metadata(&path).ok().map(|m| (m.dev(), m.ino()));
        let socket = Arc::new(path.clone());
        let setups = Setups::start(
            listener,
            move |stream| {
                let (socket, config) = (Arc::clone(&socket), Arc::clone(&config));
                async move {
                    let timeout = config.handshake_timeout;
                    tokio::time::timeout(timeout, handshake(stream, &socket, &config)).await.unwrap_or_else(|_| {
                        Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("shm peer on {} sent no hello within {timeout:?}", socket.display()),
                        ))
                    })
                }
            },
            format!("shm socket {}", path.display()),
        );
        Ok(Self { setups, path, addr, ident })
    }

    /// The unix socket this listener bound.
    pub fn socket_path(&self) -> &Path {
        &self.path
    }
}

/// Reads the hello and the two ring descriptors, checks them, answers.
async fn handshake(
    mut stream: UnixStream,
    socket: &Path,
    config: &ShmConfig,
) -> io::Result<(ShmWriter, ShmReader, SocketAddr)> {
    let (hello, fds) = recv_with_fds(&mut stream).await?;
    let checked = check_hello(&hello, fds, config.max_ring_size);
    let (peer, from_peer, to_peer) = match checked {
        Ok(v) => v,
        Err(reason) => {
            let _ = write_reply(&mut stream, Err(&reason)).await;
            return Err(io::Error::new(io::ErrorKind::InvalidData, reason));
        }
    };
    write_reply(&mut stream, Ok(())).await?;
    let name = format!("shm link from {peer} ({})", socket.display());
    let link = Link::start(name, stream);
    // The connector's first ring carries its frames to us; the second carries ours back.
    Ok((ShmWriter::new(Arc::clone(&link), to_peer), ShmReader::new(link, from_peer), peer))
}

impl FrameListener for ShmListener {
    type Writer = ShmWriter;
    type Reader = ShmReader;

    /// The next link. Handshakes run side by side, each up to the handshake timeout: a peer
    /// whose hello is malformed or late is refused without holding up the others, and its
    /// refusal comes out of `accept` as a [`SetupFailed`](crate::backend::SetupFailed) error
    /// (the listener goes on).
    fn accept(&mut self) -> impl Future<Output = io::Result<(ShmWriter, ShmReader, SocketAddr)>> + Send {
        let path = &self.path;
        let next = self.setups.next();
        async move {
            next.await.map_err(|e| {
                if is_setup_failure(&e) {
                    e
                } else {
                    io::Error::new(e.kind(), format!("accepting on shm socket {}: {e}", path.display()))
                }
            })
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

impl Drop for ShmListener {
    fn drop(&mut self) {
        let ours = std::fs::metadata(&self.path).ok().map(|m| (m.dev(), m.ino()));
        if ours.is_some() && ours == self.ident {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn encode_hello(local: Option<SocketAddr>) -> [u8; HELLO_LEN] {
    let mut h = [0u8; HELLO_LEN];
    h[..8].copy_from_slice(HELLO_MAGIC);
    h[8..12].copy_from_slice(&(region::VERSION as u32).to_le_bytes());
    if let Some(addr) = local {
        match addr.ip() {
            IpAddr::V4(ip) => {
                h[12] = 4;
                h[13..17].copy_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                h[12] = 6;
                h[13..29].copy_from_slice(&ip.octets());
            }
        }
        h[29..31].copy_from_slice(&addr.port().to_le_bytes());
    }
    h
}

/// Checks a hello and maps the two rings: (the connector's address, its ring to us, ours to it).
fn check_hello(
    hello: &[u8; HELLO_LEN],
    fds: Vec<OwnedFd>,
    max_ring: usize,
) -> Result<(SocketAddr, Region, Region), String> {
    if &hello[..8] != HELLO_MAGIC {
        return Err("not a weft shm hello (bad magic)".into());
    }
    let version = u32::from_le_bytes([hello[8], hello[9], hello[10], hello[11]]);
    if u64::from(version) != region::VERSION {
        return Err(format!("hello of version {version}, this listener speaks {}", region::VERSION));
    }
    let port = u16::from_le_bytes([hello[29], hello[30]]);
    let ip = match hello[12] {
        0 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        4 => IpAddr::V4(Ipv4Addr::new(hello[13], hello[14], hello[15], hello[16])),
        6 => {
            let mut o = [0u8; 16];
            o.copy_from_slice(&hello[13..29]);
            IpAddr::V6(Ipv6Addr::from(o))
        }
        f => return Err(format!("hello with unknown address family {f}")),
    };
    let [from_peer, to_peer]: [OwnedFd; 2] = fds
        .try_into()
        .map_err(|fds: Vec<OwnedFd>| format!("hello carried {} descriptors, expected 2 rings", fds.len()))?;
    let from_peer = Region::open(&from_peer, max_ring).map_err(|e| format!("first ring: {e}"))?;
    let to_peer = Region::open(&to_peer, max_ring).map_err(|e| format!("second ring: {e}"))?;
    Ok((SocketAddr::new(ip, port), from_peer, to_peer))
}

async fn send_with_fds(stream: &mut UnixStream, bytes: &[u8], fds: [std::os::fd::BorrowedFd<'_>; 2]) -> io::Result<()> {
    let sent = stream
        .async_io(Interest::WRITABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
            let mut cmsg = SendAncillaryBuffer::new(&mut space);
            if !cmsg.push(SendAncillaryMessage::ScmRights(&fds)) {
                return Err(io::Error::other("no room for two descriptors in the control message"));
            }
            Ok(rustix::net::sendmsg(&*stream, &[IoSlice::new(bytes)], &mut cmsg, SendFlags::NOSIGNAL)?)
        })
        .await?;
    // The descriptors went with the first byte; the rest, if any, is plain data.
    stream.write_all(&bytes[sent..]).await
}

async fn recv_with_fds(stream: &mut UnixStream) -> io::Result<([u8; HELLO_LEN], Vec<OwnedFd>)> {
    let mut hello = [0u8; HELLO_LEN];
    let (n, fds, truncated) = stream
        .async_io(Interest::READABLE, || {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
            let mut cmsg = RecvAncillaryBuffer::new(&mut space);
            let mut iov = [IoSliceMut::new(&mut hello)];
            let msg = rustix::net::recvmsg(&*stream, &mut iov, &mut cmsg, RecvFlags::CMSG_CLOEXEC)?;
            let mut fds = Vec::new();
            for m in cmsg.drain() {
                if let RecvAncillaryMessage::ScmRights(rights) = m {
                    fds.extend(rights);
                }
            }
            Ok((msg.bytes, fds, msg.flags.contains(ReturnFlags::CTRUNC)))
        })
        .await?;
    if n == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed before its hello"));
    }
    if truncated {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "the hello carried more descriptors than the 2 rings"));
    }
    stream.read_exact(&mut hello[n..]).await?;
    Ok((hello, fds))
}

async fn write_reply(stream: &mut UnixStream, answer: Result<(), &str>) -> io::Result<()> {
    let mut reply = Vec::with_capacity(11);
    reply.extend_from_slice(REPLY_MAGIC);
    match answer {
        Ok(()) => reply.extend_from_slice(&[0, 0, 0]),
        Err(reason) => {
            let reason = &reason.as_bytes()[..reason.len().min(u16::MAX as usize)];
            reply.push(1);
            reply.extend_from_slice(&(reason.len() as u16).to_le_bytes());
            reply.extend_from_slice(reason);
        }
    }
    stream.write_all(&reply).await
}

/// The listener's answer: `Ok(Ok(()))` accepted, `Ok(Err(reason))` rejected.
async fn read_reply(stream: &mut UnixStream) -> io::Result<Result<(), String>> {
    let mut head = [0u8; 11];
    stream.read_exact(&mut head).await?;
    if &head[..8] != REPLY_MAGIC {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "the listener's answer is not a weft shm reply"));
    }
    let len = u16::from_le_bytes([head[9], head[10]]) as usize;
    let mut reason = vec![0u8; len];
    stream.read_exact(&mut reason).await?;
    match head[8] {
        0 => Ok(Ok(())),
        _ => Ok(Err(String::from_utf8_lossy(&reason).into_owned())),
    }
}

#[cfg(test)]
mod tests;
