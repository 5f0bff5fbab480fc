//! weft-admission: Volcano Jobs from submission to pods.
//!
//! - [`webhook`]: `weft webhook`, admission for Volcano Jobs and their pods (AdmissionReview v1 over
//!   HTTPS); the decisions are weft-jobs' pure functions.
//! - [`job_controller`]: the job-level objects of weft's plugins (the `svc` hosts ConfigMap,
//!   headless Service and NetworkPolicy, the `ssh` Secret, the `mpi` hostfile, ray's head Service),
//!   owned by their Job.
//!
//! Operator documentation: `docs/webhook.md`, `docs/jobs.md`.

pub mod job_controller;
pub mod webhook;
