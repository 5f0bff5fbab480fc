//! `weft webhook` over real HTTPS on loopback: AdmissionReview documents written as the API server
//! sends them are POSTed by a client that trusts only the test CA; patches are decoded from base64,
//! applied to the original object with a JSON-patch library and the result checked. Also: TLS
//! trust and certificate rotation, malformed bodies, metrics, and the pod path against the fake
//! API server with the real reflector-backed Job source (cache hit, GET fallback, not found), whose
//! every request must be granted by deploy/components/webhook/rbac.yaml.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use weft_testkit as common;

mod support;
use support::{HANG_GUARD, Webhook, assert_unchanged, client, patched, pki};

use std::sync::Arc;

use serde_json::{Value, json};
use weft_admission::webhook::{self, InMemoryJobs, KubeJobSource};
use weft_fakeapi::{FakeApiServer, RequestMatcher, ResourceSpec, Verb};
use weft_jobs::PLUGINS_ANNOTATION;

fn weft_plugins(job: &Value) -> Value {
    serde_json::from_str(job["metadata"]["annotations"][PLUGINS_ANNOTATION].as_str().expect("annotation")).unwrap()
}

// ----- AdmissionReview documents as the API server sends them -----

const USER: &str = r#"{"username": "alice@example.com", "uid": "f3e1", "groups": ["ml-team", "system:authenticated"]}"#;

/// `kubectl create -f tf-mnist.yaml`: a Volcano Job with weft's tensorflow plugin and nothing
/// defaulted yet (mutating webhooks run before the API server assigns uid and creation time).
fn job_create_review() -> Value {
    let text = r#"{
      "kind": "AdmissionReview",
      "apiVersion": "admission.k8s.io/v1",
      "request": {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "batch.volcano.sh", "version": "v1alpha1", "kind": "Job"},
        "resource": {"group": "batch.volcano.sh", "version": "v1alpha1", "resource": "jobs"},
        "requestKind": {"group": "batch.volcano.sh", "version": "v1alpha1", "kind": "Job"},
        "requestResource": {"group": "batch.volcano.sh", "version": "v1alpha1", "resource": "jobs"},
        "name": "tf-mnist",
        "namespace": "ml",
        "operation": "CREATE",
        "userInfo": USER,
        "object": {
          "apiVersion": "batch.volcano.sh/v1alpha1",
          "kind": "Job",
          "metadata": {
            "name": "tf-mnist",
            "namespace": "ml",
            "creationTimestamp": null,
            "annotations": {"weft.io/job-plugins": "{\"tensorflow\":[]}"},
            "managedFields": [{"manager": "kubectl-create", "operation": "Update",
              "apiVersion": "batch.volcano.sh/v1alpha1", "time": "2026-01-05T10:00:00Z",
              "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]
          },
          "spec": {
            "tasks": [
              {"name": "ps", "replicas": 1, "template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "tensorflow", "image": "tensorflow/tensorflow:2.16.1",
                  "command": ["python", "/opt/mnist.py"], "ports": [{"name": "tfjob-port", "containerPort": 2222}]}]}}},
              {"name": "worker", "replicas": 2, "template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "tensorflow", "image": "tensorflow/tensorflow:2.16.1",
                  "command": ["python", "/opt/mnist.py"], "ports": [{"name": "tfjob-port", "containerPort": 2222}],
                  "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}
            ]
          },
          "status": {}
        },
        "oldObject": null,
        "dryRun": false,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kubectl-create"}
      }
    }"#;
    serde_json::from_str(&text.replace("USER", USER)).unwrap()
}

/// The same Job as the validating webhook sees it on CREATE: defaulted, with uid and creation time.
fn job_validate_review(annotation: &str, volcano_plugins: Option<Value>) -> Value {
    let mut review = job_create_review();
    review["request"]["uid"] = json!("a1c2e3f4-0000-4000-8000-000000000001");
    let object = &mut review["request"]["object"];
    object["metadata"]["uid"] = json!("3b0d3c62-9f2e-4a51-9d55-0c6b1b8a0f10");
    object["metadata"]["creationTimestamp"] = json!("2026-01-05T10:00:00Z");
    object["metadata"]["annotations"][PLUGINS_ANNOTATION] = json!(annotation);
    object["spec"]["queue"] = json!("default");
    object["spec"]["schedulerName"] = json!("volcano");
    object["spec"]["maxRetry"] = json!(3);
    object["spec"]["minAvailable"] = json!(3);
    if let Some(p) = volcano_plugins {
        object["spec"]["plugins"] = p;
    }
    review
}

/// `kubectl scale`/`edit` of the Job: an UPDATE with the stored object as oldObject.
fn job_update_review(old_annotation: &str, new_annotation: &str, new_worker_replicas: i64) -> Value {
    let create = job_validate_review(old_annotation, None);
    let mut old = create["request"]["object"].clone();
    old["metadata"]["resourceVersion"] = json!("48213");
    old["metadata"]["generation"] = json!(1);
    old["status"] = json!({"state": {"phase": "Running"}, "version": 1, "running": 3});
    let mut new = old.clone();
    new["metadata"]["annotations"][PLUGINS_ANNOTATION] = json!(new_annotation);
    new["spec"]["tasks"][1]["replicas"] = json!(new_worker_replicas);
    json!({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": "b7d1a9e0-1111-4000-8000-000000000002",
            "kind": {"group": "batch.volcano.sh", "version": "v1alpha1", "kind": "Job"},
            "resource": {"group": "batch.volcano.sh", "version": "v1alpha1", "resource": "jobs"},
            "requestKind": {"group": "batch.volcano.sh", "version": "v1alpha1", "kind": "Job"},
            "requestResource": {"group": "batch.volcano.sh", "version": "v1alpha1", "resource": "jobs"},
            "name": "tf-mnist",
            "namespace": "ml",
            "operation": "UPDATE",
            "userInfo": serde_json::from_str::<Value>(USER).unwrap(),
            "object": new,
            "oldObject": old,
            "dryRun": false,
            "options": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kubectl-edit"}
        }
    })
}

/// Volcano's job controller creating pod `<job>-worker-1`: a fixed name (no generateName), the
/// controller owner reference to the Job, Volcano's labels and annotations, and no
/// `metadata.namespace` in the object (the request's namespace is authoritative).
fn pod_create_review(job: &str, job_uid: &str) -> Value {
    let pod_name = format!("{job}-worker-1");
    json!({
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": format!("c0ffee00-2222-4000-8000-{:0>12}", job.len()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod_name,
            "namespace": "ml",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:volcano-system:volcano-controllers",
                "uid": "9a8b", "groups": ["system:serviceaccounts", "system:serviceaccounts:volcano-system", "system:authenticated"]},
            "object": {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {
                    "name": pod_name,
                    "creationTimestamp": null,
                    "labels": {"volcano.sh/job-name": job, "volcano.sh/job-namespace": "ml",
                        "volcano.sh/queue-name": "default", "volcano.sh/task-spec": "worker", "volcano.sh/task-index": "1",
                        "volcano.sh/job-forwarding": "true"},
                    "annotations": {"scheduling.k8s.io/group-name": format!("{job}-{job_uid}"), "volcano.sh/job-name": job,
                        "volcano.sh/job-version": "0", "volcano.sh/queue-name": "default", "volcano.sh/task-spec": "worker",
                        "volcano.sh/task-index": "1", "volcano.sh/template-uid": format!("{job}-worker"),
                        "volcano.sh/job-retry-count": "0"},
                    "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": job,
                        "uid": job_uid, "controller": true, "blockOwnerDeletion": true}]
                },
                "spec": {
                    "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}],
                    "containers": [{"name": "tensorflow", "image": "tensorflow/tensorflow:2.16.1",
                        "command": ["python", "/opt/mnist.py"], "resources": {},
                        "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": true,
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                        "imagePullPolicy": "IfNotPresent"}],
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 30,
                    "dnsPolicy": "ClusterFirst",
                    "serviceAccountName": "default",
                    "schedulerName": "volcano",
                    "priority": 0,
                    "enableServiceLinks": true
                },
                "status": {}
            },
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    })
}

/// A Volcano Job as the API server stores it, with weft's plugins `annotation`.
fn stored_job(name: &str, uid: &str, annotation: &str) -> Value {
    json!({
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": name, "namespace": "ml", "uid": uid, "annotations": {PLUGINS_ANNOTATION: annotation}},
        "spec": {"queue": "default", "schedulerName": "volcano", "minAvailable": 3, "maxRetry": 3,
            "tasks": [
                {"name": "ps", "replicas": 1, "minAvailable": 1, "maxRetry": 3,
                 "template": {"spec": {"containers": [{"name": "tensorflow", "image": "tensorflow/tensorflow:2.16.1"}]}}},
                {"name": "worker", "replicas": 2, "minAvailable": 2, "maxRetry": 3,
                 "template": {"spec": {"containers": [{"name": "tensorflow", "image": "tensorflow/tensorflow:2.16.1"}]}}}
            ]},
        "status": {"state": {"phase": "Pending"}, "version": 0}
    })
}

// ----- tests -----

#[tokio::test]
async fn job_create_gets_volcano_defaults_and_weft_plugin_dependencies() {
    let server = Webhook::start(Arc::new(InMemoryJobs::new())).await;
    let review = job_create_review();
    let answer = server.review("/jobs/mutate", &review).await;
    let job = patched(&review["request"]["object"], &answer);

    assert_eq!(weft_plugins(&job), json!({"tensorflow": [], "svc": []}), "tensorflow needs svc: {job}");
    assert_eq!(job["spec"]["queue"], "default");
    assert_eq!(job["spec"]["schedulerName"], "volcano");
    assert_eq!(job["spec"]["maxRetry"], 3);
    assert_eq!(job["spec"]["minAvailable"], 3, "1 ps + 2 workers");
    assert_eq!(job["spec"]["tasks"][1]["minAvailable"], 2);
    assert_eq!(job["spec"]["tasks"][1]["maxRetry"], 3);
    assert!(job["spec"].get("plugins").is_none(), "no spec.plugins: Volcano's own plugins untouched");
    assert_eq!(
        job["spec"]["tasks"][1]["template"]["spec"]["containers"][0]["resources"],
        json!({"limits": {"nvidia.com/gpu": "1"}}),
        "the rest of the object is left as it came"
    );

    // The defaulted Job then passes validation, with no warnings.
    let mut validate = job_validate_review("{}", None);
    validate["request"]["object"] = job.clone();
    let answer = server.review("/jobs/validate", &validate).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert!(answer["response"].get("warnings").is_none(), "{answer}");

    // Only CREATE is mutated: an UPDATE comes back allowed, without patch or patchType.
    let update = job_update_review(r#"{"env":[]}"#, r#"{"env":[]}"#, 2);
    assert_unchanged(&server.review("/jobs/mutate", &update).await);
    server.stop().await;
}

#[tokio::test]
async fn job_validation_denies_with_the_verdict_and_returns_warnings() {
    let server = Webhook::start(Arc::new(InMemoryJobs::new())).await;

    let answer = server.review("/jobs/validate", &job_validate_review(r#"{"horovod":[]}"#, None)).await;
    let response = &answer["response"];
    assert_eq!(response["allowed"], false, "{answer}");
    assert_eq!(response["status"]["code"], 422);
    assert_eq!(response["status"]["reason"], "Invalid");
    assert!(response["status"]["message"].as_str().unwrap().contains("unknown plugin \"horovod\""), "{answer}");
    assert!(response.get("patch").is_none() && response.get("patchType").is_none());

    // spec.plugins problems Volcano only logs come back as warnings on an allowed Job.
    let answer = server
        .review("/jobs/validate", &job_validate_review(r#"{"env":[]}"#, Some(json!({"tensorflow": ["--port=abc"]}))))
        .await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let warnings = answer["response"]["warnings"].as_array().expect("warnings");
    assert!(warnings.iter().any(|w| w.as_str().unwrap().contains("goes on with -port=0")), "{answer}");

    // UPDATE: scaling is fine, changing weft's plugins is not.
    let answer = server.review("/jobs/validate", &job_update_review(r#"{"env":[]}"#, r#"{"env":[]}"#, 4)).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let answer =
        server.review("/jobs/validate", &job_update_review(r#"{"env":[]}"#, r#"{"env":[],"svc":[]}"#, 2)).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert!(
        answer["response"]["status"]["message"].as_str().unwrap().contains("cannot change after the job is created")
    );
    server.stop().await;
}

#[tokio::test]
async fn malformed_bodies_are_rejected_with_400_and_a_reason() {
    let server = Webhook::start(Arc::new(InMemoryJobs::new())).await;
    let (status, text) = server.post("/jobs/mutate", "{not json").await;
    assert_eq!(status, 400);
    assert!(text.contains("not an AdmissionReview"), "{text}");

    let (status, text) =
        server.post("/jobs/validate", r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#).await;
    assert_eq!(status, 400);
    assert!(text.contains("no request"), "{text}");

    let (status, text) = server
        .post(
            "/pods/mutate",
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"CREATE"}}"#,
        )
        .await;
    assert_eq!(status, 400);
    assert!(text.contains("uid"), "{text}");

    let (status, _) = server.post("/nowhere", "{}").await;
    assert_eq!(status, 404);

    let metrics = server.ops.encode_metrics();
    assert!(metrics.contains(r#"weft_webhook_requests_total{path="/jobs/mutate",outcome="malformed"} 1"#), "{metrics}");
    server.stop().await;
}

#[tokio::test]
async fn v1beta1_reviews_are_answered_in_kind() {
    let server = Webhook::start(Arc::new(InMemoryJobs::new())).await;
    let mut review = pod_create_review("no-such-owner", "u");
    review["apiVersion"] = json!("admission.k8s.io/v1beta1");
    review["request"]["object"]["metadata"]["ownerReferences"] = json!([]);
    let answer = server.review("/pods/mutate", &review).await;
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1beta1");
    assert_unchanged(&answer);
    server.stop().await;
}

#[tokio::test]
async fn only_clients_trusting_the_ca_get_through_and_a_rotated_certificate_is_served_after_reload() {
    let server = Webhook::start(Arc::new(InMemoryJobs::new())).await;
    let url = format!("{}/jobs/mutate", server.base);
    let body = serde_json::to_vec(&job_create_review()).unwrap();
    let call = |ca: &str| client(ca).post(&url).body(body.clone()).send();

    assert_eq!(call(&server.pki.ca_pem).await.expect("trusted").status(), 200);
    let other = pki("some other CA");
    let err = call(&other.ca_pem).await.expect_err("a client without the CA fails the handshake");
    assert!(err.is_connect(), "{err:?}");

    assert!(!server.tls.reload().expect("unchanged files reload"), "nothing changed");

    // Rotation: a new CA and certificate written over the files (as a Secret update does).
    let rotated = pki("weft test CA 2");
    std::fs::write(server.dir.path().join("tls.crt"), &rotated.cert_pem).unwrap();
    std::fs::write(server.dir.path().join("tls.key"), &rotated.key_pem).unwrap();
    assert!(server.tls.reload().expect("the new pair loads"));
    assert_eq!(call(&rotated.ca_pem).await.expect("the new certificate is served").status(), 200);
    call(&server.pki.ca_pem).await.expect_err("the old CA no longer verifies the server");

    // A key that does not match: the reload fails and the last good certificate keeps serving.
    std::fs::write(server.dir.path().join("tls.key"), &other.key_pem).unwrap();
    let e = server.tls.reload().expect_err("mismatched pair");
    assert!(e.to_string().contains("tls.crt"), "{e}");
    assert_eq!(call(&rotated.ca_pem).await.expect("still served").status(), 200);

    let metrics = server.ops.encode_metrics();
    assert!(metrics.contains(r#"weft_webhook_tls_reloads_total{result="loaded"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"weft_webhook_tls_reloads_total{result="failed"} 1"#), "{metrics}");
    server.stop().await;
}

#[tokio::test]
async fn pods_are_wired_from_their_job_through_the_api_server_and_rbac_grants_every_read() {
    let api = FakeApiServer::start().await;
    api.register(ResourceSpec::namespaced("batch.volcano.sh", "v1alpha1", "jobs", "Job").with_status());
    api.insert(stored_job("tf-mnist", "uid-tf", r#"{"env":[],"svc":[]}"#)).unwrap();
    api.insert(stored_job("plain", "uid-plain", "{}")).unwrap();
    api.clear_requests();

    let jobs = Arc::new(KubeJobSource::spawn(api.client()));
    let server = Webhook::start(jobs.clone()).await;
    tokio::time::timeout(HANG_GUARD, jobs.wait_until_synced()).await.expect("job cache synced");
    assert!(server.ops.is_ready(), "{:?}", server.ops.readiness());
    assert_eq!(jobs.len(), 2);

    // From the cache.
    let review = pod_create_review("tf-mnist", "uid-tf");
    let pod = patched(&review["request"]["object"], &server.review("/pods/mutate", &review).await);
    let spec = &pod["spec"];
    assert_eq!(spec["hostname"], "tf-mnist-worker-1", "svc: {pod}");
    assert_eq!(spec["subdomain"], "tf-mnist");
    assert!(spec["volumes"].as_array().unwrap().iter().any(|v| v["configMap"]["name"] == "tf-mnist-svc"), "{pod}");
    let env = spec["containers"][0]["env"].as_array().expect("env added");
    assert!(env.contains(&json!({"name": "VC_TASK_INDEX", "value": "1"})), "env: {pod}");
    assert_eq!(spec["containers"][0]["volumeMounts"][0]["name"], "kube-api-access-x7k2p", "existing mounts kept");
    assert!(pod["metadata"].get("namespace").is_none(), "the patch does not add the namespace");
    let gets =
        |name: &str| api.requests().iter().filter(|r| r.verb == Verb::Get && r.name.as_deref() == Some(name)).count();
    assert_eq!(gets("tf-mnist"), 0, "served from the watch cache");

    // A Job without weft plugins: its pods pass unchanged.
    assert_unchanged(&server.review("/pods/mutate", &pod_create_review("plain", "uid-plain")).await);

    // The watch stalls (the pod can arrive before the Job's watch event): the Job is read with GET.
    // The open watch is cut and every new list or watch fails, so the cache stays as it is.
    tokio::time::timeout(HANG_GUARD, api.wait_for(|s| s.open_watches() == 1)).await.expect("job watch open");
    for verb in [Verb::Watch, Verb::List] {
        api.fail_next(RequestMatcher::new(verb, "jobs").group("batch.volcano.sh"), 500, 1_000_000);
    }
    api.drop_watches();
    tokio::time::timeout(HANG_GUARD, api.wait_for(|s| s.open_watches() == 0)).await.expect("job watch cut");
    api.insert(stored_job("late", "uid-late", r#"{"env":[]}"#)).unwrap();
    let review = pod_create_review("late", "uid-late");
    let pod = patched(&review["request"]["object"], &server.review("/pods/mutate", &review).await);
    assert!(
        pod["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "VC_TASK_INDEX", "value": "1"}))
    );
    assert_eq!(gets("late"), 1, "one GET fallback");

    // A Job recreated under the same name: the cache's uid is stale, so it is read again.
    api.remove("jobs", Some("ml"), "tf-mnist");
    api.insert(stored_job("tf-mnist", "uid-tf-2", r#"{"env":[]}"#)).unwrap();
    let review = pod_create_review("tf-mnist", "uid-tf-2");
    patched(&review["request"]["object"], &server.review("/pods/mutate", &review).await);
    assert_eq!(gets("tf-mnist"), 1);

    // No such Job: denied, naming it (Volcano's controller retries the pod).
    let answer = server.review("/pods/mutate", &pod_create_review("ghost", "uid-ghost")).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert_eq!(answer["response"]["status"]["code"], 404);
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("Volcano Job ml/ghost"), "{message}");

    let metrics = server.ops.encode_metrics();
    for line in [
        r#"weft_webhook_requests_total{path="/pods/mutate",outcome="patched"} 3"#,
        r#"weft_webhook_requests_total{path="/pods/mutate",outcome="allowed"} 1"#,
        r#"weft_webhook_requests_total{path="/pods/mutate",outcome="denied"} 1"#,
        r#"weft_webhook_job_lookups_total{source="cache",result="found"} 2"#,
        r#"weft_webhook_job_lookups_total{source="api",result="found"} 2"#,
        r#"weft_webhook_job_lookups_total{source="api",result="not_found"} 1"#,
        r#"weft_webhook_request_duration_seconds_count{path="/pods/mutate"} 5"#,
    ] {
        assert!(metrics.contains(line), "missing {line}:\n{metrics}");
    }

    common::rbac::assert_granted(&api.requests(), &["components/webhook/rbac.yaml"]);
    server.stop().await;
}

#[tokio::test]
async fn not_ready_until_the_job_cache_syncs() {
    let jobs = Arc::new(InMemoryJobs::new());
    jobs.set_synced(false);
    let server = Webhook::start(jobs.clone()).await;
    assert!(!server.ops.is_ready());
    jobs.set_synced(true);
    assert!(server.ops.is_ready());
    server.stop().await;
}

#[tokio::test]
async fn a_pod_with_more_containers_than_weft_wires_is_denied_before_any_work() {
    let jobs = Arc::new(InMemoryJobs::new());
    jobs.insert(serde_json::from_value(stored_job("tf-mnist", "uid-tf", r#"{"env":[],"svc":[]}"#)).unwrap());
    let server = Webhook::start(jobs).await;
    let mut review = pod_create_review("tf-mnist", "uid-tf");
    let one = review["request"]["object"]["spec"]["containers"][0].clone();
    let many: Vec<Value> = (0..10_000)
        .map(|i| {
            let mut c = one.clone();
            c["name"] = json!(format!("c{i}"));
            c
        })
        .collect();
    review["request"]["object"]["spec"]["containers"] = json!(many);
    let body = serde_json::to_vec(&review).unwrap();
    assert!(body.len() < webhook::MAX_BODY_BYTES, "the request itself is within the body limit");
    let (status, text) = server.post("/pods/mutate", body).await;
    assert_eq!(status, 200, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("10000 containers") && message.contains("at most 128"), "{message}");
    assert!(text.len() < 4096, "a denial is small: {} bytes", text.len());
    // At the limit, the same pod is wired.
    review["request"]["object"]["spec"]["containers"] =
        json!(many.into_iter().take(webhook::MAX_PATCHED_CONTAINERS).collect::<Vec<_>>());
    let answer = server.review("/pods/mutate", &review).await;
    let pod = patched(&review["request"]["object"], &answer);
    assert_eq!(pod["spec"]["containers"].as_array().unwrap().len(), webhook::MAX_PATCHED_CONTAINERS);
    server.stop().await;
}

#[tokio::test]
async fn a_body_larger_than_any_review_the_api_server_sends_is_refused() {
    let server = Webhook::start(Arc::new(InMemoryJobs::new())).await;
    let mut review = job_validate_review("{}", None);
    review["request"]["object"]["metadata"]["annotations"]["padding"] = json!("x".repeat(webhook::MAX_BODY_BYTES));
    let (status, _) = server.post("/jobs/validate", serde_json::to_vec(&review).unwrap()).await;
    assert_eq!(status, 413);
    server.stop().await;
}

#[tokio::test]
async fn jobs_volcano_denies_are_denied_here_too_with_its_reason() {
    let server = Webhook::start(Arc::new(InMemoryJobs::new())).await;
    let review = job_validate_review(r#"{"tensorflow":[],"svc":[]}"#, Some(json!({"gang": []})));
    let answer = server.review("/jobs/validate", &review).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("unable to find job plugin: gang;"), "{message}");

    // A billion replicas: denied at once, nothing built.
    let mut review = job_validate_review(r#"{"tensorflow":[],"svc":[]}"#, None);
    review["request"]["object"]["spec"]["tasks"][1]["replicas"] = json!(1_000_000_000);
    let answer = server.review("/jobs/validate", &review).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("1000000001 pods") && message.contains("at most 10000"), "{message}");
    server.stop().await;
}

#[tokio::test]
async fn pods_of_a_job_over_the_replica_cap_are_denied_without_building_anything() {
    // The Job got in before weft's webhook: its pods must not make the webhook allocate host
    // lists of a billion names.
    let jobs = Arc::new(InMemoryJobs::new());
    let mut stored = stored_job("huge", "uid-huge", r#"{"tensorflow":[],"svc":[]}"#);
    stored["spec"]["tasks"][1]["replicas"] = json!(1_000_000_000);
    jobs.insert(serde_json::from_value(stored).unwrap());
    let server = Webhook::start(jobs).await;
    let answer = server.review("/pods/mutate", &pod_create_review("huge", "uid-huge")).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("weft wires at most 10000"), "{message}");
    server.stop().await;
}

#[tokio::test]
async fn a_malformed_job_is_denied_naming_the_field() {
    let server = Webhook::start(Arc::new(InMemoryJobs::new())).await;
    let mut review = job_validate_review(r#"{"env":[]}"#, None);
    review["request"]["object"]["spec"]["tasks"][1]["replicas"] = json!("2");
    let answer = server.review("/jobs/validate", &review).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("spec.tasks[1].replicas: invalid type: string \"2\""), "{message}");

    let review = job_validate_review(r#"{"env":[]}"#, Some(json!(["svc"])));
    let answer = server.review("/jobs/validate", &review).await;
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("spec.plugins: invalid type: sequence"), "{message}");
    server.stop().await;
}
