"""Extender under the time abuse from issue 12: heavy prioritize requests (many large, distinct
topologies) sent together, then a normal one; how long each takes and what it gets."""
import json, subprocess, sys, time, urllib.request, re, threading, random

weft = sys.argv[1]
p = subprocess.Popen([weft, "scheduler-extender", "--cluster-file", "default", "--listen", "127.0.0.1:28889",
                      "--ops-listen", "127.0.0.1:29091"], stderr=subprocess.PIPE, text=True)
for line in p.stderr:
    if "listening on" in line and "scheduler-extender" in line:
        break

def heavy_node(i, n=64, seed=0):
    rnd = random.Random(i * 1000 + seed)
    links = []
    for a in range(n):
        for b in range(a + 1, n):
            links.append({"gpus": [a, b], "pcie": rnd.choice(["PIX", "PXB", "PHB", "SYS"]), "nvlinks": rnd.choice([0, 0, 1, 2])})
    topo = {"apiVersion": "weft.io/v1alpha1", "kind": "NodeTopology", "name": f"h{i}",
            "gpus": [{"index": g} for g in range(n)], "links": links}
    return {"metadata": {"name": f"h{i}", "annotations": {"weft.io/gpu-topology": json.dumps(topo)}}}

def pod(k):
    return {"metadata": {"name": "p", "namespace": "x"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(k)}}}]}}

def post(body):
    t = time.time()
    req = urllib.request.Request("http://127.0.0.1:28889/prioritize", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read(); code = r.status
    except urllib.error.HTTPError as e:
        code = e.code
    return code, time.time() - t

def heavy_body(seed):
    return json.dumps({"Pod": pod(24), "Nodes": {"metadata": {}, "items": [heavy_node(i, seed=seed) for i in range(500)]}, "NodeNames": None}).encode()
bodies = [heavy_body(s) for s in range(6)]
print("heavy body", len(bodies[0]) // 1024, "KiB")
normal = json.dumps({"Pod": pod(4), "NodeNames": ["dgx-a100-0", "dgx1-v100-0", "pcie-8gpu-0"], "Nodes": None}).encode()
print("one heavy request alone:", post(bodies[5]))
results = []
threads = [threading.Thread(target=lambda b=b: results.append(("heavy",) + post(b))) for b in bodies[:4]]
for t in threads: t.start()
time.sleep(0.2)
results.append(("normal while heavy in flight",) + post(normal))
for t in threads: t.join()
results.append(("normal after",) + post(normal))
for r in results: print(r)
p.terminate(); p.wait()
