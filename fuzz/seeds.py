#!/usr/bin/env python3
"""Writes the seed corpora of the JSON, protobuf and text targets into fuzz/corpus/<target>/ from
the repository's examples (deploy/examples), the shapes the tests use and the wire formats'
documented examples. The topology seeds are copied from /work/shared/fixtures/topology and
crates/weft-sim/topologies (inventories converted with `weft topo show FILE -o json|yaml`).
Run from the repository root: python3 fuzz/seeds.py. Each seed is a small file; the fuzzer grows
its own corpus from them (scripts/fuzz.sh keeps that in fuzz/corpus-work, not in git)."""
import json, os, struct, yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
C = os.path.join(ROOT, "fuzz", "corpus")


def put(target, name, data):
    d = os.path.join(C, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def js(v):
    return json.dumps(v, separators=(",", ":"))


def load(path):
    with open(os.path.join(ROOT, path)) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def review(obj, group, version, kind, resource, op="CREATE", old=None, uid="u-1"):
    req = {
        "uid": uid,
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": resource},
        "name": obj.get("metadata", {}).get("name", ""),
        "namespace": obj.get("metadata", {}).get("namespace", "default"),
        "operation": op,
        "userInfo": {"username": "alice"},
        "object": obj,
        "oldObject": old,
        "dryRun": False,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


# ---- Volcano Jobs (first byte: 0 mutate, 1 validate) ----
jobs = {}
for f in sorted(os.listdir(os.path.join(ROOT, "deploy/examples/jobs"))):
    for d in load(f"deploy/examples/jobs/{f}"):
        if d.get("kind") == "Job":
            name = d["metadata"]["name"]
            jobs[name] = d
            body = js(review(d, "batch.volcano.sh", "v1alpha1", "Job", "jobs"))
            put("admission_jobs", f"mutate-{name}.json", b"\x00" + body.encode())
            put("admission_jobs", f"validate-{name}.json", b"\x01" + body.encode())
            upd = js(review(d, "batch.volcano.sh", "v1alpha1", "Job", "jobs", op="UPDATE", old=d))
            put("admission_jobs", f"validate-update-{name}.json", b"\x01" + upd.encode())

# ---- Pods of those Jobs, as Volcano's job controller creates them ----
for name, job in jobs.items():
    for task in job["spec"]["tasks"]:
        tname = task["name"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-{tname}-0",
                "namespace": job["metadata"].get("namespace", "default"),
                "annotations": {"volcano.sh/task-spec": tname, "volcano.sh/job-name": name,
                                "volcano.sh/task-index": "0"},
                "labels": {"volcano.sh/job-name": name, "volcano.sh/task-spec": tname},
                "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": name,
                                     "uid": f"uid-{name}", "controller": True}],
            },
            "spec": task["template"]["spec"],
        }
        put("admission_pods", f"{name}-{tname}.json", js(review(pod, "", "v1", "Pod", "pods")))
        break

# ---- Pipelines (first byte: 0 mutate, 1 validate) ----
with open(os.path.join(ROOT, "deploy/examples/numaflow/pipeline-review.json"), "rb") as f:
    body = f.read()
put("admission_pipelines", "mutate-pipeline-review.json", b"\x00" + body)
put("admission_pipelines", "validate-pipeline-review.json", b"\x01" + body)
for f in ["video-pipeline.yaml", "video-pipeline-field.yaml"]:
    for d in load(f"deploy/examples/numaflow/{f}"):
        if d.get("kind") == "Pipeline":
            b = js(review(d, "numaflow.numaproj.io", "v1alpha1", "Pipeline", "pipelines")).encode()
            put("admission_pipelines", f"mutate-{f}.json", b"\x00" + b)
            put("admission_pipelines", f"validate-{f}.json", b"\x01" + b)

# ---- NumaNetworks ----
for d in load("deploy/examples/numanetwork.yaml"):
    if d.get("kind") == "NumaNetwork":
        put("admission_numanetworks", "create.json",
            js(review(d, "numaflow.numaproj.io", "v1alpha1", "NumaNetwork", "numanetworks")))
        new = json.loads(json.dumps(d))
        new["spec"]["refResourceClaimDranet"]["ipRange"] = "192.168.11.0/24"
        put("admission_numanetworks", "update.json",
            js(review(new, "numaflow.numaproj.io", "v1alpha1", "NumaNetwork", "numanetworks", op="UPDATE", old=d)))
        put("admission_numanetworks", "delete.json",
            js(review({}, "numaflow.numaproj.io", "v1alpha1", "NumaNetwork", "numanetworks", op="DELETE", old=d)))
put("admission_numanetworks", "not-a-review.json", js({"apiVersion": "v1", "kind": "Status"}))

# ---- kube-scheduler ExtenderArgs (first byte: read size and node limit) ----
gpu_pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u-p"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}
topo = json.load(open(os.path.join(C, "inventory", "a100-pcie-4gpu-mlx5.json")))
node = {"metadata": {"name": "n1", "resourceVersion": "7",
                     "annotations": {"weft.io/gpu-topology": js(topo)}},
        "status": {"allocatable": {"nvidia.com/gpu": "4"}}}
put("extender_args", "nodenames.json", b"\x07" + js({"Pod": gpu_pod, "NodeNames": ["n1", "n2", "n3"]}).encode())
put("extender_args", "nodes.json", b"\x3f" + js({"Pod": gpu_pod, "Nodes": {"metadata": {}, "items": [node]}}).encode())
put("extender_args", "nulls.json", b"\xc0" + js({"pod": None, "nodes": None, "nodenames": None, "x": [1, {"y": "\\u00e9"}]}).encode())

# ---- vc-scheduler (first byte: low 2 bits the verb, the rest the read size) ----
task = {"UID": "u-p", "Name": "p", "Namespace": "default", "NodeName": "n1", "Status": 4, "Pod": gpu_pod}
put("vc_scheduler_args", "predicate.json", bytes([0 | (5 << 2)]) + js({"task": task, "node": {"Name": "n1"}}).encode())
put("vc_scheduler_args", "prioritize.json", bytes([1 | (9 << 2)]) + js(
    {"task": task, "nodes": [{"Name": "n1", "Tasks": {"a": task}}, {"Name": "n2"}]}).encode())
put("vc_scheduler_args", "allocate.json", bytes([2]) + js({"task": task}).encode())

# ---- CNI stdin (first byte: command, bit 3 MAC in CNI_ARGS) ----
conf = {"cniVersion": "1.1.0", "name": "physnet2", "type": "weft-cni", "physnet": "physnet2",
        "deviceID": "0000:3b:00.2", "vlan": 100, "vlanQoS": 0, "vlanProto": "802.1q",
        "mac": "02:00:00:aa:bb:cc", "mtu": 9000,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.56.0.0/24", "gateway": "10.56.0.1"}]]},
        "runtimeConfig": {"deviceID": "0000:3b:00.3", "mac": "02:00:00:00:00:03"},
        "interfaceNames": {"0000:3b:00.2": "fast0"}, "lockTimeoutMs": 10000}
put("cni_config", "add.json", b"\x00" + js(conf).encode())
put("cni_config", "del-mac.json", b"\x09" + js(conf).encode())
chained = dict(conf)
chained["prevResult"] = {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/x"}],
                         "ips": [{"address": "10.56.0.11/24", "gateway": "10.56.0.1", "interface": 0}],
                         "routes": [{"dst": "0.0.0.0/0"}]}
put("cni_config", "check-prev.json", b"\x02" + js(chained).encode())
put("cni_config", "version.json", b"\x04" + js({"cniVersion": "0.4.0", "name": "n", "type": "weft-cni"}).encode())

# ---- CNI_ARGS ----
put("cni_args", "k8s.txt", "IgnoreUnknown=1;K8S_POD_NAMESPACE=ml;K8S_POD_NAME=trainer;K8S_POD_UID=uid-trainer")
put("cni_args", "mac.txt", "K8S_POD_NAMESPACE=ml;K8S_POD_NAME=p;MAC=02:00:00:00:00:01;K8S_POD_INFRA_CONTAINER_ID=abc")
put("cni_args", "bad.txt", "IgnoreUnknown=true;FOO;=x")

# ---- Volcano plugin flags (first byte: plugin, bit 7 strict) ----
flags = [
    (0x02, ["--master=launcher", "--worker=worker", "--port=5000"]),
    (0x82, ["-master", "launcher", "-slots=8", "-wait=true", "-wait-timeout=5m"]),
    (0x04, ["--master=master", "--worker=worker", "--port=23456"]),
    (0x05, ["--head=head", "--worker=worker", "--port=6379"]),
    (0x06, ["--ssh-key-file-path=/root/.ssh", "--ssh-private-key=id_rsa"]),
    (0x07, ["--publish-not-ready-addresses=false", "--disable-network-policy=true"]),
    (0x08, ["--ps=ps", "--worker=worker", "--chief=chief", "--evaluator=evaluator", "--port=2222"]),
    (0x03, ["--scheduler=scheduler", "--server=server", "--worker=worker", "--port=9091"]),
    (0x01, ["-master=master", "--", "x"]),
]
for i, (k, args) in enumerate(flags):
    put("volcano_flags", f"flags-{i}", bytes([k]) + "\0".join(args).encode())

# ---- DNS record values (first byte: 0 etcd value, 1 vertex-domains annotation) ----
owner = {"owner": "r1", "namespace": "default", "pod": "p-0", "pod_uid": "u1"}
put("dns_record", "record.json", b"\x00" + js({"host": "192.168.10.5", "ttl": 30, "port": 7000, "weft": owner}).encode())
put("dns_record", "coredns.json", b"\x00" + js({"host": "10.0.0.1", "ttl": 60}).encode())
put("dns_record", "domains.json", b"\x01" + js([{"network": "pipeline1-multi-network",
                                                   "domain": "inference.video.default.weft.local",
                                                   "claim": "nic-pipeline1-multi-network"}]).encode())

# ---- NRI trunk (first byte: bit 7 small frame limit) ----
def frame(conn, payload):
    return struct.pack(">II", conn, len(payload)) + payload

def ttrpc(stream, typ, payload):
    return struct.pack(">IIBB", len(payload), stream, typ, 0) + payload

put("nri_mux", "two-conns", b"\x00" + frame(1, ttrpc(1, 1, b"\x0a\x03abc")) + frame(2, b"hello") + frame(7, b"dropped"))
put("nri_mux", "limited", b"\x81" + frame(1, b"12345678") + frame(1, b"x" * 9))
put("nri_mux", "cut", b"\x00" + frame(2, b"abc") + struct.pack(">II", 1, 100) + b"short")

# ---- NRI messages (first byte: which message) ----
def varint(n):
    out = b""
    while True:
        b = n & 0x7f
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])

def fld(num, wire, value):
    key = varint((num << 3) | wire)
    if wire == 0:
        return key + varint(value)
    return key + varint(len(value)) + value

def s(num, text):
    return fld(num, 2, text.encode())

def kv(num, k, v):
    return fld(num, 2, s(1, k) + s(2, v))

pod = s(1, "sandbox-1") + s(2, "p") + s(3, "u-p") + s(4, "default") + kv(5, "app", "x") + \
    kv(6, "weft.io/gpus", "0,1") + fld(9, 0, 42) + s(10, "10.0.0.5")
ctr = s(1, "ctr-1") + s(2, "sandbox-1") + s(3, "c") + fld(4, 0, 1) + s(7, "sleep") + s(8, "A=B") + fld(12, 0, 43)
req = s(1, "weft-agent") + s(2, "/nri.pkg.api.v1alpha1.Plugin") + s(3, "CreateContainer") + \
    fld(4, 2, fld(1, 2, pod) + fld(2, 2, ctr)) + fld(5, 0, 2000000000)
msgs = {
    0: req,
    1: s(1, "") + s(2, "containerd") + s(3, "v2.2.0") + fld(4, 0, 5000) + fld(5, 0, 2000) + s(6, "v0.10.0"),
    2: fld(1, 2, pod) + fld(2, 2, ctr) + fld(3, 0, 1),
    3: fld(1, 2, pod) + fld(2, 2, ctr),
    7: fld(1, 0, 6) + fld(2, 2, pod) + fld(3, 2, ctr),
    8: fld(1, 2, pod),
    13: fld(2, 0, 0x3fff),
    15: struct.pack(">i", -1),
}
for k, v in msgs.items():
    put("nri_messages", f"msg-{k}", bytes([k]) + v)
