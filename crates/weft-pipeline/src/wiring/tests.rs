#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::{NUMA_NETWORK_EDGES_ANNOTATION, VERTEX_DOMAIN_ENV, VERTEX_DOMAIN_TARGETS_ENV};
use serde_json::json;

const NN: &str = "pipeline1-multi-network";
const RCT: &str = "pipeline1-multi-network-rct";

/// The seed's video pipeline (in → filter-resize → inference → out): filter-resize and inference
/// hold a GPU claim, filter-resize → inference is `direct` and inference → out `multi-isbsvc` on
/// pipeline1-multi-network, exactly as the seed's Pipeline example writes them.
fn seed_pipeline() -> Value {
    json!({
        "apiVersion": "numaflow.numaproj.io/v1alpha1",
        "kind": "Pipeline",
        "metadata": {"name": "video", "namespace": "default"},
        "spec": {
            "vertices": [
                {"name": "in", "source": {"udsource": {"container": {"image": "video-source:1"}}}},
                {"name": "filter-resize",
                 "udf": {"container": {"image": "filter-resize:1", "resources": {"claims": [{"name": "gpu"}]}}},
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "A100"}]},
                {"name": "inference",
                 "udf": {"container": {"image": "inference:1", "resources": {"claims": [{"name": "gpu"}]}}},
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "A100"}]},
                {"name": "out", "sink": {"udsink": {"container": {"image": "video-sink:1"}}}}
            ],
            "edges": [
                {"from": "in", "to": "filter-resize"},
                {"from": "filter-resize", "to": "inference",
                 "numaNetwork": {"name": NN, "connectionType": "direct"}},
                {"from": "inference", "to": "out",
                 "numaNetwork": {"name": NN, "connectionType": "multi-isbsvc"}}
            ]
        }
    })
}

fn exists(name: &str) -> bool {
    name == NN || name == "other-net"
}

fn wired(p: &Value) -> (Value, Wiring) {
    let w = wire(p, None, &WiringOptions::default(), &exists).unwrap();
    let mut out = p.clone();
    json_patch::patch(&mut out, &w.ops).expect("the patch applies to the pipeline it was made for");
    (out, w)
}

fn env_of(container: &Value) -> Vec<(String, String)> {
    container["env"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| (e["name"].as_str().unwrap().to_owned(), e["value"].as_str().unwrap_or("").to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

fn domains_annotation(vertex: &Value) -> Vec<VertexDomainEntry> {
    serde_json::from_str(vertex["metadata"]["annotations"][VERTEX_DOMAINS_ANNOTATION].as_str().expect("annotation"))
        .unwrap()
}

const FILTER_DOMAIN: &str = "filter-resize.pipeline1-multi-network.video.default.vertexdomain.local";
const INFERENCE_DOMAIN: &str = "inference.pipeline1-multi-network.video.default.vertexdomain.local";
const OUT_DOMAIN: &str = "out.pipeline1-multi-network.video.default.vertexdomain.local";

#[test]
fn the_seed_pipeline_is_wired_as_the_seed_vertex_example_shows() {
    let (p, w) = wired(&seed_pipeline());
    let v = &p["spec"]["vertices"];

    // inference, field by field against the seed's Vertex example: the GPU claim kept first, the
    // network's claim added after it in both places (entry name <nn>-rct, see docs/pipelines.md).
    let inference = &v[2];
    assert_eq!(inference["name"], "inference");
    assert_eq!(inference["udf"]["container"]["image"], "inference:1");
    assert_eq!(inference["udf"]["container"]["resources"]["claims"], json!([{"name": "gpu"}, {"name": RCT}]));
    assert_eq!(
        inference["resourceClaims"],
        json!([
            {"name": "gpu", "resourceClaimTemplateName": "A100"},
            {"name": RCT, "resourceClaimTemplateName": RCT}
        ])
    );
    // to-side of a direct edge, from-side of a multi-isbsvc one: its domain, no targets.
    assert_eq!(
        env_of(&inference["udf"]["container"]),
        vec![(VERTEX_DOMAIN_ENV.to_owned(), INFERENCE_DOMAIN.to_owned())]
    );
    assert_eq!(
        domains_annotation(inference),
        vec![VertexDomainEntry { network: NN.into(), domain: INFERENCE_DOMAIN.into(), claim: RCT.into() }]
    );
    assert_eq!(inference["metadata"]["annotations"][MANAGED_ENV_ANNOTATION], VERTEX_DOMAIN_ENV);

    // filter-resize: from-side of the direct edge, so it also gets the inference domain as target.
    let filter = &v[1];
    assert_eq!(filter["udf"]["container"]["resources"]["claims"], json!([{"name": "gpu"}, {"name": RCT}]));
    assert_eq!(
        filter["resourceClaims"],
        json!([{"name": "gpu", "resourceClaimTemplateName": "A100"}, {"name": RCT, "resourceClaimTemplateName": RCT}])
    );
    assert_eq!(
        env_of(&filter["udf"]["container"]),
        vec![
            (VERTEX_DOMAIN_ENV.to_owned(), FILTER_DOMAIN.to_owned()),
            (VERTEX_DOMAIN_TARGETS_ENV.to_owned(), INFERENCE_DOMAIN.to_owned())
        ]
    );
    assert_eq!(filter["metadata"]["annotations"][MANAGED_ENV_ANNOTATION], "VERTEX_DOMAIN,VERTEX_DOMAIN_TARGETS");

    // out: to-side of the multi-isbsvc edge, a udsink: claim created from nothing, no targets.
    let out = &v[3];
    assert_eq!(out["resourceClaims"], json!([{"name": RCT, "resourceClaimTemplateName": RCT}]));
    assert_eq!(out["sink"]["udsink"]["container"]["resources"], json!({"claims": [{"name": RCT}]}));
    assert_eq!(
        env_of(&out["sink"]["udsink"]["container"]),
        vec![(VERTEX_DOMAIN_ENV.to_owned(), OUT_DOMAIN.to_owned())]
    );

    // in is on no bound edge: untouched.
    assert_eq!(v[0], seed_pipeline()["spec"]["vertices"][0]);
    // Nothing outside the vertices changes.
    let (mut a, mut b) = (p.clone(), seed_pipeline());
    a["spec"]["vertices"] = json!(null);
    b["spec"]["vertices"] = json!(null);
    assert_eq!(a, b);

    assert_eq!(w.vertices.iter().map(|x| x.name.as_str()).collect::<Vec<_>>(), ["filter-resize", "inference", "out"]);
    assert_eq!(w.vertices[0].targets_env().as_deref(), Some(INFERENCE_DOMAIN));
    assert_eq!(w.vertices[0].container, Some("udf.container"));
    assert!(w.warnings.is_empty(), "{:?}", w.warnings);
}

#[test]
fn wiring_a_wired_pipeline_changes_nothing() {
    let (p, _) = wired(&seed_pipeline());
    let again = wire(&p, None, &WiringOptions::default(), &exists).unwrap();
    assert!(again.ops.is_empty(), "{:?}", again.ops);
    assert!(again.warnings.is_empty());
}

#[test]
fn the_patch_adds_to_lists_in_place() {
    let w = wire(&seed_pipeline(), None, &WiringOptions::default(), &exists).unwrap();
    let ops = serde_json::to_value(&w.ops).unwrap();
    let paths: Vec<&str> = ops.as_array().unwrap().iter().map(|o| o["path"].as_str().unwrap()).collect();
    assert!(paths.contains(&"/spec/vertices/2/resourceClaims/1"), "{paths:?}");
    assert!(paths.contains(&"/spec/vertices/2/udf/container/resources/claims/1"), "{paths:?}");
    assert!(paths.contains(&"/spec/vertices/3/resourceClaims"), "created when absent: {paths:?}");
    assert!(paths.contains(&"/spec/vertices/1/metadata"), "{paths:?}");
    assert!(ops.as_array().unwrap().iter().all(|o| o["op"] == "add"), "{ops}");
}

#[test]
fn the_annotation_binds_edges_where_the_crd_prunes_the_field() {
    let mut p = seed_pipeline();
    for e in p["spec"]["edges"].as_array_mut().unwrap() {
        e.as_object_mut().unwrap().remove("numaNetwork");
    }
    p["metadata"]["annotations"] = json!({NUMA_NETWORK_EDGES_ANNOTATION: serde_json::to_string(&json!([
        {"from": "filter-resize", "to": "inference", "numaNetwork": NN, "connectionType": "direct"},
        {"from": "inference", "to": "out", "numaNetwork": NN, "connectionType": "multi-isbsvc"}
    ])).unwrap()});
    let (from_annotation, _) = wired(&p);
    let (from_spec, _) = wired(&seed_pipeline());
    assert_eq!(from_annotation["spec"]["vertices"], from_spec["spec"]["vertices"]);
}

#[test]
fn a_vertex_on_two_networks_gets_both_domains_sorted() {
    let mut p = seed_pipeline();
    p["spec"]["edges"][0]["numaNetwork"] = json!({"name": "other-net", "connectionType": "direct"});
    let (out, _) = wired(&p);
    let filter = &out["spec"]["vertices"][1];
    let other = "filter-resize.other-net.video.default.vertexdomain.local";
    assert_eq!(
        env_of(&filter["udf"]["container"])[0],
        (VERTEX_DOMAIN_ENV.to_owned(), format!("{other},{FILTER_DOMAIN}"))
    );
    let entries = domains_annotation(filter);
    assert_eq!(entries.iter().map(|e| e.network.as_str()).collect::<Vec<_>>(), ["other-net", NN]);
    assert_eq!(filter["udf"]["container"]["resources"]["claims"].as_array().unwrap().len(), 3, "gpu + two NICs");
    // in → filter-resize is direct on other-net: in sends to filter-resize there.
    let input = &out["spec"]["vertices"][0];
    assert_eq!(
        env_of(&input["source"]["udsource"]["container"]),
        vec![
            (VERTEX_DOMAIN_ENV.to_owned(), "in.other-net.video.default.vertexdomain.local".to_owned()),
            (VERTEX_DOMAIN_TARGETS_ENV.to_owned(), other.to_owned())
        ]
    );
}

#[test]
fn the_zone_and_namespace_are_parameters() {
    let opts = WiringOptions { zone: "nn.example".into() };
    let w = wire(&seed_pipeline(), Some("media"), &opts, &exists).unwrap();
    assert_eq!(w.vertices[1].domains[0].domain, "inference.pipeline1-multi-network.video.media.nn.example");
}

#[test]
fn a_user_set_variable_is_kept_with_a_warning_and_weft_replaces_only_its_own() {
    let mut p = seed_pipeline();
    p["spec"]["vertices"][1]["udf"]["container"]["env"] =
        json!([{"name": VERTEX_DOMAIN_TARGETS_ENV, "value": "mine.example"}, {"name": "A", "value": "1"}]);
    let (out, w) = wired(&p);
    let c = &out["spec"]["vertices"][1]["udf"]["container"];
    assert_eq!(
        env_of(c),
        vec![
            (VERTEX_DOMAIN_TARGETS_ENV.to_owned(), "mine.example".to_owned()),
            ("A".to_owned(), "1".to_owned()),
            (VERTEX_DOMAIN_ENV.to_owned(), FILTER_DOMAIN.to_owned())
        ]
    );
    assert_eq!(w.warnings.len(), 1, "{:?}", w.warnings);
    assert_eq!(
        w.warnings[0],
        format!(
            "spec.vertices[1].udf.container.env[0]: VERTEX_DOMAIN_TARGETS is set by the user to 'mine.example'; weft \
             leaves it and does not set '{INFERENCE_DOMAIN}' (the domains of the vertices it sends to over direct \
             edges); remove it to let weft set it"
        )
    );
    assert_eq!(out["spec"]["vertices"][1]["metadata"]["annotations"][MANAGED_ENV_ANNOTATION], VERTEX_DOMAIN_ENV);
    // Still idempotent, and the warning stays (the user's value still differs).
    let again = wire(&out, None, &WiringOptions::default(), &exists).unwrap();
    assert!(again.ops.is_empty(), "{:?}", again.ops);
    assert_eq!(again.warnings, w.warnings);

    // A value weft set is weft's: when the edge turns multi-isbsvc, the targets go.
    let (wired_seed, _) = wired(&seed_pipeline());
    let mut changed = wired_seed.clone();
    changed["spec"]["edges"][1]["numaNetwork"]["connectionType"] = json!("multi-isbsvc");
    let (out, _) = wired(&changed);
    let c = &out["spec"]["vertices"][1];
    assert_eq!(env_of(&c["udf"]["container"]), vec![(VERTEX_DOMAIN_ENV.to_owned(), FILTER_DOMAIN.to_owned())]);
    assert_eq!(c["metadata"]["annotations"][MANAGED_ENV_ANNOTATION], VERTEX_DOMAIN_ENV);
}

#[test]
fn an_unbound_pipeline_is_unwired_back_to_what_the_user_wrote() {
    let original = seed_pipeline();
    let (wired_p, _) = wired(&original);
    let mut unbound = wired_p.clone();
    for e in unbound["spec"]["edges"].as_array_mut().unwrap() {
        e.as_object_mut().unwrap().remove("numaNetwork");
    }
    let (out, w) = wired(&unbound);
    let mut expected = original.clone();
    for e in expected["spec"]["edges"].as_array_mut().unwrap() {
        e.as_object_mut().unwrap().remove("numaNetwork");
    }
    assert_eq!(out, expected);
    assert!(w.vertices.is_empty());
}

#[test]
fn a_pipeline_without_bindings_is_left_alone_even_if_malformed() {
    for p in
        [json!({}), json!({"spec": {"vertices": 3}}), json!({"metadata": {"name": "UPPER"}, "spec": {"edges": []}})]
    {
        let w = wire(&p, None, &WiringOptions::default(), &|_| false).unwrap();
        assert!(w.ops.is_empty() && w.warnings.is_empty() && w.vertices.is_empty(), "{p}");
    }
}

fn problems_of(p: &Value, namespace: Option<&str>) -> Vec<String> {
    wire(p, namespace, &WiringOptions::default(), &exists).expect_err("invalid").messages()
}

fn assert_has(problems: &[String], want: &str) {
    assert!(problems.iter().any(|p| p == want), "missing\n  {want}\nin\n  {}", problems.join("\n  "));
}

#[test]
fn every_problem_is_reported_once_and_named() {
    let mut p = seed_pipeline();
    p["spec"]["edges"][1]["numaNetwork"]["connectionType"] = json!("fast");
    p["spec"]["edges"][2]["numaNetwork"]["name"] = json!("ghost");
    p["spec"]["edges"][0] =
        json!({"from": "in", "to": "filter-resize", "numaNetwork": {"name": "ghost", "connectionType": "direct"}});
    p["spec"]["edges"].as_array_mut().unwrap().push(json!({"from": "out", "to": "nowhere",
        "numaNetwork": {"name": NN, "connectionType": "multi-isbsvc"}}));
    let problems = problems_of(&p, None);
    assert_has(&problems, "spec.edges[1].numaNetwork.connectionType: 'fast' is not direct or multi-isbsvc");
    assert_has(
        &problems,
        "spec.edges[0].numaNetwork.name: NumaNetwork 'ghost' does not exist; create it first (kubectl get numanetworks)",
    );
    assert_has(&problems, "spec.edges[3].to: vertex 'nowhere' is not in spec.vertices");
    assert_eq!(problems.len(), 3, "'ghost' once, though bound twice: {problems:#?}");
}

#[test]
fn names_that_cannot_make_domains_or_claims_are_refused() {
    let long = "n".repeat(60);
    let mut p = seed_pipeline();
    p["spec"]["edges"][1]["numaNetwork"]["name"] = json!(long);
    p["spec"]["edges"][2]["numaNetwork"]["name"] = json!("net.with.dots");
    let w = wire(&p, None, &WiringOptions::default(), &|_| true).unwrap_err();
    assert_eq!(
        w.at("spec.edges[1].numaNetwork.name").unwrap().message,
        format!(
            "the claim entry '{long}-rct' of NumaNetwork '{long}' must be a DNS label: it is 64 characters, over the DNS \
             label limit of 63; use a NumaNetwork name of at most 59 characters"
        )
    );
    assert!(w.at("spec.edges[2].numaNetwork.name").unwrap().message.contains("would add a level"), "{w}");

    let mut p = seed_pipeline();
    p["metadata"] = json!({"generateName": "video-"});
    let problems = problems_of(&p, Some("default"));
    assert_has(
        &problems,
        "metadata.name: missing; vertex domains contain the pipeline's name, so a Pipeline on a NumaNetwork cannot use generateName",
    );
    assert_eq!(problems.len(), 1, "{problems:?}");

    let problems = problems_of(&seed_pipeline(), Some("Media_Team"));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].starts_with("metadata.namespace: 'Media_Team' cannot be a DNS label"), "{problems:?}");

    // CoreDNS reads `any` as a wildcard label: named once, where the name comes from.
    let problems = problems_of(&seed_pipeline(), Some("any"));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].starts_with("metadata.namespace: 'any' cannot be a DNS label"), "{problems:?}");
    assert!(problems[0].contains("wildcard"), "{problems:?}");
    let mut p = seed_pipeline();
    p["metadata"]["name"] = json!("any");
    let problems = problems_of(&p, Some("default"));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].starts_with("metadata.name: 'any' cannot be a DNS label"), "{problems:?}");

    // Labels all fine, the whole name too long.
    let mut p = seed_pipeline();
    let v = "v".repeat(63);
    p["metadata"]["name"] = json!("p".repeat(63));
    p["spec"]["vertices"][3]["name"] = json!(v);
    p["spec"]["edges"][2]["to"] = json!(v);
    // 63 + 23 + 63 + 63 + 39 characters and 4 dots: 255.
    let zone = format!("{}.local", "z".repeat(33));
    let problems = wire(&p, Some(&"s".repeat(63)), &WiringOptions { zone }, &exists).unwrap_err().messages();
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(problems[0].starts_with("spec.vertices[3]: vertex domain '"), "{problems:#?}");
    assert!(problems[0].contains("is 255 characters, over the DNS limit of 253"), "{problems:#?}");

    let w = wire(&seed_pipeline(), None, &WiringOptions { zone: "bad..zone".into() }, &exists).unwrap_err();
    assert!(w.at("(webhook configuration)").is_some(), "{w}");
}

#[test]
fn direct_edges_need_user_containers_at_both_ends() {
    let mut p = seed_pipeline();
    p["spec"]["vertices"][0]["source"] = json!({"http": {}});
    p["spec"]["edges"][0]["numaNetwork"] = json!({"name": NN, "connectionType": "direct"});
    let problems = problems_of(&p, None);
    assert_eq!(
        problems,
        vec![
            "spec.edges[0].numaNetwork.connectionType: direct edges run between user containers, and vertex 'in' has none \
             (no udf.container, sink.udsink.container or source.udsource.container); use multi-isbsvc or give it one"
        ]
    );
    // multi-isbsvc is fine: the pod gets the claim and the annotation, no container to set.
    p["spec"]["edges"][0]["numaNetwork"]["connectionType"] = json!("multi-isbsvc");
    let (out, w) = wired(&p);
    assert_eq!(out["spec"]["vertices"][0]["resourceClaims"], json!([{"name": RCT, "resourceClaimTemplateName": RCT}]));
    assert_eq!(out["spec"]["vertices"][0]["source"], json!({"http": {}}));
    assert_eq!(w.vertices[0].container, None);
    assert!(out["spec"]["vertices"][0]["metadata"]["annotations"].get(MANAGED_ENV_ANNOTATION).is_none());
}

#[test]
fn a_claim_entry_of_the_same_name_for_something_else_is_a_conflict() {
    let mut p = seed_pipeline();
    p["spec"]["vertices"][2]["resourceClaims"][0] = json!({"name": RCT, "resourceClaimName": "someone-elses"});
    let problems = problems_of(&p, None);
    assert_eq!(
        problems,
        vec![format!(
            "spec.vertices[2].resourceClaims[0]: the entry '{RCT}' refers to ResourceClaim 'someone-elses', but weft needs \
             that entry for NumaNetwork '{NN}' (ResourceClaimTemplate '{RCT}'); rename the entry"
        )]
    );
    // The same entry weft would add, written by the user: kept, nothing added twice.
    let mut p = seed_pipeline();
    p["spec"]["vertices"][2]["resourceClaims"] = json!([{"name": RCT, "resourceClaimTemplateName": RCT}]);
    p["spec"]["vertices"][2]["udf"]["container"]["resources"]["claims"] = json!([{"name": RCT}]);
    let (out, _) = wired(&p);
    assert_eq!(out["spec"]["vertices"][2]["resourceClaims"].as_array().unwrap().len(), 1);
    assert_eq!(out["spec"]["vertices"][2]["udf"]["container"]["resources"]["claims"].as_array().unwrap().len(), 1);
}

#[test]
fn fields_of_the_wrong_shape_are_named_not_panicked_on() {
    let mut p = seed_pipeline();
    p["spec"]["vertices"][2]["resourceClaims"] = json!("gpu");
    p["spec"]["vertices"][1]["udf"]["container"]["env"] = json!({"A": "1"});
    p["spec"]["vertices"][3]["sink"]["udsink"]["container"]["resources"] = json!([1]);
    p["spec"]["vertices"][2]["udf"]["container"]["resources"]["claims"] = json!(7);
    let problems = problems_of(&p, None);
    assert_has(&problems, "spec.vertices[2].resourceClaims: is not a list");
    assert_has(&problems, "spec.vertices[1].udf.container.env: is not a list");
    assert_has(&problems, "spec.vertices[3].sink.udsink.container.resources: is not an object");
    assert_has(&problems, "spec.vertices[2].udf.container.resources.claims: is not a list");
    assert_eq!(problems.len(), 4, "{problems:#?}");

    let mut p = seed_pipeline();
    p["spec"]["vertices"][1]["metadata"] = json!("x");
    assert_eq!(problems_of(&p, None), vec!["spec.vertices[1].metadata: is not an object"]);
    let mut p = seed_pipeline();
    p["spec"]["vertices"] = json!({"a": 1});
    let problems = problems_of(&p, None);
    assert_has(&problems, "spec.vertices: missing or not a list; the bound edges' vertices must be in it");
}

#[test]
fn a_template_claim_is_kept_when_weft_gives_the_vertex_its_first_claim() {
    let mut p = seed_pipeline();
    p["spec"]["templates"] =
        json!({"vertex": {"resourceClaims": [{"name": "shm", "resourceClaimTemplateName": "shm-t"}]}});
    let (out, _) = wired(&p);
    assert_eq!(
        out["spec"]["vertices"][3]["resourceClaims"],
        json!([{"name": "shm", "resourceClaimTemplateName": "shm-t"}, {"name": RCT, "resourceClaimTemplateName": RCT}]),
        "out had none: Numaflow would have given it the template's, so weft keeps them"
    );
    assert_eq!(
        out["spec"]["vertices"][2]["resourceClaims"][0]["name"], "gpu",
        "inference has its own: Numaflow ignores the template's for it"
    );
    assert_eq!(out["spec"]["vertices"][2]["resourceClaims"].as_array().unwrap().len(), 2);
}

#[test]
fn moving_an_edge_to_another_network_moves_the_claims() {
    let (wired_p, _) = wired(&seed_pipeline());
    let mut moved = wired_p.clone();
    moved["spec"]["edges"][2]["numaNetwork"]["name"] = json!("other-net");
    let (out, _) = wired(&moved);
    let o = &out["spec"]["vertices"][3];
    assert_eq!(o["resourceClaims"], json!([{"name": "other-net-rct", "resourceClaimTemplateName": "other-net-rct"}]));
    assert_eq!(o["sink"]["udsink"]["container"]["resources"]["claims"], json!([{"name": "other-net-rct"}]));
    let inference = &out["spec"]["vertices"][2];
    assert_eq!(
        inference["resourceClaims"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect::<Vec<_>>(),
        ["gpu", RCT, "other-net-rct"],
        "inference stays on {NN} through filter-resize"
    );
    assert_eq!(domains_annotation(inference).len(), 2);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    /// A chain pipeline of `kinds.len()` vertices (0 udf, 1 built-in sink, 2 udsink, 3 udsource),
    /// its edges bound as `binds` says (None, or network index and direct?), some vertices holding
    /// a GPU claim and user env.
    fn chain(kinds: &[u8], binds: &[Option<(u8, bool)>], gpu: &[bool], env: &[bool]) -> Value {
        let vertices: Vec<Value> = kinds
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let mut c = json!({"image": format!("img{i}")});
                if gpu[i] {
                    c["resources"] = json!({"claims": [{"name": "gpu"}]});
                }
                if env[i] {
                    c["env"] = json!([{"name": "X", "value": "y"}]);
                }
                let mut v = match k {
                    0 => json!({"name": format!("v{i}"), "udf": {"container": c}}),
                    1 => json!({"name": format!("v{i}"), "sink": {"log": {}}}),
                    2 => json!({"name": format!("v{i}"), "sink": {"udsink": {"container": c}}}),
                    _ => json!({"name": format!("v{i}"), "source": {"udsource": {"container": c}}}),
                };
                if gpu[i] {
                    v["resourceClaims"] = json!([{"name": "gpu", "resourceClaimTemplateName": "gpu-t"}]);
                }
                v
            })
            .collect();
        let edges: Vec<Value> = (1..kinds.len())
            .map(|i| {
                let mut e = json!({"from": format!("v{}", i - 1), "to": format!("v{i}")});
                if let Some((n, direct)) = binds[i - 1] {
                    e["numaNetwork"] = json!({"name": format!("net{n}"),
                        "connectionType": if direct { "direct" } else { "multi-isbsvc" }});
                }
                e
            })
            .collect();
        json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"vertices": vertices, "edges": edges}})
    }

    fn any_chain() -> impl Strategy<Value = Value> {
        (2usize..9).prop_flat_map(|n| {
            (
                proptest::collection::vec(0u8..4, n),
                proptest::collection::vec(proptest::option::of((0u8..3, any::<bool>())), n - 1),
                proptest::collection::vec(any::<bool>(), n),
                proptest::collection::vec(any::<bool>(), n),
            )
                .prop_map(|(k, b, g, e)| chain(&k, &b, &g, &e))
        })
    }

    fn all_exist(_: &str) -> bool {
        true
    }

    proptest! {
        #[test]
        fn wiring_applies_is_idempotent_and_unwires_cleanly(p in any_chain()) {
            let opts = WiringOptions::default();
            let Ok(w) = wire(&p, None, &opts, &all_exist) else {
                // Only direct edges touching a vertex without a user container are refused.
                let problems = wire(&p, None, &opts, &all_exist).unwrap_err();
                prop_assert!(problems.problems().iter().all(|x| x.message.starts_with("direct edges run between user containers")), "{}", problems);
                return Ok(());
            };
            let mut out = p.clone();
            json_patch::patch(&mut out, &w.ops).expect("applies");

            // Idempotent.
            let again = wire(&out, None, &opts, &all_exist).unwrap();
            prop_assert!(again.ops.is_empty(), "{:?}", again.ops);

            // Every vertex on a bound edge has its claims in both places and its annotation;
            // every other vertex is as it was.
            let vertices = out["spec"]["vertices"].as_array().unwrap();
            for (i, v) in vertices.iter().enumerate() {
                match w.vertices.iter().find(|x| x.index == i) {
                    None => prop_assert_eq!(v, &p["spec"]["vertices"][i]),
                    Some(x) => {
                        let entries: Vec<VertexDomainEntry> = serde_json::from_str(
                            v["metadata"]["annotations"][VERTEX_DOMAINS_ANNOTATION].as_str().unwrap()).unwrap();
                        prop_assert_eq!(&entries, &x.domains);
                        for e in &entries {
                            let entry = json!({"name": e.claim, "resourceClaimTemplateName": e.claim});
                            prop_assert!(v["resourceClaims"].as_array().unwrap().contains(&entry));
                            if let Some((pointer, _)) = user_container(v) {
                                let c = v.pointer(pointer).unwrap();
                                let claim = json!({"name": e.claim});
                                prop_assert!(c["resources"]["claims"].as_array().unwrap().contains(&claim));
                                prop_assert!(env_of(c).contains(&(VERTEX_DOMAIN_ENV.to_owned(), x.domain_env())));
                            }
                        }
                        let sends_direct = p["spec"]["edges"].as_array().unwrap().iter().any(|e|
                            e["from"] == v["name"] && e["numaNetwork"]["connectionType"] == "direct");
                        prop_assert_eq!(sends_direct, !x.targets.is_empty());
                    }
                }
            }

            // Removing every binding gives back exactly what the user wrote.
            let mut unbound = out.clone();
            let mut expected = p.clone();
            for doc in [&mut unbound, &mut expected] {
                for e in doc["spec"]["edges"].as_array_mut().unwrap() {
                    e.as_object_mut().unwrap().remove("numaNetwork");
                }
            }
            let w = wire(&unbound, None, &opts, &all_exist).unwrap();
            json_patch::patch(&mut unbound, &w.ops).unwrap();
            prop_assert_eq!(unbound, expected);
        }

        #[test]
        fn arbitrary_json_never_panics(v in arbitrary_json()) {
            let _ = wire(&v, None, &WiringOptions::default(), &|_| true);
            let mut p = seed_pipeline();
            p["spec"]["vertices"][2] = v.clone();
            let _ = wire(&p, None, &WiringOptions::default(), &|_| true);
            p["spec"]["edges"][1]["numaNetwork"] = v.clone();
            let _ = wire(&p, None, &WiringOptions::default(), &|_| true);
            p["metadata"]["annotations"] = json!({NUMA_NETWORK_EDGES_ANNOTATION: v.to_string()});
            let _ = wire(&p, None, &WiringOptions::default(), &|_| true);
        }
    }

    fn arbitrary_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|n| json!(n)),
            "[a-z]{0,4}".prop_map(Value::String),
            prop_oneof![Just("direct"), Just("name"), Just(NN), Just("container"), Just("udf")].prop_map(|s| json!(s)),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(
                    prop_oneof![
                        Just("name".to_owned()),
                        Just("udf".to_owned()),
                        Just("container".to_owned()),
                        Just("resources".to_owned()),
                        Just("claims".to_owned()),
                        Just("env".to_owned()),
                        Just("metadata".to_owned()),
                        Just("annotations".to_owned()),
                        Just("resourceClaims".to_owned()),
                        Just("connectionType".to_owned()),
                        "[a-z]{1,3}"
                    ],
                    inner,
                    0..4
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
