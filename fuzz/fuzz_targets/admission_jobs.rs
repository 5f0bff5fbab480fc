//! AdmissionReview bodies for Volcano Jobs, as the API server posts them to `/jobs/mutate` and
//! `/jobs/validate`. The first byte picks the path; the rest is the body.
#![no_main]
use libfuzzer_sys::fuzz_target;
use weft_admission::webhook::AdmissionPath;

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else { return };
    let path = if which & 1 == 0 { AdmissionPath::JobsMutate } else { AdmissionPath::JobsValidate };
    let _ = weft_fuzz::runtime().block_on(weft_fuzz::webhook().review(path, body));
});
