//! The CUDA driver calls of the GPU backend, each wrapped so the rest of the module is safe
//! code: device allocations (owned, or opened from another process's IPC handle), pinned host
//! buffers, and copies between them whose ranges the callers have checked.
//!
//! Allocations use `cuMemAlloc` directly rather than cudarc's `CudaSlice`: cudarc allocates
//! from the stream-ordered pool where the device supports it, and such memory cannot be
//! exported with `cuIpcGetMemHandle`.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::{CudaContext, DriverError, result, sys};

use super::GpuError;

pub(crate) fn cuda(what: impl Into<String>) -> impl FnOnce(DriverError) -> GpuError {
    let what = what.into();
    move |e| GpuError::Cuda { what, error: e.to_string() }
}

/// Whether the CUDA driver library (`libcuda.so`) can be loaded. Loading it later cannot fail
/// once this said yes; cudarc would panic if it were missing, so everything checks this first.
pub(crate) fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names and closes it again.
    unsafe { sys::is_culib_present() }
}

/// Where an allocation came from.
enum Origin {
    /// `cuMemAlloc` in this process: freed on drop.
    Owned,
    /// `cuIpcOpenMemHandle` of another process's allocation: closed on drop.
    Imported { table: Arc<ImportTable>, handle: [u8; 64], generation: u64 },
}

/// One device allocation.
pub(crate) struct DeviceAlloc {
    ptr: sys::CUdeviceptr,
    len: usize,
    ctx: Arc<CudaContext>,
    origin: Origin,
}

impl DeviceAlloc {
    /// Allocates `len` (> 0) bytes of device memory in `ctx`.
    pub(crate) fn alloc(ctx: &Arc<CudaContext>, len: usize) -> Result<Arc<DeviceAlloc>, GpuError> {
        ctx.bind_to_thread().map_err(cuda("binding the CUDA context"))?;
        // SAFETY: the context is current on this thread; the pointer is owned by the returned
        // value and freed once in Drop.
        let ptr = unsafe { result::malloc_sync(len) }.map_err(cuda(format!("cuMemAlloc of {len} bytes")))?;
        Ok(Arc::new(DeviceAlloc { ptr, len, ctx: ctx.clone(), origin: Origin::Owned }))
    }

    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_imported(&self) -> bool {
        matches!(self.origin, Origin::Imported { .. })
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The IPC handle of this (owned) allocation.
    pub(crate) fn ipc_handle(&self) -> Result<[u8; 64], GpuError> {
        if self.is_imported() {
            return Err(GpuError::Payload(
                "a buffer opened from another process's IPC handle cannot be exported again; \
                 send a copy (GpuBuffer::duplicate) or send it staged"
                    .into(),
            ));
        }
        self.ctx.bind_to_thread().map_err(cuda("binding the CUDA context"))?;
        let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: `ptr` is the base of a live cuMemAlloc allocation; `handle` is an
        // out-pointer.
        unsafe { sys::cuIpcGetMemHandle(&mut handle, self.ptr) }.result().map_err(cuda("cuIpcGetMemHandle"))?;
        Ok(handle.reserved.map(|c| c as u8))
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.bind_to_thread() {
            tracing::warn!(error = %e, "binding the CUDA context to free device memory");
        }
        match &self.origin {
            Origin::Owned => {
                // SAFETY: allocated by us with cuMemAlloc, freed once.
                if let Err(e) = unsafe { result::free_sync(self.ptr) } {
                    tracing::warn!(error = %e, "cuMemFree");
                }
            }
            Origin::Imported { table, handle, generation } => table.closed(handle, *generation, self.ptr),
        }
    }
}

struct Entry {
    alloc: Weak<DeviceAlloc>,
    ptr: sys::CUdeviceptr,
    generation: u64,
}

/// The IPC handles this process has open. CUDA allows a handle to be open once per context,
/// so a second buffer of the same allocation reuses the open mapping, and a handle whose last
/// buffer is being dropped is closed here, under the table's lock, before it is opened again.
#[derive(Default)]
pub(crate) struct ImportTable {
    entries: Mutex<HashMap<[u8; 64], Entry>>,
    generation: AtomicU64,
}

fn close_handle(ptr: sys::CUdeviceptr) {
    // SAFETY: `ptr` came from cuIpcOpenMemHandle in the current context and is closed once
    // (the table entry that owns it is removed at the same time, under the lock).
    if let Err(e) = unsafe { sys::cuIpcCloseMemHandle(ptr) }.result() {
        tracing::warn!(error = %e, "cuIpcCloseMemHandle");
    }
}

impl ImportTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 64], Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens `handle` in `ctx` (or reuses the open mapping).
    pub(crate) fn open(
        self: &Arc<Self>,
        ctx: &Arc<CudaContext>,
        handle: &[u8; 64],
    ) -> Result<Arc<DeviceAlloc>, GpuError> {
        let mut entries = self.lock();
        if let Some(e) = entries.get(handle) {
            if let Some(alloc) = e.alloc.upgrade() {
                return Ok(alloc);
            }
            // Its last buffer is being dropped and waits for this lock: close it now; the
            // drop sees a newer generation and leaves it.
            ctx.bind_to_thread().map_err(cuda("binding the CUDA context"))?;
            close_handle(e.ptr);
            entries.remove(handle);
        }
        ctx.bind_to_thread().map_err(cuda("binding the CUDA context"))?;
        let raw = sys::CUipcMemHandle { reserved: handle.map(|b| b as _) };
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: the context is current; `ptr` is an out-pointer; the handle is plain bytes
        // the driver validates.
        unsafe {
            sys::cuIpcOpenMemHandle_v2(&mut ptr, raw, sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32)
        }
        .result()
        .map_err(cuda("cuIpcOpenMemHandle"))?;
        let mut base: sys::CUdeviceptr = 0;
        let mut size: usize = 0;
        // SAFETY: `ptr` is a live mapping; out-pointers.
        let range = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) }.result();
        if let Err(e) = range {
            close_handle(ptr);
            return Err(cuda("cuMemGetAddressRange of an opened IPC handle")(e));
        }
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let alloc = Arc::new(DeviceAlloc {
            ptr,
            len: size.saturating_sub((ptr - base) as usize),
            ctx: ctx.clone(),
            origin: Origin::Imported { table: self.clone(), handle: *handle, generation },
        });
        entries.insert(*handle, Entry { alloc: Arc::downgrade(&alloc), ptr, generation });
        Ok(alloc)
    }

    fn closed(&self, handle: &[u8; 64], generation: u64, ptr: sys::CUdeviceptr) {
        let mut entries = self.lock();
        if entries.get(handle).is_some_and(|e| e.generation == generation) {
            entries.remove(handle);
            close_handle(ptr);
        }
    }

    /// Handles open now.
    pub(crate) fn open_count(&self) -> usize {
        self.lock().len()
    }
}

/// Copies `src` to device memory at `dst` (the caller checked the range).
pub(crate) fn htod(ctx: &CudaContext, dst: u64, src: &[u8]) -> Result<(), GpuError> {
    ctx.bind_to_thread().map_err(cuda("binding the CUDA context"))?;
    // SAFETY: `dst..dst + src.len()` lies in a live allocation (checked by the caller).
    unsafe { result::memcpy_htod_sync(dst, src) }.map_err(cuda(format!("cuMemcpyHtoD of {} bytes", src.len())))
}

/// Copies device memory at `src` into `dst` (the caller checked the range).
pub(crate) fn dtoh(ctx: &CudaContext, dst: &mut [u8], src: u64) -> Result<(), GpuError> {
    ctx.bind_to_thread().map_err(cuda("binding the CUDA context"))?;
    let n = dst.len();
    // SAFETY: `src..src + dst.len()` lies in a live allocation (checked by the caller).
    unsafe { result::memcpy_dtoh_sync(dst, src) }.map_err(cuda(format!("cuMemcpyDtoH of {n} bytes")))
}

/// Copies `n` bytes between device addresses (the caller checked both ranges).
pub(crate) fn dtod(ctx: &CudaContext, dst: u64, src: u64, n: usize) -> Result<(), GpuError> {
    ctx.bind_to_thread().map_err(cuda("binding the CUDA context"))?;
    // SAFETY: both ranges lie in live allocations (checked by the caller).
    unsafe { result::memcpy_dtod_sync(dst, src, n) }.map_err(cuda(format!("cuMemcpyDtoD of {n} bytes")))?;
    // Device-to-device copies may return before they finish; callers expect them done.
    ctx.synchronize().map_err(cuda("cuCtxSynchronize after a device copy"))
}

/// Sets `n` bytes at `dst` to `value` (the caller checked the range).
pub(crate) fn memset(ctx: &CudaContext, dst: u64, value: u8, n: usize) -> Result<(), GpuError> {
    ctx.bind_to_thread().map_err(cuda("binding the CUDA context"))?;
    // SAFETY: the range lies in a live allocation (checked by the caller).
    unsafe { result::memset_d8_sync(dst, value, n) }.map_err(cuda(format!("cuMemsetD8 of {n} bytes")))?;
    // cuMemsetD8 on device memory may return before it finishes; callers expect it done.
    ctx.synchronize().map_err(cuda("cuCtxSynchronize after a memset"))
}

/// Page-locked host memory (`cuMemHostAlloc` with `CU_MEMHOSTALLOC_PORTABLE`, so it counts as
/// pinned for every context, and without `WRITECOMBINED`, because the kernel's socket code
/// reads it with the CPU).
pub(crate) struct Pinned {
    ptr: NonNull<u8>,
    cap: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: `Pinned` owns its allocation exclusively; shared access only reads.
unsafe impl Send for Pinned {}
// SAFETY: as above.
unsafe impl Sync for Pinned {}

impl Pinned {
    pub(crate) fn alloc(ctx: &Arc<CudaContext>, cap: usize) -> Result<Pinned, GpuError> {
        ctx.bind_to_thread().map_err(cuda("binding the CUDA context"))?;
        // SAFETY: the context is current; the allocation is owned by the returned value.
        let ptr =
            unsafe { result::malloc_host(cap.max(1), 0) }.map_err(cuda(format!("cuMemHostAlloc of {cap} bytes")))?;
        let ptr =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| GpuError::Payload("cuMemHostAlloc returned null".into()))?;
        Ok(Pinned { ptr, cap, ctx: ctx.clone() })
    }

    pub(crate) fn capacity(&self) -> usize {
        self.cap
    }

    pub(crate) fn bytes(&self, len: usize) -> &[u8] {
        // SAFETY: `len` is clamped to the allocation; the memory lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), len.min(self.cap)) }
    }

    pub(crate) fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        // SAFETY: as `bytes`; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), len.min(self.cap)) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated with cuMemHostAlloc by us, freed once.
        if let Err(e) = unsafe { result::free_host(self.ptr.as_ptr().cast()) } {
            tracing::warn!(error = %e, "cuMemFreeHost");
        }
    }
}

/// The UUID of the context's device.
pub(crate) fn device_uuid(ctx: &CudaContext) -> Result<[u8; 16], GpuError> {
    let uuid = ctx.uuid().map_err(cuda("cuDeviceGetUuid"))?;
    Ok(uuid.bytes.map(|c| c as u8))
}
