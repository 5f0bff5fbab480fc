//! What travels on the TCP side channel of an RDMA link, and the RDMA control message: pure
//! encoding and decoding, and the async exchange helpers over any stream.
//!
//! # Hello (both directions, first)
//!
//! 72 bytes, integers little-endian:
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0 | 8 | magic `WEFTRDMA` |
//! | 8 | 2 | version, [`VERSION`] (1) |
//! | 10 | 1 | link layer (1 InfiniBand, 2 Ethernet/RoCE) |
//! | 11 | 1 | active MTU (`enum ibv_mtu`, 1 = 256 … 5 = 4096) |
//! | 12 | 2 | LID (InfiniBand) |
//! | 14 | 1 | port number |
//! | 15 | 1 | reserved, 0 |
//! | 16 | 16 | GID (RoCE: the address's GID) |
//! | 32 | 4 | QP number (24 bits) |
//! | 36 | 4 | first packet sequence number (24 bits) |
//! | 40 | 8 | receive ring address |
//! | 48 | 8 | receive ring capacity (bytes, a multiple of 64) |
//! | 56 | 4 | receive ring rkey |
//! | 60 | 4 | records the sender may have in flight |
//! | 64 | 4 | largest frame header accepted |
//! | 68 | 4 | reserved, 0 |
//!
//! # Status (both directions, after each side brought its QP to RTS)
//!
//! One byte, 0 = ready; or 1 = refused, then a `u16` length and that many bytes of UTF-8 saying
//! why. A side sends data only after both said ready, so no write reaches a QP that cannot
//! take it.
//!
//! # Side messages (both directions, until the end)
//!
//! Nine bytes: a tag and a `u64`. Tag 1, *writer closed*: the side's writer was dropped after
//! that many frames, so the peer's reader returns `None` once it has them all. Tag 2, *reader
//! closed* (value 0): nobody reads any more, so the peer's writer fails. End of stream without
//! a writer-closed message means the peer went away (its process died): the link fails.
//!
//! # Control message (RDMA SEND, into a 64-byte receive slot)
//!
//! 24 bytes: tag 1 (one byte), 7 bytes of zero, the position up to which the receiver gave its
//! ring back (`u64`), the number of records it released (`u64`).

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::ring::{MAX_RING, MIN_RING, RECORD_ALIGN};

/// The hello's first bytes.
pub const MAGIC: &[u8; 8] = b"WEFTRDMA";
/// The side-channel protocol version.
pub const VERSION: u16 = 1;
/// The hello's length.
pub const HELLO_LEN: usize = 72;
/// A side message's length.
pub const SIDE_LEN: usize = 9;
/// A control message's length.
pub const CONTROL_LEN: usize = 24;
/// The longest refusal reason sent.
pub const MAX_REASON: usize = 1024;

/// One side's connection parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// `IBV_LINK_LAYER_INFINIBAND` (1) or `IBV_LINK_LAYER_ETHERNET` (2).
    pub link_layer: u8,
    /// The port's active MTU (`enum ibv_mtu`).
    pub mtu: u8,
    /// The port's LID (InfiniBand).
    pub lid: u16,
    /// The port number.
    pub port: u8,
    /// The GID (RoCE routes by it).
    pub gid: [u8; 16],
    /// The queue pair number.
    pub qpn: u32,
    /// The first packet sequence number this side sends with.
    pub psn: u32,
    /// Where the peer writes records.
    pub ring_addr: u64,
    /// The ring's size.
    pub ring_capacity: u64,
    /// The key for writing to the ring.
    pub ring_rkey: u32,
    /// How many records the peer may have in flight to this side.
    pub max_records: u32,
    /// The largest frame header this side accepts.
    pub max_header: u32,
}

impl Hello {
    /// The 72-byte encoding.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..8].copy_from_slice(MAGIC);
        b[8..10].copy_from_slice(&VERSION.to_le_bytes());
        b[10] = self.link_layer;
        b[11] = self.mtu;
        b[12..14].copy_from_slice(&self.lid.to_le_bytes());
        b[14] = self.port;
        b[16..32].copy_from_slice(&self.gid);
        b[32..36].copy_from_slice(&self.qpn.to_le_bytes());
        b[36..40].copy_from_slice(&self.psn.to_le_bytes());
        b[40..48].copy_from_slice(&self.ring_addr.to_le_bytes());
        b[48..56].copy_from_slice(&self.ring_capacity.to_le_bytes());
        b[56..60].copy_from_slice(&self.ring_rkey.to_le_bytes());
        b[60..64].copy_from_slice(&self.max_records.to_le_bytes());
        b[64..68].copy_from_slice(&self.max_header.to_le_bytes());
        b
    }

    /// Decodes and checks a hello; the error names the field and its value.
    pub fn decode(b: &[u8; HELLO_LEN]) -> Result<Self, String> {
        if &b[0..8] != MAGIC {
            return Err(format!(
                "not a weft RDMA endpoint: the hello starts with {:?}, expected {:?}",
                String::from_utf8_lossy(&b[0..8]),
                String::from_utf8_lossy(MAGIC)
            ));
        }
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(w)
        };
        let version = u16_at(8);
        if version != VERSION {
            return Err(format!("hello version {version} at offset 8, this side speaks {VERSION}"));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        let h = Hello {
            link_layer: b[10],
            mtu: b[11],
            lid: u16_at(12),
            port: b[14],
            gid,
            qpn: u32_at(32),
            psn: u32_at(36),
            ring_addr: u64_at(40),
            ring_capacity: u64_at(48),
            ring_rkey: u32_at(56),
            max_records: u32_at(60),
            max_header: u32_at(64),
        };
        if !(1..=2).contains(&h.link_layer) {
            return Err(format!(
                "hello link layer {} at offset 10: expected 1 (InfiniBand) or 2 (Ethernet)",
                h.link_layer
            ));
        }
        if !(1..=5).contains(&h.mtu) {
            return Err(format!("hello MTU code {} at offset 11: expected 1 (256) to 5 (4096)", h.mtu));
        }
        if h.qpn == 0 || h.qpn > 0xff_ffff {
            return Err(format!("hello QP number {:#x} at offset 32: not a 24-bit QP number", h.qpn));
        }
        if h.psn > 0xff_ffff {
            return Err(format!("hello PSN {:#x} at offset 36: over 24 bits", h.psn));
        }
        if h.ring_capacity < MIN_RING || h.ring_capacity > MAX_RING || !h.ring_capacity.is_multiple_of(RECORD_ALIGN) {
            return Err(format!(
                "hello ring capacity {} at offset 48: must be a multiple of {RECORD_ALIGN} \
                 between {MIN_RING} and {MAX_RING}",
                h.ring_capacity
            ));
        }
        if h.max_records == 0 {
            return Err("hello records in flight at offset 60 is 0".into());
        }
        if b[15] != 0 || b[68..72] != [0; 4] {
            return Err("hello reserved bytes (offsets 15, 68-71) are not zero".into());
        }
        Ok(h)
    }
}

/// A side message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The writer was dropped after this many frames.
    WriterClosed(u64),
    /// The reader was dropped.
    ReaderClosed,
}

impl Side {
    /// The nine-byte encoding.
    pub fn encode(&self) -> [u8; SIDE_LEN] {
        let (tag, value) = match *self {
            Side::WriterClosed(n) => (1u8, n),
            Side::ReaderClosed => (2u8, 0),
        };
        let mut b = [0u8; SIDE_LEN];
        b[0] = tag;
        b[1..9].copy_from_slice(&value.to_le_bytes());
        b
    }

    /// Decodes one side message.
    pub fn decode(b: &[u8; SIDE_LEN]) -> Result<Self, String> {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[1..9]);
        let value = u64::from_le_bytes(w);
        match (b[0], value) {
            (1, n) => Ok(Side::WriterClosed(n)),
            (2, 0) => Ok(Side::ReaderClosed),
            (2, v) => Err(format!("reader-closed side message with value {v}, expected 0")),
            (t, _) => Err(format!("side message with tag {t}, expected 1 or 2")),
        }
    }
}

/// The control message: (ring given back up to, records released).
pub fn encode_control(tail: u64, released: u64) -> [u8; CONTROL_LEN] {
    let mut b = [0u8; CONTROL_LEN];
    b[0] = 1;
    b[8..16].copy_from_slice(&tail.to_le_bytes());
    b[16..24].copy_from_slice(&released.to_le_bytes());
    b
}

/// Decodes a control message of `len` bytes (the completion's byte count) from its slot.
pub fn decode_control(slot: &[u8], len: usize) -> Result<(u64, u64), String> {
    if len != CONTROL_LEN || slot.len() < CONTROL_LEN {
        return Err(format!("control message of {len} bytes, expected {CONTROL_LEN}"));
    }
    if slot[0] != 1 || slot[1..8] != [0; 7] {
        return Err(format!("control message tag {}, expected 1", slot[0]));
    }
    let word = |o: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&slot[o..o + 8]);
        u64::from_le_bytes(w)
    };
    Ok((word(8), word(16)))
}

/// Sends our hello and reads the peer's (both sides write first, so neither waits on the
/// other; the messages fit any socket buffer).
pub async fn exchange_hello<S>(stream: &mut S, ours: &Hello) -> io::Result<Hello>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(&ours.encode()).await?;
    stream.flush().await?;
    let mut b = [0u8; HELLO_LEN];
    stream.read_exact(&mut b).await.map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the side channel before its hello (it could not set up its end: no usable RDMA port, or out of memory; its log says)",
            )
        } else {
            e
        }
    })?;
    Hello::decode(&b).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Sends our status (ready, or refused with a reason) and reads the peer's. Returns an error
/// when either side refused, with the reason.
pub async fn exchange_status<S>(stream: &mut S, ours: Result<(), &str>) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut out = Vec::new();
    match ours {
        Ok(()) => out.push(0u8),
        Err(reason) => {
            let mut end = reason.len().min(MAX_REASON);
            while !reason.is_char_boundary(end) {
                end -= 1;
            }
            out.push(1);
            out.extend_from_slice(&(end as u16).to_le_bytes());
            out.extend_from_slice(&reason.as_bytes()[..end]);
        }
    }
    stream.write_all(&out).await?;
    stream.flush().await?;
    let theirs = read_status(stream).await;
    if let Err(reason) = ours {
        return Err(io::Error::other(format!("refused the peer: {reason}")));
    }
    theirs?.map_err(|r| io::Error::new(io::ErrorKind::ConnectionRefused, format!("the peer refused: {r}")))
}

async fn read_status<S: AsyncRead + Unpin>(stream: &mut S) -> io::Result<Result<(), String>> {
    let mut tag = [0u8; 1];
    stream.read_exact(&mut tag).await.map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed the side channel before saying it was ready")
        } else {
            e
        }
    })?;
    match tag[0] {
        0 => Ok(Ok(())),
        1 => {
            let mut len = [0u8; 2];
            stream.read_exact(&mut len).await?;
            let len = u16::from_le_bytes(len) as usize;
            if len > MAX_REASON {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("refusal reason of {len} bytes, at most {MAX_REASON}"),
                ));
            }
            let mut reason = vec![0u8; len];
            stream.read_exact(&mut reason).await?;
            Ok(Err(String::from_utf8_lossy(&reason).into_owned()))
        }
        t => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("status tag {t}, expected 0 (ready) or 1 (refused)"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Hello {
        Hello {
            link_layer: 2,
            mtu: 3,
            lid: 0,
            port: 1,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 7],
            qpn: 0x11,
            psn: 0xabcdef,
            ring_addr: 0x7f00_0000_1000,
            ring_capacity: 1 << 25,
            ring_rkey: 0x1234,
            max_records: 256,
            max_header: 65536,
        }
    }

    #[test]
    fn hello_round_trips() {
        let h = sample();
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
    }

    #[test]
    fn bad_hellos_name_the_field() {
        type Mutation = Box<dyn Fn(&mut [u8; HELLO_LEN])>;
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|b| b[0] = b'X'), "not a weft RDMA endpoint"),
            (Box::new(|b| b[8] = 2), "version 2"),
            (Box::new(|b| b[10] = 0), "link layer 0"),
            (Box::new(|b| b[11] = 6), "MTU code 6"),
            (Box::new(|b| b[32..36].copy_from_slice(&0x0100_0000u32.to_le_bytes())), "QP number"),
            (Box::new(|b| b[32..36].copy_from_slice(&0u32.to_le_bytes())), "QP number"),
            (Box::new(|b| b[39] = 1), "PSN"),
            (Box::new(|b| b[48..56].copy_from_slice(&100u64.to_le_bytes())), "ring capacity 100"),
            (Box::new(|b| b[48..56].copy_from_slice(&4100u64.to_le_bytes())), "ring capacity 4100"),
            (Box::new(|b| b[60..64].copy_from_slice(&0u32.to_le_bytes())), "records in flight"),
            (Box::new(|b| b[70] = 1), "reserved"),
        ];
        for (mutate, want) in cases {
            let mut b = sample().encode();
            mutate(&mut b);
            let err = Hello::decode(&b).expect_err(want);
            assert!(err.contains(want), "{err:?} should mention {want:?}");
        }
    }

    #[test]
    fn side_messages_round_trip_and_unknown_tags_are_errors() {
        for m in [Side::WriterClosed(0), Side::WriterClosed(u64::MAX), Side::ReaderClosed] {
            assert_eq!(Side::decode(&m.encode()), Ok(m));
        }
        let mut b = Side::ReaderClosed.encode();
        b[0] = 9;
        assert!(Side::decode(&b).expect_err("tag").contains("tag 9"));
        b[0] = 2;
        b[1] = 1;
        assert!(Side::decode(&b).is_err());
    }

    #[test]
    fn control_messages_round_trip_and_are_checked() {
        let c = encode_control(1 << 40, 77);
        let mut slot = [0u8; 64];
        slot[..CONTROL_LEN].copy_from_slice(&c);
        assert_eq!(decode_control(&slot, CONTROL_LEN), Ok((1 << 40, 77)));
        assert!(decode_control(&slot, 23).is_err());
        slot[0] = 2;
        assert!(decode_control(&slot, CONTROL_LEN).is_err());
    }
}
