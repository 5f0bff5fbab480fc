"""Extender under the memory abuse from issue 12: prioritize requests carrying many tiny Node
objects, each with its own name and a topology annotation of its own. Prints RSS as it goes."""
import json, subprocess, sys, time, urllib.request, os, re

weft = sys.argv[1]
requests = int(sys.argv[2]) if len(sys.argv) > 2 else 40
p = subprocess.Popen([weft, "scheduler-extender", "--cluster-file", "default", "--listen", "127.0.0.1:28888",
                      "--ops-listen", "127.0.0.1:29090"], stderr=subprocess.PIPE, text=True)
for line in p.stderr:
    if "listening on" in line and "scheduler-extender" in line:
        break

def rss():
    with open(f"/proc/{p.pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) // 1024

def node(i, r):
    topo = {"apiVersion": "weft.io/v1alpha1", "kind": "NodeTopology", "name": f"n{r}-{i}",
            "gpus": [{"index": 0}, {"index": 1}], "links": [{"gpus": [0, 1], "pcie": "PIX", "nvlinks": 0}]}
    return {"metadata": {"name": f"n{r}-{i}", "annotations": {"weft.io/gpu-topology": json.dumps(topo)}}}

pod = {"metadata": {"name": "p", "namespace": "x"},
       "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
print(f"start: {rss()} MiB")
t0 = time.time()
for r in range(requests):
    body = json.dumps({"Pod": pod, "Nodes": {"metadata": {}, "items": [node(i, r) for i in range(10000)]},
                       "NodeNames": None}).encode()
    req = urllib.request.Request("http://127.0.0.1:28888/prioritize", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as resp:
        status = resp.status
        resp.read()
    if r % 10 == 9 or r == 0:
        print(f"after {r+1} requests ({len(body)//1024} KiB each, status {status}): {rss()} MiB")
print(f"{requests} requests in {time.time()-t0:.1f} s; final {rss()} MiB")
p.terminate(); p.wait()
