//! The Numaflow examples in deploy/examples/numaflow parse, are valid, and are wired as
//! docs/pipelines.md says: both forms of the binding give the same vertices, and the default
//! example binds its edges in the annotation, the form Numaflow's full Pipeline CRD lets through.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use weft_pipeline::{VERTEX_DOMAINS_ANNOTATION, VertexDomainEntry, WiringOptions, claim_name, wire};

fn example(name: &str) -> Value {
    let path = format!("{}/../../deploy/examples/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn wired(name: &str, network: &str) -> (Value, weft_pipeline::Wiring) {
    let p = example(name);
    assert_eq!(p["apiVersion"], "numaflow.numaproj.io/v1alpha1");
    assert_eq!(p["kind"], "Pipeline");
    let w = wire(&p, Some("default"), &WiringOptions::default(), &|n| n == network)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(w.warnings.is_empty(), "{name}: {:?}", w.warnings);
    let mut out = p.clone();
    json_patch::patch(&mut out, &w.ops).unwrap();
    (out, w)
}

#[test]
fn the_video_pipeline_examples_are_valid_and_wired_alike() {
    // The network the pipeline names is the one in deploy/examples/numanetwork.yaml.
    let nn = example("numanetwork.yaml");
    let network = nn["metadata"]["name"].as_str().unwrap().to_owned();
    assert_eq!(network, "pipeline1-multi-network");
    let rct = claim_name(&network);

    let (spec_form, w) = wired("numaflow/video-pipeline.yaml", &network);
    let (field_form, _) = wired("numaflow/video-pipeline-field.yaml", &network);
    assert_eq!(spec_form["spec"]["vertices"], field_form["spec"]["vertices"]);
    // The default example fits Numaflow's full CRD: no edge carries a field the Go Edge type lacks.
    let default = example("numaflow/video-pipeline.yaml");
    for e in default["spec"]["edges"].as_array().unwrap() {
        let keys: Vec<&String> = e.as_object().unwrap().keys().collect();
        assert!(keys.iter().all(|k| ["from", "to", "conditions", "onFull"].contains(&k.as_str())), "{e}");
    }

    let names: Vec<&str> = w.vertices.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["filter-resize", "inference", "out"]);
    let inference = &spec_form["spec"]["vertices"][2];
    assert_eq!(
        inference["resourceClaims"],
        serde_json::json!([{"name": "gpu", "resourceClaimTemplateName": "a100"},
            {"name": rct, "resourceClaimTemplateName": rct}])
    );
    assert_eq!(
        inference["udf"]["container"]["resources"]["claims"],
        serde_json::json!([{"name": "gpu"}, {"name": rct}])
    );
    let entries: Vec<VertexDomainEntry> =
        serde_json::from_str(inference["metadata"]["annotations"][VERTEX_DOMAINS_ANNOTATION].as_str().unwrap())
            .unwrap();
    assert_eq!(entries[0].domain, "inference.pipeline1-multi-network.video.default.vertexdomain.local");
    assert_eq!(
        w.vertices[0].targets_env().as_deref(),
        Some("inference.pipeline1-multi-network.video.default.vertexdomain.local"),
        "filter-resize sends to inference directly"
    );
    assert_eq!(w.vertices[1].targets_env(), None, "inference → out goes through the ISB");

    // Without the network, the example is refused, naming the edge.
    let err = wire(&example("numaflow/video-pipeline.yaml"), Some("default"), &WiringOptions::default(), &|_| false)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "metadata.annotations[weft.io/numa-network-edges][0].numaNetwork: NumaNetwork 'pipeline1-multi-network' \
         does not exist; create it first (kubectl get numanetworks)"
    );
}

#[test]
fn the_gpu_claim_template_is_the_one_the_pipeline_names() {
    let t = example("numaflow/gpu-claim-template.yaml");
    assert_eq!(t["kind"], "ResourceClaimTemplate");
    assert_eq!(t["apiVersion"], "resource.k8s.io/v1");
    let p = example("numaflow/video-pipeline.yaml");
    assert_eq!(p["spec"]["vertices"][1]["resourceClaims"][0]["resourceClaimTemplateName"], t["metadata"]["name"]);
    assert!(t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"].is_string());
}

#[test]
fn the_local_review_carries_the_example_pipeline() {
    // deploy/examples/numaflow/pipeline-review.json is what docs/pipelines.md sends to a local
    // `weft webhook`: the API server's review of creating video-pipeline.yaml in namespace default.
    let path = format!("{}/../../deploy/examples/numaflow/pipeline-review.json", env!("CARGO_MANIFEST_DIR"));
    let review: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(review["kind"], "AdmissionReview");
    assert_eq!(review["request"]["operation"], "CREATE");
    assert_eq!(review["request"]["namespace"], "default");
    let mut expected = example("numaflow/video-pipeline.yaml");
    expected["metadata"]["namespace"] = serde_json::json!("default");
    assert_eq!(review["request"]["object"], expected, "regenerate the review from the YAML");
}
