//! Request bodies at real sizes, shared by the tests and the request-size bench: vc-scheduler's
//! BatchNodeOrderFn body (`PrioritizeRequest`: the task and every candidate `NodeInfo` with all
//! its task pods, as encoding/json writes Volcano's `api` structs) and kube-scheduler's `Nodes`
//! lists.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};

/// A running pod as the API server returns it (service-account volume, statuses, conditions):
/// about 3.3 KB of JSON, the size of a real Volcano job pod.
pub fn running_pod(name: &str, uid: &str, node: &str) -> Value {
    let t = "2026-01-05T09:00:00Z";
    let conditions: Vec<Value> =
        ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"]
            .iter()
            .map(|c| json!({"type": c, "status": "True", "lastProbeTime": null, "lastTransitionTime": t}))
            .collect();
    json!({
        "metadata": {
            "name": name, "namespace": "ml", "uid": uid, "resourceVersion": "1234567", "creationTimestamp": t,
            "labels": {"volcano.sh/job-name": "train", "volcano.sh/task-spec": "worker", "volcano.sh/job-namespace": "ml"},
            "annotations": {"scheduling.k8s.io/group-name": "train-0b3c", "volcano.sh/job-name": "train",
                "volcano.sh/task-spec": "worker", "volcano.sh/job-version": "0", "volcano.sh/queue-name": "default",
                "weft.io/gpu-ids": "0,1,2,3"},
            "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "train",
                "uid": "1c1d0f6e-0000-4000-8000-000000000001", "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {
            "volumes": [{"name": "kube-api-access-abcde", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ], "defaultMode": 420}}],
            "containers": [{
                "name": "trainer", "image": "registry.example.com/ml/trainer:2026.01",
                "command": ["python", "-m", "train"], "args": ["--epochs", "10", "--batch", "256"],
                "env": [{"name": "VC_WORKER_HOSTS", "value": "train-worker-0.train,train-worker-1.train,train-worker-2.train,train-worker-3.train"},
                        {"name": "VC_TASK_INDEX", "value": "12"}],
                "resources": {"limits": {"nvidia.com/gpu": "4", "cpu": "8", "memory": "64Gi"},
                              "requests": {"nvidia.com/gpu": "4", "cpu": "8", "memory": "64Gi"}},
                "volumeMounts": [{"name": "kube-api-access-abcde", "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"
            }],
            "restartPolicy": "OnFailure", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "serviceAccount": "default", "nodeName": node, "hostname": name,
            "subdomain": "train", "securityContext": {}, "schedulerName": "volcano", "priority": 0,
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            ],
            "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority"
        },
        "status": {
            "phase": "Running", "qosClass": "Guaranteed", "hostIP": "10.0.1.17", "hostIPs": [{"ip": "10.0.1.17"}],
            "podIP": "10.244.3.12", "podIPs": [{"ip": "10.244.3.12"}], "startTime": t,
            "conditions": conditions,
            "containerStatuses": [{"name": "trainer", "state": {"running": {"startedAt": t}}, "lastState": {}, "ready": true,
                "restartCount": 0, "image": "registry.example.com/ml/trainer:2026.01",
                "imageID": "registry.example.com/ml/trainer@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                "containerID": "containerd://0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "started": true}]
        }
    })
}

/// `api.Resource` as encoding/json writes it.
fn resource(milli_cpu: f64, memory: f64, gpus: Option<f64>) -> Value {
    json!({"MilliCPU": milli_cpu, "Memory": memory,
           "ScalarResources": gpus.map(|g| json!({"nvidia.com/gpu": g, "pods": 110000.0})), "MaxTaskNum": 0})
}

/// `api.TaskInfo` of `pod` as encoding/json writes it (every exported field, Go names).
pub fn task_info(pod: &Value, node: &str, status: u32) -> Value {
    json!({
        "UID": pod["metadata"]["uid"], "Job": "ml/train-0b3c", "Name": pod["metadata"]["name"], "Namespace": "ml",
        "TaskRole": "worker",
        "Resreq": resource(8000.0, 68719476736.0, Some(4000.0)),
        "InitResreq": resource(8000.0, 68719476736.0, Some(4000.0)),
        "DRAResreq": null, "ResourceClaimKeys": null, "ResourceClaimDRAResreq": null,
        "NodeName": node, "EvictionOccurred": false, "JobAllocatedHyperNode": "", "Status": status,
        "LastTransaction": null, "Priority": 0, "VolumeReady": false, "Preemptable": false, "BestEffort": false,
        "HasRestartableInitContainer": false, "SchGated": false, "RevocableZone": "", "NumaInfo": null,
        "Pod": pod, "PodAnnotations": pod["metadata"]["annotations"], "CustomBindErrHandlerSucceeded": false
    })
}

/// `api.NodeInfo` text of node `name` running `pods` tasks (Running, status 1 << 5).
pub fn node_info_text(name: &str, pods: usize) -> String {
    let node = json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                      "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "128", "memory": "1Ti", "pods": "110"}}});
    let mut tasks = String::from("{");
    for j in 0..pods {
        let uid = format!("{name}-uid-{j:04}");
        let pod = running_pod(&format!("train-worker-{j}"), &uid, name);
        if j > 0 {
            tasks.push(',');
        }
        tasks.push_str(&serde_json::to_string(&uid).unwrap());
        tasks.push(':');
        tasks.push_str(&task_info(&pod, name, 1 << 5).to_string());
    }
    tasks.push('}');
    let mut v = json!({
        "Name": name, "Node": node, "State": {"Phase": 1, "Reason": ""},
        "Releasing": resource(0.0, 0.0, None), "Pipelined": resource(0.0, 0.0, None),
        "Idle": resource(128000.0, 1.09e12, Some(8000.0)), "Used": resource(0.0, 0.0, None),
        "Allocatable": resource(128000.0, 1.09e12, Some(8000.0)), "Capacity": resource(128000.0, 1.09e12, Some(8000.0)),
        "ResourceUsage": {"CPUUsageAvg": {}, "MEMUsageAvg": {}},
        "Tasks": "TASKS", "NumaInfo": null, "NumaChgFlag": 0, "NumaSchedulerInfo": null, "RevocableZone": "",
        "Others": {"GpuShare": {"Name": name, "Score": 0, "Device": {}}}, "OversubscriptionNode": false,
        "OfflineJobEvicting": false, "OversubscriptionResource": resource(0.0, 0.0, None), "ImageStates": {}
    })
    .to_string();
    v = v.replacen("\"TASKS\"", &tasks, 1);
    v
}

/// A `PrioritizeRequest` body for `task` over `names`, each node running `pods` tasks. Every
/// node's text is one template with the node's name put in (pod UIDs and node names included), so
/// building a 500 MiB body takes seconds, not minutes.
pub fn prioritize_body(task: &Value, names: &[String], pods: usize) -> Vec<u8> {
    let template = node_info_text("NODE-NAME-TEMPLATE", pods);
    let mut body = Vec::with_capacity(names.len() * (template.len() + 16) + 64 * 1024);
    body.extend_from_slice(b"{\"task\":");
    body.extend_from_slice(task.to_string().as_bytes());
    body.extend_from_slice(b",\"nodes\":[");
    for (i, name) in names.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(template.replace("NODE-NAME-TEMPLATE", name).as_bytes());
    }
    body.extend_from_slice(b"]}");
    body
}

/// `n` bare Nodes (`{"metadata":{"name":"n0000001"}}`), the smallest objects a `Nodes` list can
/// hold, as an `ExtenderArgs` body.
pub fn bare_nodes_body(pod: &Value, n: usize) -> Vec<u8> {
    let mut body = format!("{{\"Pod\":{pod},\"Nodes\":{{\"items\":[").into_bytes();
    for i in 0..n {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(format!("{{\"metadata\":{{\"name\":\"n{i:07}\"}}}}").as_bytes());
    }
    body.extend_from_slice(b"]},\"NodeNames\":null}");
    body
}
