//! The protocol every backend carries: messages, acknowledgements and watermarks, encoded in the
//! frame header. A frame's payload is the message's payload, untouched: it is never copied into
//! the header buffer, so a backend can write header and payload with one vectored write and hand
//! the payload to the receiver as the buffer it was read into.
//!
//! # Header layout
//!
//! All integers are little-endian. Every header starts with two bytes:
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 0 | 1 | version, [`VERSION`] (1) |
//! | 1 | 1 | kind: 1 hello, 2 data, 3 ack, 4 nack, 5 watermark, 6 alive |
//!
//! A *string* below is a `u16` byte length followed by that many bytes of UTF-8; a *long string*
//! has a `u32` length. Only data frames have a payload; the others carry an empty one.
//!
//! **Hello** (sender → receiver, the first frame of every link): who the sender is, so the
//! receiver can take the minimum watermark over its upstream senders rather than over links.
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 2 | 8 | watermark (`i64`, ms since the epoch; -1 = none yet) |
//! | 10 | 2+n | sender identity (string) |
//!
//! **Data** (sender → receiver): one message; the payload is the frame's payload.
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 2 | 2 | flags, 0 (reserved) |
//! | 4 | 8 | sequence number (`u64`, per link; acks name it) |
//! | 12 | 8 | event time (`i64`, ms since the epoch) |
//! | 20 | 8 | watermark (`i64`, ms since the epoch; -1 = none) |
//! | 28 | 2+n | message id (string, at least one byte) |
//! | … | 2 | number of keys |
//! | … | 2+n each | keys (strings) |
//! | … | 2 | number of headers |
//! | … | (2+n)+(4+m) each | header name (string), header value (long string) |
//!
//! **Ack** and **Nack** (receiver → sender): the sequence numbers whose handler succeeded
//! (ack) or failed (nack); a nack ends with the handler's error, for the sender's log.
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 2 | 4 | count (`u32`, at least 1) |
//! | 6 | 8 each | sequence numbers (`u64`) |
//! | … | 2+n | nack only: reason (string) |
//!
//! **Watermark** (sender → receiver): the sender's watermark when it has no data to carry it,
//! so an idle sender does not hold back the receiver's watermark.
//!
//! | offset | size | field |
//! |-------:|-----:|-------|
//! | 2 | 8 | watermark (`i64`) |
//!
//! **Alive** (receiver → sender): nothing but the two leading bytes. A receiver sends it when it
//! has written nothing else on a link for a while, so a sender can tell a receiver that is slow
//! (its handlers run, it still speaks) from one that hangs or is stopped (silent), and fail a
//! silent link rather than wait on it for ever.
//!
//! Decoding checks every length against what is left, rejects trailing bytes, unknown kinds and
//! versions, invalid UTF-8 and an empty id, and says which field at which offset was wrong; it
//! never panics on any input.

use std::collections::BTreeMap;
use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};

/// The protocol version written in every header.
pub const VERSION: u8 = 1;
/// A watermark or event time that is not known.
pub const NO_WATERMARK: i64 = -1;
/// The largest encoded header a peer accepts unless configured otherwise.
pub const DEFAULT_MAX_HEADER: usize = 64 * 1024;
/// The largest payload a peer accepts unless configured otherwise: 64 MiB, Numaflow's gRPC
/// message limit for UDFs.
pub const DEFAULT_MAX_PAYLOAD: usize = 64 * 1024 * 1024;

const KIND_HELLO: u8 = 1;
const KIND_DATA: u8 = 2;
const KIND_ACK: u8 = 3;
const KIND_NACK: u8 = 4;
const KIND_WATERMARK: u8 = 5;
const KIND_ALIVE: u8 = 6;

/// Bytes of a data header before the id: version, kind, flags, sequence, event time, watermark.
const DATA_FIXED: usize = 28;

/// One message between pipeline stages: Numaflow's message fields a UDF sees.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    /// Unique per message on the edge; the receiver drops duplicates by it. Numaflow's form is
    /// `<vertex>-<offset>-<index>`.
    pub id: String,
    /// The message's keys (reduce and routing use them).
    pub keys: Vec<String>,
    /// Event time, ms since the Unix epoch.
    pub event_time: i64,
    /// The watermark the message was produced under, ms since the Unix epoch; [`NO_WATERMARK`]
    /// when there is none.
    pub watermark: i64,
    /// User headers.
    pub headers: BTreeMap<String, String>,
    /// The payload, carried without copies through the protocol.
    pub payload: Bytes,
}

impl Message {
    /// A message with an id and a payload, no keys or headers, no event time or watermark.
    pub fn new(id: impl Into<String>, payload: impl Into<Bytes>) -> Self {
        Self {
            id: id.into(),
            keys: Vec::new(),
            event_time: NO_WATERMARK,
            watermark: NO_WATERMARK,
            headers: BTreeMap::new(),
            payload: payload.into(),
        }
    }

    /// The size of this message's encoded data header (without the payload).
    pub fn header_len(&self) -> usize {
        DATA_FIXED
            + 2
            + self.id.len()
            + 2
            + self.keys.iter().map(|k| 2 + k.len()).sum::<usize>()
            + 2
            + self.headers.iter().map(|(k, v)| 2 + k.len() + 4 + v.len()).sum::<usize>()
    }
}

/// A decoded header. Data frames are decoded together with their payload ([`decode`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Control {
    /// The first frame of a link: the sender's identity and watermark.
    Hello { sender: String, watermark: i64 },
    /// A message with the link's sequence number.
    Data { seq: u64, message: Message },
    /// The handler succeeded for these sequence numbers.
    Ack { seqs: Vec<u64> },
    /// The handler failed for these sequence numbers.
    Nack { seqs: Vec<u64>, reason: String },
    /// The sender's watermark, sent when no data carries it.
    Watermark { watermark: i64 },
    /// The receiver is alive (it had nothing else to send for a while).
    Alive,
}

/// A header that cannot be encoded: a field over its size limit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// A string field is longer than its length prefix allows.
    #[error("{field} is {len} bytes, over the protocol's limit of {limit} bytes")]
    FieldTooLong { field: &'static str, len: usize, limit: usize },
    /// A list has more entries than its count allows.
    #[error("{field} has {count} entries, over the protocol's limit of {limit}")]
    TooMany { field: &'static str, count: usize, limit: usize },
    /// The message id is empty.
    #[error("the message id is empty; every message needs a unique id for deduplication")]
    EmptyId,
    /// The whole header is larger than the configured limit.
    #[error("the encoded header is {len} bytes, over the limit of {limit} bytes (keys and headers too large)")]
    HeaderTooLarge { len: usize, limit: usize },
}

/// A header that cannot be decoded: which field, at which byte offset, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad frame header: {field} at byte {offset}: {why}")]
pub struct DecodeError {
    /// The field being read.
    pub field: &'static str,
    /// Its byte offset in the header.
    pub offset: usize,
    /// What is wrong.
    pub why: String,
}

/// Encodes a hello header.
pub fn encode_hello(out: &mut BytesMut, sender: &str, watermark: i64) -> Result<(), EncodeError> {
    check_str("sender identity", sender, u16::MAX as usize)?;
    out.reserve(2 + 8 + 2 + sender.len());
    out.put_u8(VERSION);
    out.put_u8(KIND_HELLO);
    out.put_i64_le(watermark);
    put_str(out, sender);
    Ok(())
}

/// Encodes the data header of `message` with sequence number `seq`; the payload is not touched.
/// `max_header` bounds the result.
pub fn encode_data(out: &mut BytesMut, seq: u64, message: &Message, max_header: usize) -> Result<(), EncodeError> {
    check_message(message, max_header)?;
    out.reserve(message.header_len());
    out.put_u8(VERSION);
    out.put_u8(KIND_DATA);
    out.put_u16_le(0);
    out.put_u64_le(seq);
    out.put_i64_le(message.event_time);
    out.put_i64_le(message.watermark);
    put_str(out, &message.id);
    out.put_u16_le(message.keys.len() as u16);
    for key in &message.keys {
        put_str(out, key);
    }
    out.put_u16_le(message.headers.len() as u16);
    for (name, value) in &message.headers {
        put_str(out, name);
        out.put_u32_le(value.len() as u32);
        out.put_slice(value.as_bytes());
    }
    Ok(())
}

/// Checks that `message` can be encoded with a header of at most `max_header` bytes.
pub fn check_message(message: &Message, max_header: usize) -> Result<(), EncodeError> {
    if message.id.is_empty() {
        return Err(EncodeError::EmptyId);
    }
    check_str("message id", &message.id, u16::MAX as usize)?;
    check_count("keys", message.keys.len())?;
    for key in &message.keys {
        check_str("a key", key, u16::MAX as usize)?;
    }
    check_count("headers", message.headers.len())?;
    for (name, value) in &message.headers {
        check_str("a header name", name, u16::MAX as usize)?;
        check_str("a header value", value, u32::MAX as usize)?;
    }
    let len = message.header_len();
    if len > max_header {
        return Err(EncodeError::HeaderTooLarge { len, limit: max_header });
    }
    Ok(())
}

/// Encodes an ack header for `seqs` (at least one).
pub fn encode_ack(out: &mut BytesMut, seqs: &[u64]) -> Result<(), EncodeError> {
    put_seqs(out, KIND_ACK, seqs)
}

/// Encodes a nack header for `seqs` (at least one) with the handler's `reason`, cut to fit.
pub fn encode_nack(out: &mut BytesMut, seqs: &[u64], reason: &str) -> Result<(), EncodeError> {
    put_seqs(out, KIND_NACK, seqs)?;
    put_str(out, truncate_utf8(reason, u16::MAX as usize));
    Ok(())
}

/// Encodes a watermark header.
pub fn encode_watermark(out: &mut BytesMut, watermark: i64) {
    out.reserve(10);
    out.put_u8(VERSION);
    out.put_u8(KIND_WATERMARK);
    out.put_i64_le(watermark);
}

/// Encodes an alive header.
pub fn encode_alive(out: &mut BytesMut) {
    out.reserve(2);
    out.put_u8(VERSION);
    out.put_u8(KIND_ALIVE);
}

/// Decodes a frame: its header, and for a data frame the payload becomes the message's payload
/// (no copy). A control frame with a non-empty payload is an error.
pub fn decode(header: &[u8], payload: Bytes) -> Result<Control, DecodeError> {
    let mut r = Cursor { buf: header, pos: 0 };
    let version = r.u8("version")?;
    if version != VERSION {
        return Err(r.error_at("version", 0, format!("version {version}, this peer speaks version {VERSION}")));
    }
    let kind = r.u8("kind")?;
    if kind != KIND_DATA && !payload.is_empty() {
        return Err(r.error_at(
            "kind",
            1,
            format!(
                "a control frame (kind {kind}) carries a {} byte payload; only data frames have one",
                payload.len()
            ),
        ));
    }
    let control = match kind {
        KIND_HELLO => {
            let watermark = r.i64("hello watermark")?;
            let sender = r.string("sender identity")?;
            Control::Hello { sender, watermark }
        }
        KIND_DATA => {
            let flags_at = r.pos;
            let flags = r.u16("flags")?;
            if flags != 0 {
                return Err(r.error_at("flags", flags_at, format!("{flags:#06x}, no flags are defined")));
            }
            let seq = r.u64("sequence number")?;
            let event_time = r.i64("event time")?;
            let watermark = r.i64("watermark")?;
            let id_at = r.pos;
            let id = r.string("message id")?;
            if id.is_empty() {
                return Err(r.error_at("message id", id_at, "empty".to_string()));
            }
            let count = r.u16("key count")?;
            let mut keys = Vec::with_capacity(usize::from(count).min(r.remaining() / 2));
            for _ in 0..count {
                keys.push(r.string("key")?);
            }
            let count = r.u16("header count")?;
            let mut headers = BTreeMap::new();
            for _ in 0..count {
                let name_at = r.pos;
                let name = r.string("header name")?;
                let value = r.long_string("header value")?;
                if headers.insert(name, value).is_some() {
                    return Err(r.error_at("header name", name_at, "repeated".to_string()));
                }
            }
            Control::Data { seq, message: Message { id, keys, event_time, watermark, headers, payload } }
        }
        KIND_ACK | KIND_NACK => {
            let count_at = r.pos;
            let count = r.u32("sequence count")? as usize;
            if count == 0 {
                return Err(r.error_at("sequence count", count_at, "zero".to_string()));
            }
            if count > r.remaining() / 8 {
                return Err(r.error_at(
                    "sequence count",
                    count_at,
                    format!("{count} sequence numbers announced, {} bytes left", r.remaining()),
                ));
            }
            let mut seqs = Vec::with_capacity(count);
            for _ in 0..count {
                seqs.push(r.u64("sequence number")?);
            }
            if kind == KIND_ACK {
                Control::Ack { seqs }
            } else {
                let reason = r.string("nack reason")?;
                Control::Nack { seqs, reason }
            }
        }
        KIND_WATERMARK => Control::Watermark { watermark: r.i64("watermark")? },
        KIND_ALIVE => Control::Alive,
        other => {
            return Err(r.error_at("kind", 1, format!("unknown kind {other}")));
        }
    };
    if r.remaining() != 0 {
        return Err(r.error_at("end of header", r.pos, format!("{} trailing bytes", r.remaining())));
    }
    Ok(control)
}

fn put_seqs(out: &mut BytesMut, kind: u8, seqs: &[u64]) -> Result<(), EncodeError> {
    if seqs.is_empty() || seqs.len() > u32::MAX as usize {
        return Err(EncodeError::TooMany {
            field: "acknowledged sequence numbers",
            count: seqs.len(),
            limit: u32::MAX as usize,
        });
    }
    out.reserve(6 + 8 * seqs.len());
    out.put_u8(VERSION);
    out.put_u8(kind);
    out.put_u32_le(seqs.len() as u32);
    for seq in seqs {
        out.put_u64_le(*seq);
    }
    Ok(())
}

fn put_str(out: &mut BytesMut, s: &str) {
    out.put_u16_le(s.len() as u16);
    out.put_slice(s.as_bytes());
}

fn check_str(field: &'static str, s: &str, limit: usize) -> Result<(), EncodeError> {
    if s.len() > limit {
        return Err(EncodeError::FieldTooLong { field, len: s.len(), limit });
    }
    Ok(())
}

fn check_count(field: &'static str, count: usize) -> Result<(), EncodeError> {
    if count > u16::MAX as usize {
        return Err(EncodeError::TooMany { field, count, limit: u16::MAX as usize });
    }
    Ok(())
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn error_at(&self, field: &'static str, offset: usize, why: String) -> DecodeError {
        DecodeError { field, offset, why }
    }

    fn take(&mut self, field: &'static str, n: usize) -> Result<&[u8], DecodeError> {
        if n > self.remaining() {
            return Err(self.error_at(
                field,
                self.pos,
                format!("needs {n} bytes, the header ends after {} (truncated)", self.remaining()),
            ));
        }
        let start = self.pos;
        self.pos += n;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(field, N)?);
        Ok(out)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    fn i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.array(field)?))
    }

    fn utf8(&mut self, field: &'static str, len: usize) -> Result<String, DecodeError> {
        let at = self.pos;
        let bytes = self.take(field, len)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(e) => Err(self.error_at(field, at, format!("not UTF-8: {e}"))),
        }
    }

    fn string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let len = self.u16(field)?;
        self.utf8(field, usize::from(len))
    }

    fn long_string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        let len = self.u32(field)? as usize;
        self.utf8(field, len)
    }
}

impl fmt::Display for Control {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Control::Hello { sender, .. } => write!(f, "hello from {sender}"),
            Control::Data { seq, message } => write!(f, "data #{seq} id {}", message.id),
            Control::Ack { seqs } => write!(f, "ack of {} messages", seqs.len()),
            Control::Nack { seqs, .. } => write!(f, "nack of {} messages", seqs.len()),
            Control::Watermark { watermark } => write!(f, "watermark {watermark}"),
            Control::Alive => write!(f, "alive"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Message {
        let mut m = Message::new("in-17-0", Bytes::from_static(b"frame"));
        m.keys = vec!["camera-1".into(), "".into()];
        m.event_time = 1_700_000_000_123;
        m.watermark = 1_700_000_000_000;
        m.headers.insert("trace".into(), "abc".into());
        m
    }

    fn data_header(seq: u64, m: &Message) -> BytesMut {
        let mut out = BytesMut::new();
        encode_data(&mut out, seq, m, DEFAULT_MAX_HEADER).expect("encodes");
        out
    }

    #[test]
    fn data_layout_has_the_documented_offsets() {
        let m = sample();
        let h = data_header(0x0102_0304_0506_0708, &m);
        assert_eq!(h.len(), m.header_len());
        assert_eq!(h[0], VERSION);
        assert_eq!(h[1], KIND_DATA);
        assert_eq!(&h[2..4], &[0, 0]);
        assert_eq!(&h[4..12], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&h[12..20], &m.event_time.to_le_bytes());
        assert_eq!(&h[20..28], &m.watermark.to_le_bytes());
        assert_eq!(&h[28..30], &7u16.to_le_bytes());
        assert_eq!(&h[30..37], b"in-17-0");
        assert_eq!(&h[37..39], &2u16.to_le_bytes());
    }

    #[test]
    fn data_round_trips_with_the_payload_uncopied() {
        let m = sample();
        let h = data_header(9, &m);
        let payload = m.payload.clone();
        match decode(&h, payload.clone()).expect("decodes") {
            Control::Data { seq, message } => {
                assert_eq!(seq, 9);
                assert_eq!(message, m);
                // The same buffer, not a copy.
                assert_eq!(message.payload.as_ptr(), payload.as_ptr());
            }
            other => panic!("decoded {other:?}"),
        }
    }

    #[test]
    fn control_frames_round_trip() {
        let mut out = BytesMut::new();
        encode_hello(&mut out, "filter-0", 42).expect("hello");
        assert_eq!(decode(&out, Bytes::new()), Ok(Control::Hello { sender: "filter-0".into(), watermark: 42 }));
        out.clear();
        encode_ack(&mut out, &[1, 2, u64::MAX]).expect("ack");
        assert_eq!(decode(&out, Bytes::new()), Ok(Control::Ack { seqs: vec![1, 2, u64::MAX] }));
        out.clear();
        encode_nack(&mut out, &[5], "model not loaded").expect("nack");
        assert_eq!(decode(&out, Bytes::new()), Ok(Control::Nack { seqs: vec![5], reason: "model not loaded".into() }));
        out.clear();
        encode_watermark(&mut out, -1);
        assert_eq!(decode(&out, Bytes::new()), Ok(Control::Watermark { watermark: -1 }));
        out.clear();
        encode_alive(&mut out);
        assert_eq!(&out[..], &[VERSION, 6], "alive is the version and kind 6, nothing more");
        assert_eq!(decode(&out, Bytes::new()), Ok(Control::Alive));
    }

    #[test]
    fn alive_frames_carry_nothing() {
        let e = decode(&[VERSION, 6, 0], Bytes::new()).expect_err("trailing byte");
        assert_eq!((e.field, e.offset), ("end of header", 2));
        let e = decode(&[VERSION, 6], Bytes::from_static(b"x")).expect_err("payload");
        assert!(e.to_string().contains("only data frames"), "{e}");
    }

    #[test]
    fn errors_name_the_field_and_offset() {
        let mut h = data_header(1, &sample()).to_vec();
        h[0] = 2;
        let e = decode(&h, Bytes::new()).expect_err("version");
        assert_eq!((e.field, e.offset), ("version", 0));
        h[0] = VERSION;
        h[1] = 77;
        let e = decode(&h, Bytes::new()).expect_err("kind");
        assert!(e.to_string().contains("unknown kind 77"), "{e}");
        let mut out = BytesMut::new();
        encode_ack(&mut out, &[1]).expect("ack");
        let e = decode(&out, Bytes::from_static(b"x")).expect_err("payload on ack");
        assert!(e.to_string().contains("only data frames"), "{e}");
        let mut h = data_header(1, &sample()).to_vec();
        h.push(0);
        let e = decode(&h, Bytes::new()).expect_err("trailing");
        assert_eq!(e.field, "end of header");
        // An id of length zero.
        let mut h = data_header(1, &sample()).to_vec();
        h.truncate(28);
        h.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        let e = decode(&h, Bytes::new()).expect_err("empty id");
        assert_eq!((e.field, e.offset), ("message id", 28));
    }

    #[test]
    fn encoding_refuses_what_it_cannot_carry() {
        let mut m = sample();
        m.id.clear();
        let mut out = BytesMut::new();
        assert_eq!(encode_data(&mut out, 0, &m, DEFAULT_MAX_HEADER), Err(EncodeError::EmptyId));
        let mut m = sample();
        m.id = "x".repeat(70_000);
        assert!(matches!(
            encode_data(&mut out, 0, &m, usize::MAX),
            Err(EncodeError::FieldTooLong { field: "message id", .. })
        ));
        let mut m = sample();
        m.headers.insert("big".into(), "v".repeat(100));
        assert!(matches!(encode_data(&mut out, 0, &m, 64), Err(EncodeError::HeaderTooLarge { limit: 64, .. })));
        assert!(out.is_empty(), "nothing written on error");
        assert!(encode_ack(&mut out, &[]).is_err());
    }

    #[test]
    fn long_nack_reasons_are_cut_on_a_character_boundary() {
        let reason = "é".repeat(40_000);
        let mut out = BytesMut::new();
        encode_nack(&mut out, &[1], &reason).expect("nack");
        match decode(&out, Bytes::new()).expect("decodes") {
            Control::Nack { reason: r, .. } => {
                assert!(r.len() <= u16::MAX as usize);
                assert!(reason.starts_with(&r));
            }
            other => panic!("{other:?}"),
        }
    }

    fn arb_message() -> impl Strategy<Value = Message> {
        (
            "[a-z0-9-]{1,40}",
            proptest::collection::vec(".{0,20}", 0..5),
            any::<i64>(),
            any::<i64>(),
            proptest::collection::btree_map(".{0,10}", ".{0,30}", 0..5),
            proptest::collection::vec(any::<u8>(), 0..200),
        )
            .prop_map(|(id, keys, event_time, watermark, headers, payload)| Message {
                id,
                keys,
                event_time,
                watermark,
                headers,
                payload: Bytes::from(payload),
            })
    }

    proptest! {
        #[test]
        fn any_message_round_trips(m in arb_message(), seq in any::<u64>()) {
            let h = data_header(seq, &m);
            prop_assert_eq!(h.len(), m.header_len());
            let decoded = decode(&h, m.payload.clone()).expect("decodes");
            prop_assert_eq!(decoded, Control::Data { seq, message: m });
        }

        #[test]
        fn any_truncation_is_an_error(m in arb_message(), cut in any::<prop::sample::Index>()) {
            let h = data_header(3, &m);
            let cut = cut.index(h.len());
            prop_assert!(decode(&h[..cut], Bytes::new()).is_err());
        }

        #[test]
        fn corrupt_headers_never_panic(m in arb_message(), flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
            let mut h = data_header(3, &m).to_vec();
            for (at, byte) in flips {
                let i = at.index(h.len());
                h[i] = byte;
            }
            // Either an error or a well-formed frame; never a panic.
            let _ = decode(&h, m.payload.clone());
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&bytes, Bytes::new());
        }

        #[test]
        fn ack_round_trips_and_truncations_fail(seqs in proptest::collection::vec(any::<u64>(), 1..50), cut in any::<prop::sample::Index>()) {
            let mut out = BytesMut::new();
            encode_ack(&mut out, &seqs).expect("ack");
            prop_assert_eq!(decode(&out, Bytes::new()), Ok(Control::Ack { seqs }));
            let cut = cut.index(out.len());
            prop_assert!(decode(&out[..cut], Bytes::new()).is_err());
        }
    }
}
