//! weft-transport: the direct data path between pipeline stages (issue #16).
//!
//! A UDF sends to the next vertex without the inter-step buffer: the target's vertex domain is
//! resolved through DNS ([`resolve`]), a [`Sender`] keeps a link to every peer and spreads
//! messages over them, a [`Receiver`] on the second NIC hands each message to the user's
//! handler and acknowledges it once the handler succeeded (or, read in batches, a
//! [`PullReceiver`] lets the caller fetch several and acknowledge each). Duplicates are dropped by id,
//! unacknowledged messages are resent when a link fails, the in-flight window applies
//! Numaflow's `onFull` choices, and watermarks flow with the data and in idle frames.
//!
//! Backends move the frames: [`tcp`] (the default), [`shm`] (peers on one node), and
//! [`fallback::Fallback`] to use shared memory where the peer is on this node and TCP elsewhere;
//! RDMA verbs (`rdma`) and GPU memory (`gpu`) are behind features. The protocol is the same on
//! all of them ([`protocol`]). See `docs/transport.md` for the whole picture.

pub mod backend;
pub mod conformance;
pub mod fallback;
#[cfg(feature = "gpu")]
pub mod gpu;
pub mod policy;
pub mod protocol;
pub mod pull;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod recv;
pub mod resolve;
pub mod send;
pub mod shm;
pub mod tcp;

pub use backend::{Backend, Frame, FrameListener, FrameReader, FrameWriter};
pub use policy::{Backoff, InFlightLimit, OnFull, Selection};
pub use protocol::{Message, NO_WATERMARK};
pub use pull::{Fetched, PullError, PullReceiver};
pub use recv::{DEFAULT_PORT, Handler, LISTEN_ENV, Receiver, ReceiverConfig, ReceiverStats};
pub use resolve::{DnsPeers, Nameservers, PeerSet, PeerSource, StaticPeers};
pub use send::{AckHandle, SendError, Sender, SenderConfig, SenderStats, Sent};
pub use tcp::{TcpBackend, TcpConfig};
