//! Request bodies decoded while they arrive, in bounded memory.
//!
//! vc-scheduler sends every candidate `NodeInfo` with all its task pods (1,000 nodes × 20 pods is
//! 67 MiB, 5,000 × 30 about half a GiB), of which weft reads only the node names; kube-scheduler may
//! send an oversized node list. Neither body is ever held whole. [`JsonStream`] walks the body's
//! top-level objects and arrays itself and hands each value weft reads (the pod, one node, one
//! `NodeInfo`) to `serde_json` as a slice, so a skipped `NodeInfo` costs `serde_json`'s fast
//! `IgnoredAny` scan and its memory is released before the next one is read. What a request may
//! cost is bounded by [`StreamLimits`]:
//!
//! - `max_body_bytes`: bytes read from the body in all (skipped parts included);
//! - `max_decoded_bytes`: the largest single value held to decode, and the sum of the JSON text of
//!   the values kept for the decision (the pod, node objects, node names);
//! - the callers stop at their item limits (`--max-nodes-per-request`) as they count, before the
//!   rest of the body is read ([`StreamError::TooManyNodes`]);
//! - nesting deeper than [`MAX_DEPTH`] is refused, as `serde_json` refuses it inside a value.
//!
//! Why not `serde_json::from_reader` with a visitor over the top level: it decodes byte by byte
//! through `io::Read` and ran at 35–80 MB/s here against about 400 MB/s from a slice, which puts
//! a 5,000-node vc-scheduler body far past the request timeout; and it cannot bound a single
//! value's size before decoding it. So this module only finds where each top-level value starts
//! and ends (strings, escapes, nesting) and leaves every decode to `serde_json`.
//!
//! [`BodyReader`] feeds an HTTP body into the blocking thread that decodes it, through a channel
//! of at most [`CHANNEL_FRAMES`] frames, so the body is read only as fast as it is decoded.

use std::io::{self, Read};

use axum::body::{Body, Bytes};
use http_body_util::BodyExt;
use serde::de::{DeserializeOwned, IgnoredAny};
use thiserror::Error;
use tokio::sync::mpsc;

use crate::decision::Deadline;

/// Deepest nesting of arrays and objects accepted (`serde_json`'s own recursion limit).
pub const MAX_DEPTH: usize = 128;
/// Bytes asked of the source per read (at least; more when one value needs more).
const READ_CHUNK: usize = 64 << 10;
/// HTTP body frames buffered between the connection and the decoder.
pub const CHANNEL_FRAMES: usize = 8;

/// Bounds of one request body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamLimits {
    /// Bytes read from the body in all.
    pub max_body_bytes: u64,
    /// The largest value held to decode, and the sum of the JSON text of the values kept.
    pub max_decoded_bytes: usize,
}

/// Why a body could not be decoded.
#[derive(Debug, Error)]
pub enum StreamError {
    /// More than `max_body_bytes` arrived.
    #[error("request body is larger than the {limit}-byte limit (--max-body-bytes)")]
    BodyTooLarge {
        /// The limit.
        limit: u64,
    },
    /// One value (a pod, a node, a NodeInfo) is larger than `max_decoded_bytes`.
    #[error("{what} starting at byte {at} is larger than the {limit}-byte limit (--max-decoded-bytes)")]
    ValueTooLarge {
        /// What the value is.
        what: String,
        /// Its offset in the body.
        at: u64,
        /// The limit.
        limit: usize,
    },
    /// The values kept add up to more than `max_decoded_bytes` of JSON.
    #[error("the request carries more than {limit} bytes of pod and node JSON (--max-decoded-bytes)")]
    DecodedTooLarge {
        /// The limit.
        limit: usize,
    },
    /// More candidate nodes than the limit; decoding stopped at the first one over it.
    #[error("request names at least {} nodes; at most {max} are accepted (--max-nodes-per-request)", max + 1)]
    TooManyNodes {
        /// The limit.
        max: usize,
    },
    /// The body is not the expected JSON.
    #[error("{message} (line {line}, column {column})")]
    Syntax {
        /// What is wrong, and in which value.
        message: String,
        /// Line in the body, from 1.
        line: u64,
        /// Byte column in that line, from 1.
        column: u64,
    },
    /// The body could not be read (the connection failed or the sender gave up).
    #[error("cannot read the request body: {0}")]
    Read(#[source] io::Error),
    /// The request's deadline passed while reading.
    #[error("the request's time ran out while its body was read")]
    Expired,
}

impl StreamError {
    /// Whether the body was refused for its size (HTTP 413).
    pub fn is_too_large(&self) -> bool {
        matches!(
            self,
            StreamError::BodyTooLarge { .. } | StreamError::ValueTooLarge { .. } | StreamError::DecodedTooLarge { .. }
        )
    }
}

/// A JSON document read from `R` piece by piece: objects and arrays are walked here, every other
/// value is decoded by `serde_json` from the buffered slice it occupies.
pub struct JsonStream<R> {
    source: R,
    buf: Vec<u8>,
    /// Next unread byte of `buf`.
    pos: usize,
    /// Offset in the body of `buf[0]`.
    base: u64,
    eof: bool,
    limits: StreamLimits,
    deadline: Deadline,
    kept: usize,
    depth: usize,
    /// Newlines before `buf[0]`, and the body offset just after the last of them.
    lines: u64,
    line_start: u64,
}

impl<R: Read> JsonStream<R> {
    /// A stream over `source` with these limits and no deadline.
    pub fn new(source: R, limits: StreamLimits) -> JsonStream<R> {
        JsonStream {
            source,
            buf: Vec::new(),
            pos: 0,
            base: 0,
            eof: false,
            limits,
            deadline: Deadline::NEVER,
            kept: 0,
            depth: 0,
            lines: 0,
            line_start: 0,
        }
    }

    /// The same stream, giving up once `deadline` passes (checked before every read).
    pub fn with_deadline(mut self, deadline: Deadline) -> JsonStream<R> {
        self.deadline = deadline;
        self
    }

    /// Bytes of the body consumed so far (read and decoded or skipped).
    pub fn consumed(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Bytes read from the source so far (consumed, plus what is buffered ahead).
    pub fn read_bytes(&self) -> u64 {
        self.base + self.buf.len() as u64
    }

    /// The JSON text of kept values so far ([`JsonStream::kept`]).
    pub fn kept_bytes(&self) -> usize {
        self.kept
    }

    /// Drop the consumed bytes and read until at least `want` unread bytes are buffered (or the
    /// body ends).
    fn fill(&mut self, want: usize) -> Result<(), StreamError> {
        if self.pos > 0 {
            let done = &self.buf[..self.pos];
            // Bodies as encoding/json writes them have no newline: one word-at-a-time search
            // (core's memchr) settles that before any byte-by-byte count.
            let newlines = if done.contains(&b'\n') { done.iter().filter(|b| **b == b'\n').count() } else { 0 };
            if newlines > 0 {
                self.lines += newlines as u64;
                let last = done.iter().rposition(|b| *b == b'\n').unwrap_or(0);
                self.line_start = self.base + last as u64 + 1;
            }
            self.buf.drain(..self.pos);
            self.base += self.pos as u64;
            self.pos = 0;
        }
        while !self.eof && self.buf.len() < want {
            if self.deadline.passed() {
                return Err(StreamError::Expired);
            }
            let start = self.buf.len();
            self.buf.resize(start + (want - start).max(READ_CHUNK), 0);
            let read = loop {
                match self.source.read(&mut self.buf[start..]) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    other => break other,
                }
            };
            let n = match read {
                Ok(n) => n,
                Err(e) => {
                    self.buf.truncate(start);
                    return Err(StreamError::Read(e));
                }
            };
            self.buf.truncate(start + n);
            self.eof = n == 0;
            if self.read_bytes() > self.limits.max_body_bytes {
                return Err(StreamError::BodyTooLarge { limit: self.limits.max_body_bytes });
            }
        }
        Ok(())
    }

    /// Line and column (from 1) of body offset `at`, which must not be before `buf[0]`.
    fn position(&self, at: u64) -> (u64, u64) {
        let upto = &self.buf[..(at - self.base) as usize];
        let newlines = upto.iter().filter(|b| **b == b'\n').count() as u64;
        let line_start = match upto.iter().rposition(|b| *b == b'\n') {
            Some(i) => self.base + i as u64 + 1,
            None => self.line_start,
        };
        (self.lines + newlines + 1, at - line_start + 1)
    }

    fn syntax(&self, at: u64, message: String) -> StreamError {
        let (line, column) = self.position(at);
        StreamError::Syntax { message, line, column }
    }

    /// The next byte after whitespace, not consumed; `None` at the end of the body.
    pub fn peek(&mut self) -> Result<Option<u8>, StreamError> {
        loop {
            while let Some(&b) = self.buf.get(self.pos) {
                if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                    self.pos += 1;
                } else {
                    return Ok(Some(b));
                }
            }
            if self.eof {
                return Ok(None);
            }
            self.fill(1)?;
        }
    }

    fn expect(&mut self, byte: u8, what: &str) -> Result<(), StreamError> {
        match self.peek()? {
            Some(b) if b == byte => {
                self.pos += 1;
                Ok(())
            }
            found => Err(self.unexpected(found, &format!("`{}` in {what}", byte as char))),
        }
    }

    fn unexpected(&self, found: Option<u8>, expected: &str) -> StreamError {
        let message = match found {
            Some(b) => format!("expected {expected}, found `{}`", b.escape_ascii()),
            None => format!("expected {expected}, found the end of the body"),
        };
        self.syntax(self.consumed(), message)
    }

    /// Decode the next value as `T` from the buffered slice it occupies. `what` names it in errors.
    pub fn value<T: DeserializeOwned>(&mut self, what: &str) -> Result<T, StreamError> {
        self.decode(&|| what.to_string())
    }

    /// [`JsonStream::value`] with its name made only for an error (a list's items are many).
    fn decode<T: DeserializeOwned>(&mut self, what: &dyn Fn() -> String) -> Result<T, StreamError> {
        if self.peek()?.is_none() {
            return Err(self.unexpected(None, &what()));
        }
        loop {
            let slice = &self.buf[self.pos..];
            let mut values = serde_json::Deserializer::from_slice(slice).into_iter::<T>();
            let Some(parsed) = values.next() else { return Err(self.unexpected(None, &what())) };
            let used = values.byte_offset();
            match parsed {
                // A value that ends where the buffer does may go on (a number): read on first.
                Ok(v) if used < slice.len() || self.eof => {
                    self.pos += used;
                    return Ok(v);
                }
                // A value cut off by the end of the buffer fails as EOF, or, inside a number, as
                // an invalid number at the cut: both read on.
                Err(e) if self.eof || !(e.is_eof() || at_end(slice, e.line(), e.column())) => {
                    let at = self.consumed();
                    let (line, column) = self.position(at);
                    let (line, column) = if e.line() <= 1 {
                        (line, column + e.column().saturating_sub(1) as u64)
                    } else {
                        (line + e.line() as u64 - 1, e.column() as u64)
                    };
                    return Err(StreamError::Syntax { message: format!("{}: {e}", what()), line, column });
                }
                _ => {
                    let have = slice.len();
                    if have >= self.limits.max_decoded_bytes {
                        return Err(StreamError::ValueTooLarge {
                            what: what(),
                            at: self.consumed(),
                            limit: self.limits.max_decoded_bytes,
                        });
                    }
                    // Not `clamp`: a limit under READ_CHUNK (--max-decoded-bytes) would make it panic.
                    let want = (have * 2).max(READ_CHUNK).min(self.limits.max_decoded_bytes.saturating_add(1));
                    self.fill(want)?;
                }
            }
        }
    }

    /// [`JsonStream::value`] of a value kept for the decision: its text counts against
    /// `max_decoded_bytes`.
    pub fn kept<T: DeserializeOwned>(&mut self, what: &str) -> Result<T, StreamError> {
        self.kept_as(&|| what.to_string())
    }

    /// [`JsonStream::kept`] of item `index` of the list `list` (named `list[index]` in errors).
    pub fn kept_item<T: DeserializeOwned>(&mut self, list: &str, index: usize) -> Result<T, StreamError> {
        self.kept_as(&|| format!("{list}[{index}]"))
    }

    fn kept_as<T: DeserializeOwned>(&mut self, what: &dyn Fn() -> String) -> Result<T, StreamError> {
        let before = self.consumed();
        let v = self.decode(what)?;
        self.keep((self.consumed() - before) as usize)?;
        Ok(v)
    }

    /// Count `bytes` of JSON text as kept.
    pub fn keep(&mut self, bytes: usize) -> Result<(), StreamError> {
        self.kept = self.kept.saturating_add(bytes);
        if self.kept > self.limits.max_decoded_bytes {
            return Err(StreamError::DecodedTooLarge { limit: self.limits.max_decoded_bytes });
        }
        Ok(())
    }

    fn enter(&mut self) -> Result<(), StreamError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.syntax(self.consumed(), format!("nested deeper than {MAX_DEPTH} levels")));
        }
        Ok(())
    }

    /// If the next value is `null`, consume it and return true.
    fn null(&mut self) -> Result<bool, StreamError> {
        if self.peek()? != Some(b'n') {
            return Ok(false);
        }
        self.value::<()>("null")?;
        Ok(true)
    }

    /// Walk an object, calling `field` with each key; `field` must consume the key's value (read
    /// it or [`JsonStream::skip`] it). `null` is an absent object: `Ok(false)`.
    pub fn object(
        &mut self,
        what: &str,
        mut field: impl FnMut(&mut Self, &str) -> Result<(), StreamError>,
    ) -> Result<bool, StreamError> {
        if self.null()? {
            return Ok(false);
        }
        self.expect(b'{', &format!("{what} (an object)"))?;
        self.enter()?;
        if self.peek()? == Some(b'}') {
            self.pos += 1;
        } else {
            loop {
                if self.peek()? != Some(b'"') {
                    let found = self.peek()?;
                    return Err(self.unexpected(found, &format!("a key in {what}")));
                }
                let key: String = self.value(&format!("a key in {what}"))?;
                self.expect(b':', what)?;
                field(self, &key)?;
                match self.peek()? {
                    Some(b',') => self.pos += 1,
                    Some(b'}') => {
                        self.pos += 1;
                        break;
                    }
                    found => return Err(self.unexpected(found, &format!("`,` or `}}` in {what}"))),
                }
            }
        }
        self.depth -= 1;
        Ok(true)
    }

    /// Walk an array, calling `item` with the index of each element; `item` must consume it.
    /// `null` is an absent array: `Ok(false)`.
    pub fn array(
        &mut self,
        what: &str,
        mut item: impl FnMut(&mut Self, usize) -> Result<(), StreamError>,
    ) -> Result<bool, StreamError> {
        if self.null()? {
            return Ok(false);
        }
        self.expect(b'[', &format!("{what} (an array)"))?;
        self.enter()?;
        if self.peek()? == Some(b']') {
            self.pos += 1;
        } else {
            let mut i = 0;
            loop {
                item(self, i)?;
                i += 1;
                match self.peek()? {
                    Some(b',') => self.pos += 1,
                    Some(b']') => {
                        self.pos += 1;
                        break;
                    }
                    found => return Err(self.unexpected(found, &format!("`,` or `]` in {what}"))),
                }
            }
        }
        self.depth -= 1;
        Ok(true)
    }

    /// Consume the next value without keeping it. Objects and arrays are walked, so a skipped
    /// value of any size is never held whole; a scalar is held to be checked.
    pub fn skip(&mut self) -> Result<(), StreamError> {
        match self.peek()? {
            Some(b'{') => self.object("an ignored object", |s, _| s.skip()).map(drop),
            Some(b'[') => self.array("an ignored array", |s, _| s.skip()).map(drop),
            _ => self.value::<IgnoredAny>("an ignored value").map(drop),
        }
    }

    /// Check that nothing but whitespace follows the document.
    pub fn finish(&mut self) -> Result<(), StreamError> {
        match self.peek()? {
            None => Ok(()),
            found => Err(self.unexpected(found, "the end of the body")),
        }
    }
}

/// Whether `serde_json`'s error position (`line`, `column`, from 1) is at the last bytes of `slice`.
fn at_end(slice: &[u8], line: usize, column: usize) -> bool {
    let mut start = 0;
    for _ in 1..line {
        match slice[start..].iter().position(|b| *b == b'\n') {
            Some(i) => start += i + 1,
            None => return true,
        }
    }
    start + column + 1 >= slice.len()
}

/// The blocking end of an HTTP body: reads what [`pump`] forwards. A body that stops before its
/// end (the sender went away, or the request was given up) reads as an error, never as a short
/// document.
pub struct BodyReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
    done: bool,
}

impl Read for BodyReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            if self.done {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Ok(frame)) if frame.is_empty() => self.done = true,
                Some(Ok(frame)) => self.current = frame,
                Some(Err(e)) => return Err(e),
                None => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the request body stopped")),
            }
        }
        let n = out.len().min(self.current.len());
        out[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}

/// A reader for `body` on a blocking thread and the future that feeds it (run it on the runtime;
/// dropping it ends the body for the reader).
pub fn body_reader(body: Body) -> (BodyReader, impl std::future::Future<Output = ()> + Send) {
    let (tx, rx) = mpsc::channel(CHANNEL_FRAMES);
    (BodyReader { rx, current: Bytes::new(), done: false }, pump(body, tx))
}

async fn pump(mut body: Body, tx: mpsc::Sender<io::Result<Bytes>>) {
    loop {
        let item = match body.frame().await {
            None => Ok(Bytes::new()),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if data.is_empty() => continue,
                Ok(data) => Ok(data),
                Err(_) => continue, // trailers
            },
            Some(Err(e)) => Err(io::Error::other(e.to_string())),
        };
        let last = item.as_ref().map_or(true, Bytes::is_empty);
        if tx.send(item).await.is_err() || last {
            return;
        }
    }
}
