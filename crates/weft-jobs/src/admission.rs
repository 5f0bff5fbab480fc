//! Admission decisions for Volcano Jobs and their pods (being written).
