//! DNS record values: a value found under weft's etcd prefix (another writer's, or damaged),
//! read by `record::owner_of` before weft overwrites or deletes it; and a pod's vertex-domains
//! annotation, from which `pod::plan` builds the records to write. The first byte picks which;
//! the rest is the value.
#![no_main]
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use libfuzzer_sys::fuzz_target;
use weft_dns::record::Prefix;

fuzz_target!(|data: &[u8]| {
    let Some((&which, value)) = data.split_first() else { return };
    if which & 1 == 0 {
        let _ = weft_dns::record::owner_of(value);
        return;
    }
    // Annotation values are strings in the API, so valid UTF-8.
    let Ok(annotation) = std::str::from_utf8(value) else { return };
    let labels = BTreeMap::from([
        (weft_pipeline::domain::PIPELINE_NAME_LABEL.to_owned(), "video".to_owned()),
        (weft_pipeline::domain::VERTEX_NAME_LABEL.to_owned(), "inference".to_owned()),
    ]);
    let annotations =
        BTreeMap::from([(weft_pipeline::domain::VERTEX_DOMAINS_ANNOTATION.to_owned(), annotation.to_owned())]);
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("video-inference-0".to_owned()),
            namespace: Some("default".to_owned()),
            uid: Some("u-1".to_owned()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    };
    let Ok(prefix) = Prefix::new("/skydns") else { return };
    let _ = weft_dns::pod::plan(&pod, &prefix, "weft.local");
});
