//! AdmissionReview bodies for Pods, as the API server posts them to `/pods/mutate` (pods owned by
//! the example Volcano Jobs the webhook knows go through their plugins).
#![no_main]
use libfuzzer_sys::fuzz_target;
use weft_admission::webhook::AdmissionPath;

fuzz_target!(|data: &[u8]| {
    let _ = weft_fuzz::runtime().block_on(weft_fuzz::webhook().review(AdmissionPath::PodsMutate, data));
});
