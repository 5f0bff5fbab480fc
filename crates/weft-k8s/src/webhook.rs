//! The admission webhook server (being written).
