//! The VF's VLAN, set through its PF with weft-cni's [`PfControl`] (the kernel's
//! `NetlinkPfControl`, or `FakePfControl` in tests), behind [`VfVlan`]: a seam the driver can
//! hold as a trait object and call from its gRPC handlers (whose futures must be `Send`).

use std::sync::Arc;

use futures::future::BoxFuture;
use weft_cni::net::{LinkError, Links};
use weft_cni::pf::{PfControl, PfError, PfVfState, VlanProto};

/// Reads and sets a VF's PF-side VLAN.
pub trait VfVlan: Send + Sync + 'static {
    /// VF `vf`'s settings on PF `pf` (its netdev).
    fn state<'a>(&'a self, pf: &'a str, vf: u32) -> BoxFuture<'a, Result<PfVfState, PfError>>;
    /// Set VF `vf`'s VLAN on PF `pf` (vlan 0 with qos 0: untagged).
    fn set<'a>(
        &'a self,
        pf: &'a str,
        vf: u32,
        vlan: u16,
        qos: u8,
        proto: VlanProto,
    ) -> BoxFuture<'a, Result<(), PfError>>;
}

/// A [`PfControl`] with a netlink connection in the host network namespace.
#[derive(Debug)]
pub struct PfVlan<P> {
    host: Links,
    control: Arc<P>,
}

impl<P> PfVlan<P> {
    /// `control` over a netlink connection in the calling thread's network namespace (the host's,
    /// for the agent). Must be called within a tokio runtime.
    pub fn new(control: Arc<P>) -> Result<PfVlan<P>, LinkError> {
        Ok(PfVlan { host: Links::here()?, control })
    }
}

impl<P: PfControl + 'static> VfVlan for PfVlan<P> {
    fn state<'a>(&'a self, pf: &'a str, vf: u32) -> BoxFuture<'a, Result<PfVfState, PfError>> {
        Box::pin(self.control.vf_state(&self.host, pf, vf))
    }

    fn set<'a>(
        &'a self,
        pf: &'a str,
        vf: u32,
        vlan: u16,
        qos: u8,
        proto: VlanProto,
    ) -> BoxFuture<'a, Result<(), PfError>> {
        Box::pin(self.control.set_vlan(&self.host, pf, vf, vlan, qos, proto))
    }
}
