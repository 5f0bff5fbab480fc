//! weft-ipam: cluster-wide IP address management for weft's networks, shared by the components
//! that hand out a NumaNetwork's addresses (weft's NIC DRA driver, the dranet profile provider)
//! and the one that accounts for and collects them (the NumaNetwork controller).
//!
//! - [`network_address`]: the `NetworkAddress` resource (`weft.io/v1alpha1`, cluster-scoped), one
//!   object per address handed out, and allocation and release over it.
//! - [`cidr`]: IP networks in CIDR notation, as Kubernetes validates them.

pub mod cidr;
pub mod network_address;

pub use cidr::{Cidr, CidrError};
