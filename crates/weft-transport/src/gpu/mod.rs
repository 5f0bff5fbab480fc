//! GPU memory payloads (feature `gpu`): messages whose payload lives in CUDA device memory,
//! moved between processes without a trip through the host when both are on one node.
//!
//! # Design: a payload codec, not a backend
//!
//! A [`Backend`](crate::Backend) moves `Bytes`, which the host can read; device memory is not
//! that, so a backend wrapper would have to turn the buffer into host bytes before the trait
//! anyway. The GPU path is therefore a codec *above* any backend and above the protocol:
//! [`GpuCodec::encode`] turns a [`GpuBuffer`] into an ordinary payload, which goes through a
//! [`Sender`](crate::Sender) (acks, dedup, resends, backpressure and watermarks unchanged) or
//! straight through a [`FrameWriter`](crate::FrameWriter), over TCP or shared memory;
//! [`GpuCodec::decode`] turns it back into a [`GpuBuffer`] on the other side. Two encodings
//! ([`wire`] has the layout):
//!
//! - [`GpuPath::Ipc`], same node: the payload is a 128-byte descriptor carrying the
//!   allocation's `CUipcMemHandle` (`cuIpcGetMemHandle`), the buffer's offset and length, the
//!   node's boot id and the GPU's UUID. The receiver opens the handle (`cuIpcOpenMemHandle`,
//!   with lazy peer access, so the receiving process may use another GPU of the node) and gets
//!   a buffer over the *sender's* memory: no copy at all, through the host or otherwise. Opened
//!   handles are cached per process (CUDA opens a handle once per context) and closed when the
//!   last buffer over them is dropped. A descriptor from another node (different boot id) is
//!   refused with an error saying to send it staged.
//! - [`GpuPath::Staged`], any node: `cuMemcpyDtoH` into pinned host memory (from a pool, so
//!   `cuMemHostAlloc` is not paid per message; portable across contexts, and cached rather
//!   than write-combined, since the socket code reads it with the CPU), handed to the backend as the payload without another copy
//!   ([`Bytes::from_owner`]; the buffer returns to the pool when the frame is done with it).
//!   The receiver allocates device memory and copies in with `cuMemcpyHtoD` from the payload
//!   as the backend delivered it (for TCP a heap buffer, which the driver stages itself; a
//!   reader that reads straight into pinned memory is planned).
//!
//! # Lifetime of a buffer sent by IPC
//!
//! The receiver maps the sender's allocation, so the sender must not free it while the
//! receiver uses it. The encoded payload holds a reference to the allocation, so it lives as
//! long as the payload does: a [`Sender`](crate::Sender) keeps a message's payload until the
//! receiver acknowledged it, which happens after the receiver's handler returned. So a handler
//! may use the decoded buffer freely *while it runs*; to keep the data longer, take a copy
//! ([`GpuBuffer::duplicate`], device to device). A caller writing frames directly must keep
//! the payload (or the buffer) alive until the peer says it is done, as the tests do. A buffer
//! opened from an IPC handle cannot be exported again (CUDA refuses); send a duplicate.
//!
//! # What runs where
//!
//! The CUDA driver is loaded at run time (cudarc, `dynamic-loading`), so building needs no
//! CUDA toolkit and a process without a GPU runs fine until it asks for one:
//! [`GpuContext::probe`] says whether there is a driver and a device, never panicking.
//! IPC needs both processes to see the same GPU device nodes and share the host's IPC view
//! of the driver (in Kubernetes: the same node and the GPU allocated to both pods, or one pod);
//! CUDA does not allow opening a handle in the process that exported it.
//! **Not yet run on a GPU**: the machine this was written on has none; `tests/gpu.rs`
//! (`cargo test -p weft-transport --features gpu --test gpu`) runs the pure parts everywhere
//! and, where a GPU exists, IPC between two processes and the staged path over TCP with data
//! checks (it skips those with a message where there is none). Sending device memory straight
//! from the NIC (GPUDirect RDMA, registering device memory with the RDMA backend) is planned.

mod cuda;
pub mod wire;

use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use cudarc::driver::CudaContext;

use cuda::{DeviceAlloc, ImportTable, Pinned};
use wire::{Descriptor, IpcDescriptor, STAGED_PREFIX};

/// What went wrong with GPU memory.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No CUDA driver or no device.
    #[error("no GPU: {0}")]
    Unavailable(String),
    /// A CUDA driver call failed.
    #[error("CUDA {what}: {error}")]
    Cuda { what: String, error: String },
    /// A payload or buffer request that cannot be satisfied.
    #[error("GPU payload: {0}")]
    Payload(String),
}

impl From<GpuError> for std::io::Error {
    fn from(e: GpuError) -> Self {
        let kind = match e {
            GpuError::Payload(_) => std::io::ErrorKind::InvalidData,
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}

fn node_id() -> Result<[u8; 16], GpuError> {
    let path = "/proc/sys/kernel/random/boot_id";
    let text = std::fs::read_to_string(path)
        .map_err(|e| GpuError::Unavailable(format!("reading {path} (the node identity): {e}")))?;
    wire::parse_boot_id(&text).map_err(GpuError::Unavailable)
}

/// One GPU, as used by this process: the CUDA primary context of a device, this node's
/// identity, and the IPC handles opened through it. Cheap to clone.
#[derive(Clone)]
pub struct GpuContext {
    ctx: Arc<CudaContext>,
    node: [u8; 16],
    uuid: [u8; 16],
    imports: Arc<ImportTable>,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext")
            .field("ordinal", &self.ctx.ordinal())
            .field("uuid", &wire::hex(&self.uuid))
            .finish()
    }
}

impl GpuContext {
    /// How many CUDA devices there are, or why none can be used (no driver library, driver
    /// initialisation failed, zero devices). Never panics.
    pub fn probe() -> Result<usize, GpuError> {
        if !cuda::driver_present() {
            return Err(GpuError::Unavailable(
                "the CUDA driver library (libcuda.so) is not installed or not on the library path".into(),
            ));
        }
        let n = CudaContext::device_count()
            .map_err(|e| GpuError::Unavailable(format!("the CUDA driver did not initialise: {e}")))?;
        if n <= 0 {
            return Err(GpuError::Unavailable("the CUDA driver sees no device".into()));
        }
        Ok(n as usize)
    }

    /// The primary context of device `ordinal`.
    pub fn new(ordinal: usize) -> Result<Self, GpuError> {
        let count = Self::probe()?;
        if ordinal >= count {
            return Err(GpuError::Unavailable(format!("GPU {ordinal} requested, the driver sees {count}")));
        }
        let ctx = CudaContext::new(ordinal).map_err(cuda::cuda(format!("opening GPU {ordinal}")))?;
        let uuid = cuda::device_uuid(&ctx)?;
        Ok(Self { ctx, node: node_id()?, uuid, imports: Arc::new(ImportTable::default()) })
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The device's UUID.
    pub fn uuid(&self) -> [u8; 16] {
        self.uuid
    }

    /// IPC handles this context has open now.
    pub fn open_ipc_handles(&self) -> usize {
        self.imports.open_count()
    }

    /// A new device buffer of `len` bytes, contents undefined.
    pub fn alloc(&self, len: usize) -> Result<GpuBuffer, GpuError> {
        if len == 0 {
            return Ok(GpuBuffer::empty());
        }
        let alloc = DeviceAlloc::alloc(&self.ctx, len)?;
        Ok(GpuBuffer { alloc: Some(alloc), range: 0..len })
    }

    /// A new device buffer holding a copy of `bytes`.
    pub fn from_host(&self, bytes: &[u8]) -> Result<GpuBuffer, GpuError> {
        let b = self.alloc(bytes.len())?;
        b.copy_from_host(bytes)?;
        Ok(b)
    }
}

/// Bytes in GPU memory: a range of a device allocation, either this process's own or one
/// opened from another process's IPC handle. Clones share the memory; the allocation is freed
/// (or the handle closed) when the last buffer over it is dropped. Writes through one clone are
/// seen by all (and, for IPC, by the other process): ordering them is the caller's business.
#[derive(Clone)]
pub struct GpuBuffer {
    alloc: Option<Arc<DeviceAlloc>>,
    range: Range<usize>,
}

impl std::fmt::Debug for GpuBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuBuffer")
            .field("device_ptr", &format_args!("{:#x}", self.device_ptr()))
            .field("len", &self.len())
            .field("imported", &self.is_imported())
            .finish()
    }
}

impl GpuBuffer {
    /// The empty buffer (no allocation).
    pub fn empty() -> Self {
        Self { alloc: None, range: 0..0 }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// Its device address in this process (0 when empty), for kernels.
    pub fn device_ptr(&self) -> u64 {
        self.alloc.as_ref().map_or(0, |a| a.ptr() + self.range.start as u64)
    }

    /// Whether it lies in memory opened from another process's IPC handle.
    pub fn is_imported(&self) -> bool {
        self.alloc.as_ref().is_some_and(|a| a.is_imported())
    }

    /// A sub-range of it, sharing the memory.
    pub fn slice(&self, range: Range<usize>) -> Result<GpuBuffer, GpuError> {
        if range.start > range.end || range.end > self.len() {
            return Err(GpuError::Payload(format!("range {range:?} of a GPU buffer of {} bytes", self.len())));
        }
        Ok(GpuBuffer { alloc: self.alloc.clone(), range: self.range.start + range.start..self.range.start + range.end })
    }

    fn check_len(&self, n: usize, what: &str) -> Result<(), GpuError> {
        if n != self.len() {
            return Err(GpuError::Payload(format!("{what}: {n} host bytes for a GPU buffer of {} bytes", self.len())));
        }
        Ok(())
    }

    /// Copies `bytes` (exactly [`len`](Self::len) of them) into the buffer.
    pub fn copy_from_host(&self, bytes: &[u8]) -> Result<(), GpuError> {
        self.check_len(bytes.len(), "copy from host")?;
        match &self.alloc {
            Some(a) => cuda::htod(a.context(), self.device_ptr(), bytes),
            None => Ok(()),
        }
    }

    /// Copies the buffer into `out` (exactly [`len`](Self::len) bytes).
    pub fn copy_to_host(&self, out: &mut [u8]) -> Result<(), GpuError> {
        self.check_len(out.len(), "copy to host")?;
        match &self.alloc {
            Some(a) => cuda::dtoh(a.context(), out, self.device_ptr()),
            None => Ok(()),
        }
    }

    /// The buffer's bytes, copied to the host.
    pub fn to_host(&self) -> Result<Vec<u8>, GpuError> {
        let mut out = vec![0u8; self.len()];
        self.copy_to_host(&mut out)?;
        Ok(out)
    }

    /// Sets every byte to `value` (`cuMemsetD8`).
    pub fn fill(&self, value: u8) -> Result<(), GpuError> {
        match &self.alloc {
            Some(a) => cuda::memset(a.context(), self.device_ptr(), value, self.len()),
            None => Ok(()),
        }
    }

    /// A copy in a new allocation of `ctx` (device to device).
    pub fn duplicate(&self, ctx: &GpuContext) -> Result<GpuBuffer, GpuError> {
        let copy = ctx.alloc(self.len())?;
        if !self.is_empty() {
            cuda::dtod(&ctx.ctx, copy.device_ptr(), self.device_ptr(), self.len())?;
        }
        Ok(copy)
    }
}

/// How [`GpuCodec::encode`] moves a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuPath {
    /// A CUDA IPC handle: receivers on the same node map the sender's memory.
    Ipc,
    /// Through pinned host memory: receivers anywhere get a copy.
    Staged,
}

impl GpuPath {
    /// IPC for a peer on this node, staging otherwise.
    pub fn for_peer(same_node: bool) -> Self {
        if same_node { GpuPath::Ipc } else { GpuPath::Staged }
    }
}

/// Pinned buffers kept for reuse, up to a byte budget.
struct StagingPool {
    free: Mutex<Vec<Pinned>>,
    max_cached: usize,
}

impl StagingPool {
    /// A buffer of at least `len` bytes. Sizes come in classes (powers of two from 64 KiB), so
    /// a cached buffer is reused for any payload of its class.
    fn take(&self, ctx: &Arc<CudaContext>, len: usize) -> Result<Pinned, GpuError> {
        let class = len.max(64 * 1024).next_power_of_two();
        {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = free.iter().position(|p| p.capacity() == class) {
                return Ok(free.swap_remove(i));
            }
        }
        Pinned::alloc(ctx, class)
    }

    fn give_back(&self, p: Pinned) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let cached: usize = free.iter().map(|p| p.capacity()).sum();
        if cached + p.capacity() <= self.max_cached {
            free.push(p);
        }
    }

    fn cached(&self) -> usize {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// A staged payload: the pinned buffer returns to the pool when the payload is dropped.
struct StagedPayload {
    pinned: Option<Pinned>,
    len: usize,
    pool: Arc<StagingPool>,
}

impl AsRef<[u8]> for StagedPayload {
    fn as_ref(&self) -> &[u8] {
        self.pinned.as_ref().map_or(&[], |p| p.bytes(self.len))
    }
}

impl Drop for StagedPayload {
    fn drop(&mut self) {
        if let Some(p) = self.pinned.take() {
            self.pool.give_back(p);
        }
    }
}

/// An IPC payload: the descriptor, and the allocation it names, kept alive with it.
struct IpcPayload {
    bytes: [u8; wire::IPC_LEN],
    _alloc: Arc<DeviceAlloc>,
}

impl AsRef<[u8]> for IpcPayload {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Encodes GPU buffers as payloads and decodes them back (see the module docs).
#[derive(Clone)]
pub struct GpuCodec {
    ctx: GpuContext,
    pool: Arc<StagingPool>,
}

impl std::fmt::Debug for GpuCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuCodec").field("ctx", &self.ctx).finish()
    }
}

impl GpuCodec {
    /// Pinned staging memory kept for reuse by default.
    pub const DEFAULT_STAGING_CACHE: usize = 256 << 20;

    /// A codec on `ctx` (decoded buffers live there), keeping up to
    /// [`DEFAULT_STAGING_CACHE`](Self::DEFAULT_STAGING_CACHE) bytes of pinned staging memory.
    pub fn new(ctx: &GpuContext) -> Self {
        Self::with_staging_cache(ctx, Self::DEFAULT_STAGING_CACHE)
    }

    /// As [`new`](Self::new), keeping up to `bytes` of pinned staging memory for reuse.
    pub fn with_staging_cache(ctx: &GpuContext, bytes: usize) -> Self {
        Self { ctx: ctx.clone(), pool: Arc::new(StagingPool { free: Mutex::new(Vec::new()), max_cached: bytes }) }
    }

    /// Staging buffers waiting in the pool now.
    pub fn staging_cached(&self) -> usize {
        self.pool.cached()
    }

    /// The payload for `buf`. IPC needs `buf` to be in this process's own allocation.
    pub fn encode(&self, buf: &GpuBuffer, path: GpuPath) -> Result<Bytes, GpuError> {
        let Some(alloc) = &buf.alloc else {
            return Ok(Bytes::copy_from_slice(&wire::staged_prefix(0)));
        };
        match path {
            GpuPath::Ipc => {
                let handle = alloc.ipc_handle()?;
                let d = IpcDescriptor {
                    node: self.ctx.node,
                    device: cuda::device_uuid(alloc.context())?,
                    pid: std::process::id(),
                    offset: buf.range.start as u64,
                    len: buf.len() as u64,
                    handle,
                };
                Ok(Bytes::from_owner(IpcPayload { bytes: wire::encode_ipc(&d), _alloc: alloc.clone() }))
            }
            GpuPath::Staged => {
                let total = STAGED_PREFIX + buf.len();
                let mut pinned = self.pool.take(alloc.context(), total)?;
                let bytes = pinned.bytes_mut(total);
                bytes[..STAGED_PREFIX].copy_from_slice(&wire::staged_prefix(buf.len() as u64));
                cuda::dtoh(alloc.context(), &mut bytes[STAGED_PREFIX..], buf.device_ptr())?;
                Ok(Bytes::from_owner(StagedPayload { pinned: Some(pinned), len: total, pool: self.pool.clone() }))
            }
        }
    }

    /// The buffer a payload describes: the sender's memory, opened (IPC), or a new allocation
    /// holding the staged bytes.
    pub fn decode(&self, payload: &Bytes) -> Result<GpuBuffer, GpuError> {
        match wire::decode(payload).map_err(GpuError::Payload)? {
            Descriptor::Staged { len } => {
                let buf = self.ctx.alloc(len as usize)?;
                buf.copy_from_host(&payload[STAGED_PREFIX..])?;
                Ok(buf)
            }
            Descriptor::Ipc(d) => {
                wire::check_same_node(&d, &self.ctx.node).map_err(GpuError::Payload)?;
                let alloc = self.ctx.imports.open(&self.ctx.ctx, &d.handle).map_err(|e| {
                    GpuError::Payload(format!(
                        "opening the IPC handle of process {} (GPU {}) on GPU {}: {e}",
                        d.pid,
                        wire::hex(&d.device),
                        wire::hex(&self.ctx.uuid)
                    ))
                })?;
                let end = d.offset.saturating_add(d.len);
                if end > alloc.len() as u64 {
                    return Err(GpuError::Payload(format!(
                        "IPC buffer at offset {} of {} bytes lies outside the allocation of {} \
                         bytes",
                        d.offset,
                        d.len,
                        alloc.len()
                    )));
                }
                if d.len == 0 {
                    return Ok(GpuBuffer::empty());
                }
                Ok(GpuBuffer { alloc: Some(alloc), range: d.offset as usize..end as usize })
            }
        }
    }
}
