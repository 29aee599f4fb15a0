"""The overlays render (with kubectl's kustomize) and their patches land where they are meant to."""

from __future__ import annotations

import re
from typing import Any


def _gpus(container: dict[str, Any]) -> int:
    return int(container["resources"]["limits"]["nvidia.com/gpu"])


def test_objects_render_in_dependency_order(rendered) -> None:
    for root, objects in rendered.items():
        kinds = [o["kind"] for o in objects]
        if "TrainJob" in kinds:
            assert kinds.index("TrainingRuntime") < kinds.index("TrainJob"), root
        assert kinds[0] == "PersistentVolumeClaim", root


def test_namespaces_and_images(rendered) -> None:
    assert all("namespace" not in o["metadata"] for o in rendered["k8s/base"])
    for root, namespace in (("k8s/overlays/dev", "bertpipe-dev"), ("k8s/overlays/multinode", "bertpipe")):
        assert {o["metadata"].get("namespace") for o in rendered[root]} == {namespace}
    for root, registry in (("k8s/overlays/dev", "localhost:5000/bertpipe:dev"),
                           ("k8s/overlays/multinode", "ghcr.io/example/bertpipe:0.1.0")):
        text = repr(rendered[root])
        # The placeholder image names never reach a cluster: the overlay's `images:` replaced them
        # everywhere, custom resources' own image fields included (kustomizeconfig.yaml). An `images:`
        # in the base renamed them first, and the overlays' entries matched nothing.
        assert "'bertpipe-cuda'" not in text and "'bertpipe-cpu'" not in text, root
        assert f"'{registry}-cuda'" in text and f"'{registry}-cpu'" in text, root


def test_dev_overlay_is_one_gpu_everywhere(rendered, find_object) -> None:
    dev = rendered["k8s/overlays/dev"]
    trainjob = find_object(dev, "TrainJob", "bertpipe-pretrain")["spec"]["trainer"]
    assert trainjob["numNodes"] == 1 and trainjob["numProcPerNode"] == 1
    assert trainjob["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 1
    assert "bert-base" in trainjob["command"] and "--resume" in trainjob["command"]
    runtime = find_object(dev, "TrainingRuntime", "bertpipe-deepspeed")["spec"]
    assert runtime["mlPolicy"]["numNodes"] == 1
    # Trainer starts max(numNodes - 1, 1) node pods beside a launcher that runs as a node: with a node
    # job kept, dev ran two GPU pods at world size 2. The launcher alone is the one host.
    jobs = runtime["template"]["spec"]["replicatedJobs"]
    assert [j["name"] for j in jobs] == ["launcher"] and "dependsOn" not in jobs[0]
    assert runtime["mlPolicy"]["mpi"]["runLauncherAsNode"] is True
    assert _gpus(jobs[0]["template"]["spec"]["template"]["spec"]["containers"][0]) == 1
    pytorch = find_object(dev, "PyTorchJob", "bertpipe-pretrain-torchrun")["spec"]
    assert set(pytorch["pytorchReplicaSpecs"]) == {"Master"} and pytorch["nprocPerNode"] == "1"
    jobset = find_object(dev, "JobSet", "bertpipe-pretrain-jobset")["spec"]["replicatedJobs"][0]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in jobset["template"]["spec"]["containers"][0]["env"]}
    assert jobset["parallelism"] == jobset["completions"] == 1
    assert env["PET_NNODES"] == "1" and env["PET_NPROC_PER_NODE"] == "1"
    assert find_object(dev, "PersistentVolumeClaim", "bertpipe-data")["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert "--grid quick" in find_object(dev, "RayJob", "bertpipe-sweep")["spec"]["entrypoint"]


def test_multinode_overlay_scales_every_launcher_to_64_gpus(rendered, find_object) -> None:
    multi = rendered["k8s/overlays/multinode"]
    trainer = find_object(multi, "TrainJob", "bertpipe-pretrain")["spec"]["trainer"]
    assert trainer["numNodes"] * trainer["numProcPerNode"] == 64
    assert find_object(multi, "TrainingRuntime", "bertpipe-deepspeed")["spec"]["mlPolicy"]["numNodes"] == 8
    pytorch = find_object(multi, "PyTorchJob", "bertpipe-pretrain-torchrun")["spec"]
    nodes = sum(spec["replicas"] for spec in pytorch["pytorchReplicaSpecs"].values())
    assert nodes * int(pytorch["nprocPerNode"]) == 64
    mpi = find_object(multi, "MPIJob", "bertpipe-pretrain-mpi")["spec"]
    assert mpi["mpiReplicaSpecs"]["Worker"]["replicas"] * mpi["slotsPerWorker"] == 64
    jobset = find_object(multi, "JobSet", "bertpipe-pretrain-jobset")["spec"]["replicatedJobs"][0]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in jobset["template"]["spec"]["containers"][0]["env"]}
    assert jobset["completions"] == int(env["PET_NNODES"]) == 8 and int(env["PET_NPROC_PER_NODE"]) == 8
    driver = find_object(multi, "Job", "bertpipe-corpus-flink")["spec"]["template"]["spec"]["containers"][0]
    assert driver["command"][driver["command"].index("--num-shards") + 1] == "1024"
    assert find_object(multi, "FlinkDeployment", "bertpipe-flink")["spec"]["taskManager"]["replicas"] == 16


def _command(obj: dict[str, Any]) -> list[str]:
    return obj["spec"]["template"]["spec"]["containers"][0]["command"]


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_each_overlays_data_flows_from_stage_to_stage(rendered, find_object) -> None:
    """What one stage writes is what the next reads, whichever corpus runner builds it."""
    for root in ("k8s/overlays/dev", "k8s/overlays/multinode"):
        objects = rendered[root]
        corpus_outs = {_flag(_command(find_object(objects, "Job", name)), "--out")
                       for name in ("bertpipe-corpus", "bertpipe-corpus-flink")}
        assert len(corpus_outs) == 1, (root, corpus_outs)  # the dev Flink job wrote /data/corpus/seq128
        torchrun = find_object(objects, "PyTorchJob", "bertpipe-pretrain-torchrun")["spec"]["pytorchReplicaSpecs"]
        assert _flag(torchrun["Master"]["template"]["spec"]["containers"][0]["command"], "--data") in corpus_outs
        download = _command(find_object(objects, "Job", "bertpipe-download"))
        assert _flag(download, "--out").startswith(_flag(_command(find_object(objects, "Job", "bertpipe-corpus")), "--input"))
    # dev's volume and local-runner corpus Job hold Simple English Wikipedia, not the English dump.
    assert _flag(_command(find_object(rendered["k8s/overlays/dev"], "Job", "bertpipe-download")), "--lang") == "simple"


def test_flink_runs_at_its_slots_and_reads_back_what_was_staged(rendered, find_object) -> None:
    for root in ("k8s/overlays/dev", "k8s/overlays/multinode"):
        objects = rendered[root]
        flink = find_object(objects, "FlinkDeployment", "bertpipe-flink")["spec"]
        slots = flink["taskManager"]["replicas"] * int(flink["flinkConfiguration"]["taskmanager.numberOfTaskSlots"])
        # Beam's Flink runner takes the job's --parallelism, never the cluster's parallelism.default (it ran at 1).
        driver = _command(find_object(objects, "Job", "bertpipe-corpus-flink"))
        assert f"--parallelism={slots}" in driver and flink["flinkConfiguration"]["parallelism.default"] == str(slots)
        # The job server stages onto the volume the TaskManagers mount, not into its own /tmp.
        server = find_object(objects, "Deployment", "bertpipe-beam-jobserver")["spec"]["template"]["spec"]
        staging = next(a.split("=", 1)[1] for a in server["containers"][0]["args"] if a.startswith("--artifacts-dir="))
        mounted = {m["mountPath"] for m in server["containers"][0]["volumeMounts"]}
        taskmanager = flink["taskManager"]["podTemplate"]["spec"]["containers"][0]
        assert any(staging.startswith(m + "/") for m in mounted) and "/data" in mounted
        assert {m["mountPath"] for m in taskmanager["volumeMounts"]} >= mounted


def test_every_gpu_pod_shares_the_volume_and_memory_backed_shm(rendered) -> None:
    from k8s_validate import pod_specs

    for root, objects in rendered.items():
        for obj in objects:
            for _, pod in pod_specs(obj):
                claims = {v["persistentVolumeClaim"]["claimName"] for v in pod.get("volumes", []) if "persistentVolumeClaim" in v}
                for container in pod["containers"]:
                    if "nvidia.com/gpu" in container.get("resources", {}).get("limits", {}):
                        assert claims == {"bertpipe-data"}, (root, obj["metadata"]["name"])
                        assert any(m["mountPath"] == "/data" for m in container["volumeMounts"])


def test_every_pretrain_pod_has_time_to_checkpoint_on_sigterm(rendered) -> None:
    # SIGTERM makes the ranks checkpoint at the next step; with the default 30 s grace (or torchrun's default
    # 30 s shutdown timeout) a BERT-Large step plus a ZeRO save was cut off by SIGKILL.
    from k8s_validate import pod_specs

    for root, objects in rendered.items():
        for obj in objects:
            if not obj["metadata"].get("labels", {}).get("bertpipe.io/stage", "").startswith("pretrain"):
                continue
            for _, pod in pod_specs(obj):
                if not any("nvidia.com/gpu" in c.get("resources", {}).get("limits", {}) for c in pod["containers"]):
                    continue  # a launcher pod: no rank to wait for
                grace = pod.get("terminationGracePeriodSeconds", 30)
                assert grace >= 600, (root, obj["metadata"]["name"])
                for container in pod["containers"]:
                    command = container.get("command", [])
                    if command[:1] == ["torchrun"] or command[:3] == ["python", "-m", "launch.pretrain.torchrun"]:
                        env = {e["name"]: e.get("value") for e in container.get("env", [])}
                        assert 60 < int(env.get("PET_SHUTDOWN_TIMEOUT", 30)) < grace, (root, obj["metadata"]["name"])


def test_every_launcher_starts_one_process_per_gpu_of_its_pod(rendered, find_object) -> None:
    # A mismatch leaves GPUs idle, or puts two ranks on one GPU (out of memory), only once the job runs.
    for root, objects in rendered.items():
        trainjob = find_object(objects, "TrainJob", "bertpipe-pretrain")["spec"]["trainer"]
        assert trainjob["numProcPerNode"] == int(trainjob["resourcesPerNode"]["limits"]["nvidia.com/gpu"]), root
        runtime = find_object(objects, "TrainingRuntime", "bertpipe-deepspeed")["spec"]
        for job in runtime["template"]["spec"]["replicatedJobs"]:
            container = job["template"]["spec"]["template"]["spec"]["containers"][0]
            assert runtime["mlPolicy"]["mpi"]["numProcPerNode"] == _gpus(container), (root, job["name"])
        pytorch = find_object(objects, "PyTorchJob", "bertpipe-pretrain-torchrun")["spec"]
        for name, spec in pytorch["pytorchReplicaSpecs"].items():
            assert int(pytorch["nprocPerNode"]) == _gpus(spec["template"]["spec"]["containers"][0]), (root, name)
        mpi = find_object(objects, "MPIJob", "bertpipe-pretrain-mpi")["spec"]
        assert mpi["slotsPerWorker"] == _gpus(mpi["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]), root
        jobset = find_object(objects, "JobSet", "bertpipe-pretrain-jobset")["spec"]["replicatedJobs"][0]["template"]["spec"]
        container = jobset["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert int(env["PET_NPROC_PER_NODE"]) == _gpus(container), root


def _group_action(group: dict[str, Any], job: dict[str, Any], exit_code: int, disrupted: bool = False) -> str:
    """What a JobSet does when a pod of `job` ends with `exit_code` (`disrupted`: it carried the DisruptionTarget
    condition: preempted, evicted, drained). The Job controller takes the first podFailurePolicy rule that
    matches and fails the Job with reason PodFailurePolicy and a message naming the rule (formats from
    JobSet's KEP-262); with none, backoffLimit 0 fails it with BackoffLimitExceeded. The JobSet takes its
    first failurePolicy rule matching that reason and message (RE2 search, as `re.search` here)."""
    spec = job["template"]["spec"]
    container = spec["template"]["spec"]["containers"][0]["name"]
    reason, message = "BackoffLimitExceeded", "Job has reached the specified backoff limit"
    for index, rule in enumerate(spec.get("podFailurePolicy", {}).get("rules", [])):
        on_codes = rule.get("onExitCodes")
        if disrupted and any(c["type"] == "DisruptionTarget" for c in rule.get("onPodConditions", [])):
            message = f"Pod ns/p has condition DisruptionTarget matching {rule['action']} rule at index {index}"
        elif on_codes and on_codes["containerName"] == container and (exit_code in on_codes["values"]) == (
                on_codes["operator"] == "In"):
            message = (f"Container {container} for pod ns/p failed with exit code {exit_code} matching "
                       f"{rule['action']} rule at index {index}")
        else:
            continue
        assert rule["action"] == "FailJob"
        reason = "PodFailurePolicy"
        break
    for rule in group["failurePolicy"].get("rules", []):
        if reason in rule.get("onJobFailureReasons", [reason]) and (
                not rule.get("onJobFailureMessagePatterns")
                or any(re.search(p, message) for p in rule["onJobFailureMessagePatterns"])):
            return rule["action"]
    return "RestartJobSet"


def test_a_user_error_or_a_diverged_run_fails_the_group_at_once(rendered, find_object) -> None:
    # Before, a typo in a flag restarted all the nodes 10 times: the groups restarted on any failure, and
    # bare torchrun exits 1 whatever its workers did. The JobSet's pods now run torchrun exiting with their
    # failed worker's code; the TrainJob's launcher runs deepspeed over mpirun, which both pass it on.
    from launch.pretrain.fast_step import DIVERGED_EXIT

    for root, objects in rendered.items():
        jobset = find_object(objects, "JobSet", "bertpipe-pretrain-jobset")["spec"]
        runtime = find_object(objects, "TrainingRuntime", "bertpipe-deepspeed")["spec"]["template"]["spec"]
        launcher = next(j for j in runtime["replicatedJobs"] if j["name"] == "launcher")
        for group, job in ((jobset, jobset["replicatedJobs"][0]), (runtime, launcher)):
            # every pod of the last attempt gone before the next starts: none still holds the run's lock
            assert group["failurePolicy"]["restartStrategy"] == "BlockingRecreate", root
            for code in (2, DIVERGED_EXIT):
                assert _group_action(group, job, code) == "FailJobSet", (root, code)
            for code in (1, 4, 137, 143):  # a fault, a lost peer, the OOM killer, a stop: --resume continues
                assert _group_action(group, job, code) == "RestartJobSet", (root, code)
        # A preempted pod (which checkpointed on SIGTERM) restarts the group, counted: the kubelet marks its
        # own evictions under node pressure the same way, and those must not repeat without end.
        assert _group_action(jobset, jobset["replicatedJobs"][0], 143, disrupted=True) == "RestartJobSet", root
        container = jobset["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
        assert container["command"][:3] == ["python", "-m", "launch.pretrain.torchrun"], root
