"""Webhook under the per-request abuse from issue 12: pods with 10,000 containers sent four at a
time, and a normal Job validation meanwhile. Prints each answer's size and time, and the RSS."""
import json, subprocess, sys, time, threading, re, ssl, urllib.request, copy, os, tempfile

weft, examples = sys.argv[1], sys.argv[2]
d = tempfile.mkdtemp()
subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", f"{d}/k", "-out", f"{d}/c"],
               check=True, capture_output=True)
p = subprocess.Popen([weft, "webhook", "--jobs-file", f"{examples}/jobs.yaml", "--tls-cert-file", f"{d}/c",
                      "--tls-key-file", f"{d}/k", "--listen", "127.0.0.1:28443", "--ops-listen", "127.0.0.1:29092"],
                     stderr=subprocess.PIPE, text=True)
for line in p.stderr:
    if "webhook listening on" in line:
        break
ctx = ssl.create_default_context(cafile=f"{d}/c")

def rss():
    with open(f"/proc/{p.pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) // 1024

def post(path, body):
    t = time.time()
    req = urllib.request.Request(f"https://localhost:28443{path}", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
        text = r.read()
    return len(text), round(time.time() - t, 4), json.loads(text)["response"]["allowed"]

review = json.load(open(f"{examples}/pod-review.json"))
big = copy.deepcopy(review)
c0 = big["request"]["object"]["spec"]["containers"][0]
big["request"]["object"]["spec"]["containers"] = [dict(c0, name=f"c{i}") for i in range(10000)]
big_body = json.dumps(big).encode()
validate = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
    "uid": "v1", "kind": {"group": "batch.volcano.sh", "version": "v1alpha1", "kind": "Job"},
    "resource": {"group": "batch.volcano.sh", "version": "v1alpha1", "resource": "jobs"},
    "operation": "CREATE", "namespace": "ml", "userInfo": {},
    "object": {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "j", "namespace": "ml"},
               "spec": {"tasks": [{"name": "w", "replicas": 2, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}]}}}}).encode()
print(f"start {rss()} MiB; big review {len(big_body)//1024} KiB")
print("normal pod:", post("/pods/mutate", json.dumps(review).encode()))
results = []
threads = [threading.Thread(target=lambda: results.append(("10,000-container pod",) + post("/pods/mutate", big_body))) for _ in range(4)]
for t in threads: t.start()
results.append(("validate meanwhile",) + post("/jobs/validate", validate))
for t in threads: t.join()
for r in results: print(r)
print(f"peak-ish RSS after: {rss()} MiB")
p.terminate(); p.wait()
