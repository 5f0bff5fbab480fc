//! The NRI sandbox hooks: move a prepared VF into the pod's network namespace and back.
