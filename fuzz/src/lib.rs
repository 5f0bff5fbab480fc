//! Helpers the fuzz targets share: a reader that hands out its bytes in small pieces (so the
//! streaming decoders meet every buffer boundary), the webhook state `weft webhook` builds, and a
//! tokio runtime for the async entry points.
//!
//! Each target calls the function production calls on the untrusted bytes; nothing here decodes
//! anything itself.

use std::io::{self, Read};
use std::sync::{Arc, OnceLock};

use weft_admission::webhook::{
    FixedPipelineCrd, InMemoryJobs, InMemoryNumaNetworks, NetworkOptions, NumaNetworkValidator, WebhookState,
    WiringOptions, typed_validator,
};
use weft_crds::NumaNetwork;
use weft_jobs::admission::AdmissionOptions;
use weft_pipeline::EdgeField;

/// A reader over `data` that returns at most `chunk` bytes per read, as an HTTP body arrives in
/// frames.
pub struct Chunked<'a> {
    data: &'a [u8],
    chunk: usize,
}

impl<'a> Chunked<'a> {
    /// Reads `data` `chunk` bytes at a time (at least 1).
    pub fn new(data: &'a [u8], chunk: usize) -> Chunked<'a> {
        Chunked { data, chunk: chunk.max(1) }
    }
}

impl Read for Chunked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.chunk.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// One current-thread tokio runtime per fuzzing process.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a current-thread tokio runtime")
    })
}

/// weft_crds' NumaNetwork rules, as `weft webhook` passes them (crates/weft/src/cmd_webhook.rs).
fn crd_rules() -> NumaNetworkValidator {
    typed_validator(|n: &NumaNetwork, old: Option<&NumaNetwork>| {
        let checked = match old {
            None => n.validate(),
            Some(old) => n.validate_update(old),
        };
        checked.err().map(|e| e.errors().iter().map(ToString::to_string).collect()).unwrap_or_default()
    })
}

/// The Volcano Jobs the webhook knows: deploy/examples/jobs, so that pods naming them as owner
/// go through the plugins' pod mutation.
const EXAMPLE_JOBS: [&str; 5] = [
    include_str!("../../deploy/examples/jobs/mpi.yaml"),
    include_str!("../../deploy/examples/jobs/pytorch.yaml"),
    include_str!("../../deploy/examples/jobs/tensorflow.yaml"),
    include_str!("../../deploy/examples/jobs/ray.yaml"),
    include_str!("../../deploy/examples/jobs/mxnet.yaml"),
];

/// The NumaNetworks that exist (the pipeline example's).
const NETWORKS: [&str; 2] = ["pipeline1-multi-network", "pipeline1-multi-network-rct"];

/// The webhook's state as `weft webhook` builds it: every path served, the NumaNetwork rules of
/// weft_crds, the Pipeline CRD keeping `spec.edges[].numaNetwork` (both binding forms reach the webhook), the example Jobs and NumaNetworks in
/// the in-memory sources (synced).
pub fn webhook() -> &'static WebhookState {
    static STATE: OnceLock<WebhookState> = OnceLock::new();
    STATE.get_or_init(|| {
        let jobs = Arc::new(InMemoryJobs::new());
        for text in EXAMPLE_JOBS {
            for doc in text.split("\n---") {
                let Ok(mut value) = serde_saphyr::from_str::<serde_json::Value>(doc) else { continue };
                if value.get("kind").and_then(serde_json::Value::as_str) != Some("Job") {
                    continue;
                }
                // The API server gives every object a uid; pods name their Job by name and uid.
                let name = value.pointer("/metadata/name").and_then(serde_json::Value::as_str).unwrap_or_default();
                let uid = format!("uid-{name}");
                if let Some(meta) = value.get_mut("metadata").and_then(serde_json::Value::as_object_mut) {
                    meta.insert("uid".to_owned(), serde_json::Value::String(uid));
                }
                if let Ok(job) = weft_jobs::job::from_value(value) {
                    jobs.insert(job);
                }
            }
        }
        jobs.set_synced(true);
        let networks = Arc::new(InMemoryNumaNetworks::new());
        for n in NETWORKS {
            networks.insert(n);
        }
        networks.set_synced(true);
        let opts =
            NetworkOptions { wiring: WiringOptions::default(), max_numa_networks: 64, validator: Some(crd_rules()) };
        WebhookState::new(jobs, AdmissionOptions::default())
            .with_numa_networks(networks, opts)
            .with_pipeline_crd(Arc::new(FixedPipelineCrd(Some(EdgeField::Kept))))
    })
}
