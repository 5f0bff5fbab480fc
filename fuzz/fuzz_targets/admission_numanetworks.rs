//! AdmissionReview bodies for NumaNetworks, as the API server posts them to
//! `/numanetworks/validate` (weft_crds' rules, as `weft webhook` passes them).
#![no_main]
use libfuzzer_sys::fuzz_target;
use weft_admission::webhook::AdmissionPath;

fuzz_target!(|data: &[u8]| {
    let _ = weft_fuzz::runtime().block_on(weft_fuzz::webhook().review(AdmissionPath::NumaNetworksValidate, data));
});
