//! AdmissionReview bodies for Numaflow Pipelines, as the API server posts them to
//! `/pipelines/mutate` and `/pipelines/validate`. The first byte picks the path; the rest is the
//! body.
#![no_main]
use libfuzzer_sys::fuzz_target;
use weft_admission::webhook::AdmissionPath;

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else { return };
    let path = if which & 1 == 0 { AdmissionPath::PipelinesMutate } else { AdmissionPath::PipelinesValidate };
    let _ = weft_fuzz::runtime().block_on(weft_fuzz::webhook().review(path, body));
});
