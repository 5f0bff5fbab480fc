//! weft-resources: Kubernetes resource arithmetic and name rules, done once for every part of weft
//! that needs them (the scheduler extender, the node agent, the simulator, the job plugins).
//!
//! - [`quantity`]: the Kubernetes quantity notation (`500m`, `1.5`, `4Gi`, `129e6`) read as an
//!   exact decimal, then rounded up the way `Quantity.Value()` and `Quantity.MilliValue()` do, or
//!   required to be a whole count (devices).
//! - [`request`]: how much of one resource a pod needs, by the kubelet's and the scheduler's rules
//!   (`resourcehelper.PodRequests`): app containers summed, init containers by their peak, sidecar
//!   (restartable) init containers counted both ways.
//! - [`names`]: object names as the API server validates them (DNS-1123 labels and subdomains).
//!
//! Pure functions, no I/O.

pub mod names;
pub mod quantity;
pub mod request;

pub use quantity::{QuantityError, milli_value, value, whole};
pub use request::{RequestError, Stage, container_amount, container_request, pod_need, pod_request};
