//! The few libibverbs declarations the backend needs, written by hand.
//!
//! # Why not a bindings crate
//!
//! On a Debian box with only `libibverbs-dev` installed none of the crates on crates.io built:
//! `ibverbs`/`ibverbs-sys` and `sideway`'s `rdma-mummy-sys` vendor rdma-core and build it with
//! cmake (not installed), and `rdma-sys` runs bindgen (needs libclang) and also requires
//! `librdmacm-dev` through pkg-config. So the declarations are here, covering only what the
//! backend calls; `layout_matches_verbs_h` (a unit test) compiles a C program against the
//! installed `<infiniband/verbs.h>` and checks every size, offset and constant below against it.
//!
//! # The inline verbs
//!
//! `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and `ibv_req_notify_cq` are `static inline`
//! in `verbs.h`, so `libibverbs.so` exports no symbol for them: the header calls through the
//! provider's function pointers in `struct ibv_context_ops`, embedded in `struct ibv_context`
//! (`qp->context->ops.post_send(qp, wr, bad_wr)` and so on). [`post_send`], [`post_recv`],
//! [`poll_cq`] and [`req_notify_cq`] do exactly that: [`IbvContext`] declares the context's
//! layout up to the end of `ops` (the provider allocates the real, larger struct; we only ever
//! read through a pointer to it), and each wrapper loads the pointer from the QP's or CQ's
//! `context` and calls the entry. These four entries are the ones the header itself uses (they
//! are not in the `_compat_` part of the table), so every provider fills them.
//!
//! `ibv_query_port` is a macro in the header that prefers the extended `verbs_context` entry
//! and falls back to the exported compatibility symbol with a zeroed, full-size
//! `struct ibv_port_attr`; we call the exported symbol the same way, with a buffer larger than
//! the struct ([`IbvPortAttr`] has spare room at the end), which is what the header's fallback
//! does. `ibv_reg_mr` is a macro that calls the exported `ibv_reg_mr` when the access flags are
//! constants outside the optional range, as ours are.

#![allow(non_camel_case_types)]
// FFI declarations and the calls through the provider's ops table; each with a SAFETY comment.
#![allow(unsafe_code)]

#[cfg(not(test))]
use std::ffi::c_char;
use std::ffi::{c_int, c_uint, c_void};

// Opaque handles: only ever used through pointers.
#[repr(C)]
pub struct IbvDevice {
    _private: [u8; 0],
}
#[repr(C)]
pub struct IbvPd {
    _private: [u8; 0],
}

/// `struct ibv_context_ops`: 32 function pointers, of which we call four.
#[repr(C)]
pub struct IbvContextOps {
    _compat_0_to_10: [*mut c_void; 11],
    pub poll_cq: Option<unsafe extern "C" fn(*mut IbvCq, c_int, *mut IbvWc) -> c_int>,
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut IbvCq, c_int) -> c_int>,
    _compat_13_to_24: [*mut c_void; 12],
    pub post_send: Option<unsafe extern "C" fn(*mut IbvQp, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int>,
    pub post_recv: Option<unsafe extern "C" fn(*mut IbvQp, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int>,
    _compat_27_to_31: [*mut c_void; 5],
}

#[cfg(test)]
impl IbvContextOps {
    /// A table with no entries (the emulation fills the four it needs).
    pub(crate) fn empty() -> Self {
        Self {
            _compat_0_to_10: [std::ptr::null_mut(); 11],
            poll_cq: None,
            req_notify_cq: None,
            _compat_13_to_24: [std::ptr::null_mut(); 12],
            post_send: None,
            post_recv: None,
            _compat_27_to_31: [std::ptr::null_mut(); 5],
        }
    }
}

/// The start of `struct ibv_context` (the rest is never touched).
#[repr(C)]
pub struct IbvContext {
    pub device: *mut IbvDevice,
    pub ops: IbvContextOps,
}

/// The start of `struct ibv_cq`.
#[repr(C)]
pub struct IbvCq {
    pub context: *mut IbvContext,
}

/// The start of `struct ibv_qp` up to `qp_num`.
#[repr(C)]
pub struct IbvQp {
    pub context: *mut IbvContext,
    pub qp_context: *mut c_void,
    pub pd: *mut IbvPd,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct IbvMr {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct IbvCompChannel {
    pub context: *mut IbvContext,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_port_attr`, with room to spare after it (see the module docs).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvPortAttr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
    /// Not in the header: room for fields a newer provider may write.
    pub _spare: [u8; 64],
}

/// `union ibv_gid` (the union has `__be64` members, hence the alignment).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IbvGid {
    pub raw: [u8; 16],
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct IbvQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvGlobalRoute {
    pub dgid: IbvGid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvAhAttr {
    pub grh: IbvGlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvQpAttr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: IbvQpCap,
    pub ah_attr: IbvAhAttr,
    pub alt_ah_attr: IbvAhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr`. The unions are flattened: `imm_data` (big-endian on the wire), then
/// the `wr` union of which we use `rdma { remote_addr, rkey }` (its first 12 bytes), then
/// `qp_type` and the `bind_mw`/`tso` union, which we leave zeroed.
#[repr(C)]
pub struct IbvSendWr {
    pub wr_id: u64,
    pub next: *mut IbvSendWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: c_uint,
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    _wr_rest: [u32; 5],
    _qp_type: [u32; 2],
    _bind_mw_or_tso: [u64; 6],
}

impl IbvSendWr {
    /// A zeroed work request.
    pub fn zeroed() -> Self {
        Self {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            _wr_rest: [0; 5],
            _qp_type: [0; 2],
            _bind_mw_or_tso: [0; 6],
        }
    }
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct IbvRecvWr {
    pub wr_id: u64,
    pub next: *mut IbvRecvWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvWc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

// enum ibv_port_state
pub const IBV_PORT_ACTIVE: u32 = 4;
// enum ibv_port_link_layer
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
// enum ibv_qp_type
pub const IBV_QPT_RC: u32 = 2;
// enum ibv_qp_state
pub const IBV_QPS_INIT: u32 = 1;
pub const IBV_QPS_RTR: u32 = 2;
pub const IBV_QPS_RTS: u32 = 3;
// enum ibv_qp_attr_mask
pub const IBV_QP_STATE: c_int = 1 << 0;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;
// enum ibv_access_flags
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 2;
// enum ibv_wr_opcode
pub const IBV_WR_RDMA_WRITE_WITH_IMM: u32 = 1;
pub const IBV_WR_SEND: u32 = 2;
// enum ibv_send_flags
pub const IBV_SEND_SIGNALED: c_uint = 2;
// enum ibv_wc_status / ibv_wc_opcode / ibv_wc_flags
pub const IBV_WC_SUCCESS: u32 = 0;
pub const IBV_WC_RECV: u32 = 128;
pub const IBV_WC_RECV_RDMA_WITH_IMM: u32 = 129;
pub const IBV_WC_WITH_IMM: c_uint = 2;

// Unit tests run against the in-process stand-in (`super::emu`) instead of libibverbs.
#[cfg(test)]
pub use super::emu::{
    ibv_ack_cq_events, ibv_alloc_pd, ibv_close_device, ibv_create_comp_channel, ibv_create_cq, ibv_create_qp,
    ibv_dealloc_pd, ibv_dereg_mr, ibv_destroy_comp_channel, ibv_destroy_cq, ibv_destroy_qp, ibv_free_device_list,
    ibv_get_cq_event, ibv_get_device_list, ibv_get_device_name, ibv_modify_qp, ibv_open_device, ibv_query_gid,
    ibv_query_port, ibv_reg_mr, ibv_wc_status_str,
};

#[cfg(not(test))]
#[link(name = "ibverbs")]
unsafe extern "C" {
    pub fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut IbvDevice;
    pub fn ibv_free_device_list(list: *mut *mut IbvDevice);
    pub fn ibv_get_device_name(device: *mut IbvDevice) -> *const c_char;
    pub fn ibv_open_device(device: *mut IbvDevice) -> *mut IbvContext;
    pub fn ibv_close_device(context: *mut IbvContext) -> c_int;
    /// The exported compatibility symbol; see the module docs.
    pub fn ibv_query_port(context: *mut IbvContext, port_num: u8, attr: *mut IbvPortAttr) -> c_int;
    pub fn ibv_query_gid(context: *mut IbvContext, port_num: u8, index: c_int, gid: *mut IbvGid) -> c_int;
    pub fn ibv_alloc_pd(context: *mut IbvContext) -> *mut IbvPd;
    pub fn ibv_dealloc_pd(pd: *mut IbvPd) -> c_int;
    pub fn ibv_reg_mr(pd: *mut IbvPd, addr: *mut c_void, length: usize, access: c_int) -> *mut IbvMr;
    pub fn ibv_dereg_mr(mr: *mut IbvMr) -> c_int;
    pub fn ibv_create_comp_channel(context: *mut IbvContext) -> *mut IbvCompChannel;
    pub fn ibv_destroy_comp_channel(channel: *mut IbvCompChannel) -> c_int;
    pub fn ibv_create_cq(
        context: *mut IbvContext,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut IbvCompChannel,
        comp_vector: c_int,
    ) -> *mut IbvCq;
    pub fn ibv_destroy_cq(cq: *mut IbvCq) -> c_int;
    pub fn ibv_get_cq_event(channel: *mut IbvCompChannel, cq: *mut *mut IbvCq, cq_context: *mut *mut c_void) -> c_int;
    pub fn ibv_ack_cq_events(cq: *mut IbvCq, nevents: c_uint);
    pub fn ibv_create_qp(pd: *mut IbvPd, attr: *mut IbvQpInitAttr) -> *mut IbvQp;
    pub fn ibv_modify_qp(qp: *mut IbvQp, attr: *mut IbvQpAttr, attr_mask: c_int) -> c_int;
    pub fn ibv_destroy_qp(qp: *mut IbvQp) -> c_int;
    pub fn ibv_wc_status_str(status: u32) -> *const c_char;
}

/// `ibv_post_send`, as the header's inline function does it.
///
/// # Safety
/// `qp` must be a live QP from `ibv_create_qp`; `wr` a valid chain of work requests whose
/// scatter lists point into registered memory that stays valid until the completion.
pub unsafe fn post_send(qp: *mut IbvQp, wr: *mut IbvSendWr, bad: *mut *mut IbvSendWr) -> c_int {
    // SAFETY: the caller guarantees `qp` is live, so its `context` points at the provider's
    // context, whose `ops` table the provider filled at open time.
    unsafe {
        match (*(*qp).context).ops.post_send {
            Some(f) => f(qp, wr, bad),
            None => -1,
        }
    }
}

/// `ibv_post_recv`, as the header's inline function does it.
///
/// # Safety
/// As [`post_send`], for receive work requests.
pub unsafe fn post_recv(qp: *mut IbvQp, wr: *mut IbvRecvWr, bad: *mut *mut IbvRecvWr) -> c_int {
    // SAFETY: as in `post_send`.
    unsafe {
        match (*(*qp).context).ops.post_recv {
            Some(f) => f(qp, wr, bad),
            None => -1,
        }
    }
}

/// `ibv_poll_cq`, as the header's inline function does it.
///
/// # Safety
/// `cq` must be a live CQ; `wc` must have room for `n` entries.
pub unsafe fn poll_cq(cq: *mut IbvCq, n: c_int, wc: *mut IbvWc) -> c_int {
    // SAFETY: the caller guarantees `cq` is live; see `post_send`.
    unsafe {
        match (*(*cq).context).ops.poll_cq {
            Some(f) => f(cq, n, wc),
            None => -1,
        }
    }
}

/// `ibv_req_notify_cq`, as the header's inline function does it.
///
/// # Safety
/// `cq` must be a live CQ.
pub unsafe fn req_notify_cq(cq: *mut IbvCq, solicited_only: c_int) -> c_int {
    // SAFETY: the caller guarantees `cq` is live; see `post_send`.
    unsafe {
        match (*(*cq).context).ops.req_notify_cq {
            Some(f) => f(cq, solicited_only),
            None => -1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};
    use std::process::Command;

    /// Everything the Rust side assumes about verbs.h, as `name value` lines the C program
    /// prints the same way.
    fn rust_side() -> Vec<(String, usize)> {
        let mut v: Vec<(String, usize)> = Vec::new();
        let mut put = |name: &str, value: usize| v.push((name.to_string(), value));
        put("ctx.ops", offset_of!(IbvContext, ops));
        put("ops.poll_cq", offset_of!(IbvContextOps, poll_cq));
        put("ops.req_notify_cq", offset_of!(IbvContextOps, req_notify_cq));
        put("ops.post_send", offset_of!(IbvContextOps, post_send));
        put("ops.post_recv", offset_of!(IbvContextOps, post_recv));
        put("ops.size", size_of::<IbvContextOps>());
        put("cq.context", offset_of!(IbvCq, context));
        put("qp.context", offset_of!(IbvQp, context));
        put("qp.qp_num", offset_of!(IbvQp, qp_num));
        put("mr.addr", offset_of!(IbvMr, addr));
        put("mr.length", offset_of!(IbvMr, length));
        put("mr.lkey", offset_of!(IbvMr, lkey));
        put("mr.rkey", offset_of!(IbvMr, rkey));
        put("mr.size", size_of::<IbvMr>());
        put("channel.fd", offset_of!(IbvCompChannel, fd));
        put("port.state", offset_of!(IbvPortAttr, state));
        put("port.active_mtu", offset_of!(IbvPortAttr, active_mtu));
        put("port.gid_tbl_len", offset_of!(IbvPortAttr, gid_tbl_len));
        put("port.lid", offset_of!(IbvPortAttr, lid));
        put("port.link_layer", offset_of!(IbvPortAttr, link_layer));
        put("port.port_cap_flags2", offset_of!(IbvPortAttr, port_cap_flags2));
        put("gid.size", size_of::<IbvGid>());
        put("gid.align", align_of::<IbvGid>());
        put("cap.size", size_of::<IbvQpCap>());
        put("init.cap", offset_of!(IbvQpInitAttr, cap));
        put("init.qp_type", offset_of!(IbvQpInitAttr, qp_type));
        put("init.sq_sig_all", offset_of!(IbvQpInitAttr, sq_sig_all));
        put("init.size", size_of::<IbvQpInitAttr>());
        put("grh.flow_label", offset_of!(IbvGlobalRoute, flow_label));
        put("grh.sgid_index", offset_of!(IbvGlobalRoute, sgid_index));
        put("grh.hop_limit", offset_of!(IbvGlobalRoute, hop_limit));
        put("grh.traffic_class", offset_of!(IbvGlobalRoute, traffic_class));
        put("grh.size", size_of::<IbvGlobalRoute>());
        put("ah.dlid", offset_of!(IbvAhAttr, dlid));
        put("ah.sl", offset_of!(IbvAhAttr, sl));
        put("ah.is_global", offset_of!(IbvAhAttr, is_global));
        put("ah.port_num", offset_of!(IbvAhAttr, port_num));
        put("ah.size", size_of::<IbvAhAttr>());
        put("qpa.qp_state", offset_of!(IbvQpAttr, qp_state));
        put("qpa.path_mtu", offset_of!(IbvQpAttr, path_mtu));
        put("qpa.rq_psn", offset_of!(IbvQpAttr, rq_psn));
        put("qpa.sq_psn", offset_of!(IbvQpAttr, sq_psn));
        put("qpa.dest_qp_num", offset_of!(IbvQpAttr, dest_qp_num));
        put("qpa.qp_access_flags", offset_of!(IbvQpAttr, qp_access_flags));
        put("qpa.cap", offset_of!(IbvQpAttr, cap));
        put("qpa.ah_attr", offset_of!(IbvQpAttr, ah_attr));
        put("qpa.pkey_index", offset_of!(IbvQpAttr, pkey_index));
        put("qpa.max_rd_atomic", offset_of!(IbvQpAttr, max_rd_atomic));
        put("qpa.max_dest_rd_atomic", offset_of!(IbvQpAttr, max_dest_rd_atomic));
        put("qpa.min_rnr_timer", offset_of!(IbvQpAttr, min_rnr_timer));
        put("qpa.port_num", offset_of!(IbvQpAttr, port_num));
        put("qpa.timeout", offset_of!(IbvQpAttr, timeout));
        put("qpa.retry_cnt", offset_of!(IbvQpAttr, retry_cnt));
        put("qpa.rnr_retry", offset_of!(IbvQpAttr, rnr_retry));
        put("qpa.size", size_of::<IbvQpAttr>());
        put("sge.size", size_of::<IbvSge>());
        put("swr.sg_list", offset_of!(IbvSendWr, sg_list));
        put("swr.num_sge", offset_of!(IbvSendWr, num_sge));
        put("swr.opcode", offset_of!(IbvSendWr, opcode));
        put("swr.send_flags", offset_of!(IbvSendWr, send_flags));
        put("swr.imm_data", offset_of!(IbvSendWr, imm_data));
        put("swr.remote_addr", offset_of!(IbvSendWr, remote_addr));
        put("swr.rkey", offset_of!(IbvSendWr, rkey));
        put("swr.size", size_of::<IbvSendWr>());
        put("rwr.num_sge", offset_of!(IbvRecvWr, num_sge));
        put("rwr.size", size_of::<IbvRecvWr>());
        put("wc.status", offset_of!(IbvWc, status));
        put("wc.opcode", offset_of!(IbvWc, opcode));
        put("wc.byte_len", offset_of!(IbvWc, byte_len));
        put("wc.imm_data", offset_of!(IbvWc, imm_data));
        put("wc.wc_flags", offset_of!(IbvWc, wc_flags));
        put("wc.size", size_of::<IbvWc>());
        put("IBV_PORT_ACTIVE", IBV_PORT_ACTIVE as usize);
        put("IBV_LINK_LAYER_ETHERNET", IBV_LINK_LAYER_ETHERNET as usize);
        put("IBV_QPT_RC", IBV_QPT_RC as usize);
        put("IBV_QPS_INIT", IBV_QPS_INIT as usize);
        put("IBV_QPS_RTR", IBV_QPS_RTR as usize);
        put("IBV_QPS_RTS", IBV_QPS_RTS as usize);
        put("IBV_QP_STATE", IBV_QP_STATE as usize);
        put("IBV_QP_ACCESS_FLAGS", IBV_QP_ACCESS_FLAGS as usize);
        put("IBV_QP_PKEY_INDEX", IBV_QP_PKEY_INDEX as usize);
        put("IBV_QP_PORT", IBV_QP_PORT as usize);
        put("IBV_QP_AV", IBV_QP_AV as usize);
        put("IBV_QP_PATH_MTU", IBV_QP_PATH_MTU as usize);
        put("IBV_QP_TIMEOUT", IBV_QP_TIMEOUT as usize);
        put("IBV_QP_RETRY_CNT", IBV_QP_RETRY_CNT as usize);
        put("IBV_QP_RNR_RETRY", IBV_QP_RNR_RETRY as usize);
        put("IBV_QP_RQ_PSN", IBV_QP_RQ_PSN as usize);
        put("IBV_QP_MAX_QP_RD_ATOMIC", IBV_QP_MAX_QP_RD_ATOMIC as usize);
        put("IBV_QP_MIN_RNR_TIMER", IBV_QP_MIN_RNR_TIMER as usize);
        put("IBV_QP_SQ_PSN", IBV_QP_SQ_PSN as usize);
        put("IBV_QP_MAX_DEST_RD_ATOMIC", IBV_QP_MAX_DEST_RD_ATOMIC as usize);
        put("IBV_QP_DEST_QPN", IBV_QP_DEST_QPN as usize);
        put("IBV_ACCESS_LOCAL_WRITE", IBV_ACCESS_LOCAL_WRITE as usize);
        put("IBV_ACCESS_REMOTE_WRITE", IBV_ACCESS_REMOTE_WRITE as usize);
        put("IBV_WR_RDMA_WRITE_WITH_IMM", IBV_WR_RDMA_WRITE_WITH_IMM as usize);
        put("IBV_WR_SEND", IBV_WR_SEND as usize);
        put("IBV_SEND_SIGNALED", IBV_SEND_SIGNALED as usize);
        put("IBV_WC_SUCCESS", IBV_WC_SUCCESS as usize);
        put("IBV_WC_RECV", IBV_WC_RECV as usize);
        put("IBV_WC_RECV_RDMA_WITH_IMM", IBV_WC_RECV_RDMA_WITH_IMM as usize);
        put("IBV_WC_WITH_IMM", IBV_WC_WITH_IMM as usize);
        v
    }

    const C_PROGRAM: &str = r#"
#include <stdio.h>
#include <stddef.h>
#include <infiniband/verbs.h>
#define O(n, t, f) printf("%s %zu\n", n, offsetof(struct t, f))
#define S(n, t) printf("%s %zu\n", n, sizeof(struct t))
#define K(c) printf("%s %zu\n", #c, (size_t)(c))
int main(void) {
    O("ctx.ops", ibv_context, ops);
    O("ops.poll_cq", ibv_context_ops, poll_cq);
    O("ops.req_notify_cq", ibv_context_ops, req_notify_cq);
    O("ops.post_send", ibv_context_ops, post_send);
    O("ops.post_recv", ibv_context_ops, post_recv);
    S("ops.size", ibv_context_ops);
    O("cq.context", ibv_cq, context);
    O("qp.context", ibv_qp, context);
    O("qp.qp_num", ibv_qp, qp_num);
    O("mr.addr", ibv_mr, addr);
    O("mr.length", ibv_mr, length);
    O("mr.lkey", ibv_mr, lkey);
    O("mr.rkey", ibv_mr, rkey);
    S("mr.size", ibv_mr);
    O("channel.fd", ibv_comp_channel, fd);
    O("port.state", ibv_port_attr, state);
    O("port.active_mtu", ibv_port_attr, active_mtu);
    O("port.gid_tbl_len", ibv_port_attr, gid_tbl_len);
    O("port.lid", ibv_port_attr, lid);
    O("port.link_layer", ibv_port_attr, link_layer);
    O("port.port_cap_flags2", ibv_port_attr, port_cap_flags2);
    printf("gid.size %zu\n", sizeof(union ibv_gid));
    printf("gid.align %zu\n", _Alignof(union ibv_gid));
    S("cap.size", ibv_qp_cap);
    O("init.cap", ibv_qp_init_attr, cap);
    O("init.qp_type", ibv_qp_init_attr, qp_type);
    O("init.sq_sig_all", ibv_qp_init_attr, sq_sig_all);
    S("init.size", ibv_qp_init_attr);
    O("grh.flow_label", ibv_global_route, flow_label);
    O("grh.sgid_index", ibv_global_route, sgid_index);
    O("grh.hop_limit", ibv_global_route, hop_limit);
    O("grh.traffic_class", ibv_global_route, traffic_class);
    S("grh.size", ibv_global_route);
    O("ah.dlid", ibv_ah_attr, dlid);
    O("ah.sl", ibv_ah_attr, sl);
    O("ah.is_global", ibv_ah_attr, is_global);
    O("ah.port_num", ibv_ah_attr, port_num);
    S("ah.size", ibv_ah_attr);
    O("qpa.qp_state", ibv_qp_attr, qp_state);
    O("qpa.path_mtu", ibv_qp_attr, path_mtu);
    O("qpa.rq_psn", ibv_qp_attr, rq_psn);
    O("qpa.sq_psn", ibv_qp_attr, sq_psn);
    O("qpa.dest_qp_num", ibv_qp_attr, dest_qp_num);
    O("qpa.qp_access_flags", ibv_qp_attr, qp_access_flags);
    O("qpa.cap", ibv_qp_attr, cap);
    O("qpa.ah_attr", ibv_qp_attr, ah_attr);
    O("qpa.pkey_index", ibv_qp_attr, pkey_index);
    O("qpa.max_rd_atomic", ibv_qp_attr, max_rd_atomic);
    O("qpa.max_dest_rd_atomic", ibv_qp_attr, max_dest_rd_atomic);
    O("qpa.min_rnr_timer", ibv_qp_attr, min_rnr_timer);
    O("qpa.port_num", ibv_qp_attr, port_num);
    O("qpa.timeout", ibv_qp_attr, timeout);
    O("qpa.retry_cnt", ibv_qp_attr, retry_cnt);
    O("qpa.rnr_retry", ibv_qp_attr, rnr_retry);
    S("qpa.size", ibv_qp_attr);
    S("sge.size", ibv_sge);
    O("swr.sg_list", ibv_send_wr, sg_list);
    O("swr.num_sge", ibv_send_wr, num_sge);
    O("swr.opcode", ibv_send_wr, opcode);
    O("swr.send_flags", ibv_send_wr, send_flags);
    O("swr.imm_data", ibv_send_wr, imm_data);
    O("swr.remote_addr", ibv_send_wr, wr.rdma.remote_addr);
    O("swr.rkey", ibv_send_wr, wr.rdma.rkey);
    S("swr.size", ibv_send_wr);
    O("rwr.num_sge", ibv_recv_wr, num_sge);
    S("rwr.size", ibv_recv_wr);
    O("wc.status", ibv_wc, status);
    O("wc.opcode", ibv_wc, opcode);
    O("wc.byte_len", ibv_wc, byte_len);
    O("wc.imm_data", ibv_wc, imm_data);
    O("wc.wc_flags", ibv_wc, wc_flags);
    S("wc.size", ibv_wc);
    K(IBV_PORT_ACTIVE); K(IBV_LINK_LAYER_ETHERNET);
    K(IBV_QPT_RC); K(IBV_QPS_INIT); K(IBV_QPS_RTR); K(IBV_QPS_RTS);
    K(IBV_QP_STATE); K(IBV_QP_ACCESS_FLAGS); K(IBV_QP_PKEY_INDEX); K(IBV_QP_PORT);
    K(IBV_QP_AV); K(IBV_QP_PATH_MTU); K(IBV_QP_TIMEOUT); K(IBV_QP_RETRY_CNT);
    K(IBV_QP_RNR_RETRY); K(IBV_QP_RQ_PSN); K(IBV_QP_MAX_QP_RD_ATOMIC);
    K(IBV_QP_MIN_RNR_TIMER); K(IBV_QP_SQ_PSN); K(IBV_QP_MAX_DEST_RD_ATOMIC);
    K(IBV_QP_DEST_QPN); K(IBV_ACCESS_LOCAL_WRITE); K(IBV_ACCESS_REMOTE_WRITE);
    K(IBV_WR_RDMA_WRITE_WITH_IMM); K(IBV_WR_SEND); K(IBV_SEND_SIGNALED);
    K(IBV_WC_SUCCESS); K(IBV_WC_RECV);
    K(IBV_WC_RECV_RDMA_WITH_IMM); K(IBV_WC_WITH_IMM);
    return 0;
}
"#;

    /// Every size, offset and constant the declarations above assume, compared with what the
    /// C compiler makes of the installed `<infiniband/verbs.h>` (libibverbs-dev, which the
    /// `rdma` feature needs to link anyway). Also checks the port attributes fit in ours.
    #[test]
    fn layout_matches_verbs_h() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("layout.c");
        let exe = dir.path().join("layout");
        std::fs::write(&src, C_PROGRAM).expect("write layout.c");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
        let out = Command::new(&cc)
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .output()
            .unwrap_or_else(|e| panic!("running the C compiler `{cc}`: {e}"));
        assert!(
            out.status.success(),
            "compiling against <infiniband/verbs.h> failed (is libibverbs-dev installed?):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let run = Command::new(&exe).output().expect("run layout probe");
        assert!(run.status.success(), "layout probe failed");
        let text = String::from_utf8(run.stdout).expect("utf-8");
        let c_side: std::collections::HashMap<String, usize> = text
            .lines()
            .map(|l| {
                let (k, v) = l.split_once(' ').expect("name value");
                (k.to_string(), v.parse().expect("number"))
            })
            .collect();
        let mut wrong = Vec::new();
        for (name, value) in rust_side() {
            match c_side.get(&name) {
                Some(&c) if c == value => {}
                Some(&c) => wrong.push(format!("{name}: Rust {value}, verbs.h {c}")),
                None => wrong.push(format!("{name}: not printed by the C probe")),
            }
        }
        assert!(wrong.is_empty(), "layout differs from verbs.h:\n{}", wrong.join("\n"));
        // The header's port attributes must fit in ours (we add spare room after them).
        assert!(size_of::<IbvPortAttr>() >= 52 + 64);
    }
}
