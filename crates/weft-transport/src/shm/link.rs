//! The unix socket that stays open after the handshake: the doorbell (one byte means "look at
//! the rings again") and the liveness signal (end of stream means the peer is gone).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::net::{SendFlags, Shutdown};
use tokio::net::UnixStream;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// What the socket's reading task tells the local halves.
#[derive(Default)]
pub(super) struct Wake {
    /// Wakes the local reader (a bell may mean new data in the ring it reads).
    pub(super) data: Notify,
    /// Wakes the local writer (a bell may mean space given back in the ring it writes).
    pub(super) space: Notify,
    /// The socket reached end of stream or failed: the peer process is gone or let go of the
    /// link entirely.
    pub(super) peer_gone: AtomicBool,
}

/// One side's end of a link: the socket, its reading task and a name for errors.
pub(super) struct Link {
    pub(super) name: String,
    sock: Arc<UnixStream>,
    pub(super) wake: Arc<Wake>,
    listen: JoinHandle<()>,
}

impl Link {
    /// Starts listening for bells on `sock` (the handshake is over: every byte now is a bell).
    pub(super) fn start(name: String, sock: UnixStream) -> Arc<Link> {
        let sock = Arc::new(sock);
        let wake = Arc::new(Wake::default());
        let listen = tokio::spawn(listen(Arc::clone(&sock), Arc::clone(&wake)));
        Arc::new(Link { name, sock, wake, listen })
    }

    /// Rings the peer's bell. Callable from any thread (a payload lease may be dropped outside
    /// the runtime): one non-blocking `send`. If the socket buffer is full the peer has bells
    /// it has not read yet, each of which makes it look at both rings again, so nothing is
    /// lost; if the peer is gone there is nobody to wake.
    pub(super) fn ring(&self) {
        let _ = rustix::net::send(&*self.sock, &[1], SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
    }

    pub(super) fn peer_gone(&self) -> bool {
        self.wake.peer_gone.load(Ordering::SeqCst)
    }

    /// An error naming this link.
    pub(super) fn error(&self, kind: io::ErrorKind, what: impl std::fmt::Display) -> io::Error {
        io::Error::new(kind, format!("{}: {what}", self.name))
    }
}

#[cfg(test)]
impl Link {
    /// Ends the stream as a dying process would, without the halves' orderly close.
    pub(super) fn kill(&self) {
        let _ = rustix::net::shutdown(&*self.sock, Shutdown::Both);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // Both halves and every payload lease of this side are gone: end the stream now (the
        // peer sees end of stream at once, whether or not our listening task still runs).
        let _ = rustix::net::shutdown(&*self.sock, Shutdown::Both);
        self.listen.abort();
    }
}

async fn listen(sock: Arc<UnixStream>, wake: Arc<Wake>) {
    let mut buf = [0u8; 256];
    loop {
        if sock.readable().await.is_err() {
            break;
        }
        match sock.try_read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {
                wake.data.notify_one();
                wake.space.notify_one();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    wake.peer_gone.store(true, Ordering::SeqCst);
    wake.data.notify_one();
    wake.space.notify_one();
}
