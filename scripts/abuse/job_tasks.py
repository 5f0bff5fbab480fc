"""Issue 24 item 9: a Volcano Job with many tasks of one replica each, weft's svc and env plugins
(annotation). Measures `weft jobs render -o yaml` (peak RSS, time, output size) at each task count,
and the webhook's peak RSS while it answers four pod reviews of the job at once.

    python3 scripts/abuse/job_tasks.py target/release/weft 1000 10000

Each render runs under `ulimit -v` (RENDER_CAP_GB, default 6) and `timeout` (RENDER_TIMEOUT_S,
default 300), so a runaway render stops instead of taking the machine."""
import json, os, re, ssl, subprocess, sys, tempfile, threading, time, urllib.request

weft, counts = sys.argv[1], [int(n) for n in sys.argv[2:]] or [1000, 10000]
cap_gb = int(os.environ.get("RENDER_CAP_GB", "6"))
timeout_s = int(os.environ.get("RENDER_TIMEOUT_S", "300"))
d = tempfile.mkdtemp()
UID = "7d1f5c0e-0000-4000-8000-00000000a001"


def job(tasks):
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": "wide", "namespace": "ml", "uid": UID, "resourceVersion": "1",
                         "annotations": {"weft.io/job-plugins": '{"svc": [], "env": []}'}},
            "spec": {"queue": "default", "schedulerName": "volcano", "minAvailable": tasks,
                     "tasks": [{"name": f"t{i}", "replicas": 1, "minAvailable": 1,
                                "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}}
                               for i in range(tasks)]}}


def render(n):
    path = f"{d}/job-{n}.json"
    json.dump(job(n), open(path, "w"))
    cmd = f"ulimit -v {cap_gb * 1024 * 1024}; exec /usr/bin/time -v timeout {timeout_s} {weft} jobs render {path} -o yaml"
    t = time.time()
    p = subprocess.run(["bash", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wall = time.time() - t
    err = p.stderr.decode(errors="replace")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", err).group(1)) // 1024
    first = next((l for l in err.splitlines() if l.startswith(("Error", "error", "warning"))), "")
    print(f"render {n} tasks: exit {p.returncode}, {wall:.1f} s, peak RSS {rss} MiB, "
          f"{len(p.stdout) / 1e6:.1f} MB of YAML; {first[:160]}")


def webhook(n):
    path = f"{d}/jobs-{n}.json"
    json.dump(job(n), open(path, "w"))
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", f"{d}/k", "-out", f"{d}/c"],
                   check=True, capture_output=True)
    p = subprocess.Popen([weft, "webhook", "--jobs-file", path, "--tls-cert-file", f"{d}/c", "--tls-key-file", f"{d}/k",
                          "--listen", "127.0.0.1:28443", "--ops-listen", "127.0.0.1:29092"],
                         stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        if "webhook listening on" in line:
            break
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    ctx = ssl.create_default_context(cafile=f"{d}/c")

    def status(field):
        with open(f"/proc/{p.pid}/status") as f:
            return int(re.search(field + r":\s+(\d+)", f.read()).group(1)) // 1024

    def review(i):
        name = f"wide-t{i}-0"
        return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": f"r{i}", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"}, "name": name, "namespace": "ml",
            "operation": "CREATE", "userInfo": {},
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": name, "namespace": "ml",
                "annotations": {"volcano.sh/task-spec": f"t{i}", "volcano.sh/job-version": "0"},
                "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "wide",
                                     "uid": UID, "controller": True}]},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]}}}}).encode()

    results = []

    def post(i):
        t = time.time()
        req = urllib.request.Request("https://localhost:28443/pods/mutate", data=review(i),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
            body = json.loads(r.read())["response"]
        results.append((len(body.get("patch", "")), round(time.time() - t, 3), body["allowed"],
                        body.get("status", {}).get("message", "")[:140]))

    start = status("VmRSS")
    threads = [threading.Thread(target=post, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"webhook {n} tasks, 4 pods at once: RSS at start {start} MiB, peak {status('VmHWM')} MiB")
    for r in results:
        print(f"  answer: base64 patch {r[0]} bytes, {r[1]} s, allowed {r[2]} {r[3]}")
    p.terminate()
    p.wait()


for n in counts:
    render(n)
for n in counts:
    webhook(n)
