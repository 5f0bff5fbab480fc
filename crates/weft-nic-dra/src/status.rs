//! The ResourceClaim status the driver writes: `status.devices[].networkData`.
