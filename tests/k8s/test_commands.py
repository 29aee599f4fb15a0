"""Every command a manifest (or the Ray cluster config, or the hostfile example) runs is real.

`bertpipe X ...` must parse with `launch.cli.build_parser(X)`; `deepspeed ... --module
launch.pretrain ...` and `torchrun ... --module launch.pretrain ...` must parse with the launcher's
own argument parser *and* with `launch.pretrain`'s; Beam options passed through `bertpipe corpus`
must be options Beam knows. A command naming a module that does not exist fails, naming the module.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import re
import shlex
from functools import lru_cache
from typing import Any

import pytest

import k8s_validate
from launch import cli

REPO = k8s_validate.REPO
# Containers that run their image's own entry point (no `command`), with the operator that starts them.
IMAGE_ENTRYPOINTS = {
    "ray-head": "KubeRay starts `ray start --head`",
    "ray-worker": "KubeRay starts `ray start`",
    "ray-job-submitter": "KubeRay fills in `ray job submit`",
    "flink-main-container": "the Flink operator starts the TaskManager",
    "jobserver": "Beam's Flink job server image",
    "trainjob-trainer": "a TrainingRuntime's trainer step runs the TrainJob's trainer.command (checked there)",
}
TRAINER_STEP = ("trainer.kubeflow.org/trainjob-ancestor-step", "trainer")
# torchrun, exiting with the failed worker's own code (bare torchrun exits 1 whatever happened).
TORCHRUN_KEEPING_EXIT_CODES = ["python", "-m", "launch.pretrain.torchrun"]
# DeepSpeed's runner, exiting 128 + N where bare `deepspeed` exits 0 (its mpirun killed by signal N).
DEEPSPEED_KEEPING_EXIT_CODES = ["python", "-m", "launch.pretrain.deepspeed_runner"]


@lru_cache(maxsize=1)
def _manifest_commands() -> list[tuple[str, list[str], dict[str, Any]]]:
    """(where, argv, container-or-object) for every command in every rendered kustomization."""
    found = []
    for root in k8s_validate.kustomizations():
        rel = k8s_validate.repo_relative(root)
        for obj in k8s_validate.render_kustomization(root):
            name = f"{rel}:{k8s_validate.object_name(obj)}"
            if obj["kind"] == "TrainJob" and "command" in obj["spec"].get("trainer", {}):
                trainer = obj["spec"]["trainer"]
                found.append((f"{name}:trainer", [*trainer["command"], *trainer.get("args", [])], trainer))
            if obj["kind"] == "RayJob":
                found.append((f"{name}:entrypoint", shlex.split(obj["spec"]["entrypoint"]), obj["spec"]))
            trainer_steps = set()
            if obj["kind"] == "TrainingRuntime":
                for i, job in enumerate(obj["spec"]["template"]["spec"]["replicatedJobs"]):
                    labels = job["template"].get("metadata", {}).get("labels", {})
                    if labels.get(TRAINER_STEP[0]) == TRAINER_STEP[1]:
                        trainer_steps.add(("spec", "template", "spec", "replicatedJobs", i))
            for path, pod in k8s_validate.pod_specs(obj):
                for container in [*pod.get("initContainers", []), *pod["containers"]]:
                    where = f"{name}:{k8s_validate.field_path(path)}:{container['name']}"
                    argv = [*container.get("command", []), *container.get("args", [])]
                    if path[:5] in trainer_steps and "command" not in container:
                        container = {"name": "trainjob-trainer"}
                    found.append((where, argv if "command" in container else [], container))
    return found


def _ids() -> list[str]:
    return [where for where, _, _ in _manifest_commands()]


def _parse_or_fail(parser: argparse.ArgumentParser, argv: list[str], where: str, capsys) -> argparse.Namespace:
    try:
        return parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: {parser.prog} rejects {argv}: {capsys.readouterr().err.strip()}")


def _require_module(module: str) -> None:
    # A manifest naming a module that does not exist is a broken manifest: a failure, never a skip.
    assert importlib.util.find_spec(module) is not None, f"{module} does not exist"


def check_bertpipe(argv: list[str], where: str, capsys, caplog) -> argparse.Namespace:
    command = argv[0]
    assert command in cli.COMMANDS, f"{where}: `bertpipe {command}` is not a bertpipe command"
    _require_module(cli.COMMANDS[command][0])
    args = _parse_or_fail(cli.build_parser(command), argv[1:], where, capsys)
    if command == "corpus" and getattr(args, "beam_args", None):
        from apache_beam.options.pipeline_options import PipelineOptions

        with caplog.at_level(logging.WARNING, logger="apache_beam.options.pipeline_options"):
            PipelineOptions(args.beam_args).get_all_options()
        unknown = [r.getMessage() for r in caplog.records if "unparseable" in r.getMessage()]
        assert not unknown, f"{where}: Beam does not know {unknown}"
    if command in ("sweep",):
        assert args.resume, f"{where}: a restarted sweep must continue (--resume)"
    return args


def check_pretrain_worker(argv: list[str], where: str, monkeypatch, capsys) -> argparse.Namespace:
    """Parse with `launch.pretrain.main`'s own parser, stopping before it builds a trainer."""
    _require_module("launch.pretrain")
    import launch.pretrain.worker as worker

    class Parsed(Exception):
        pass

    def capture(args: argparse.Namespace) -> None:
        raise Parsed(args)

    monkeypatch.setattr(worker, "build_trainer", capture)
    monkeypatch.setattr(worker, "setup_logging", lambda *a, **k: None)
    try:
        worker.main(argv)
    except Parsed as parsed:
        args = parsed.args[0]
    except SystemExit:
        pytest.fail(f"{where}: launch.pretrain rejects {argv}: {capsys.readouterr().err.strip()}")
    else:
        pytest.fail(f"{where}: launch.pretrain.main never built its trainer")
    assert "--nproc" not in argv, f"{where}: under a launcher the launcher sets the world, not --nproc"
    assert args.resume, f"{where}: a preempted pre-training job must restart with --resume"
    from launch.config import resolve_preset

    if args.config:
        resolve_preset(args.config)  # the preset (or YAML) must exist
    return args


def openmpi_command_lines() -> dict[str, str]:
    """The processes on an MPI launcher pod, as `pkill -f` sees them: tini, DeepSpeed's runner (ours, or bare
    `deepspeed` as the docs run it over ssh), the mpirun its OpenMPIRunner builds, and a rank (the tail of
    mpirun's line that orted starts)."""
    import sys

    from deepspeed.launcher.multinode_runner import OpenMPIRunner
    from deepspeed.launcher.runner import parse_args as deepspeed_args

    argv = ["--hostfile", "/etc/mpi/hostfile", "--launcher", "openmpi", "--launcher_args", "-x OMP_NUM_THREADS=4",
            "--module", "launch.pretrain", "--config", "bert-large-phase1", "--resume"]
    mpirun = OpenMPIRunner(deepspeed_args(argv), "", {"node-0": 8}).get_cmd({}, {})
    return {"tini": " ".join(["/usr/bin/tini", "-g", "--", *DEEPSPEED_KEEPING_EXIT_CODES, *argv]),
            "runner": " ".join([sys.executable, *DEEPSPEED_KEEPING_EXIT_CODES[1:], *argv]),
            "bare runner": " ".join([sys.executable, "/opt/venv/bin/deepspeed", *argv]),
            "mpirun": " ".join(mpirun), "rank": " ".join(mpirun[mpirun.index(sys.executable):])}


def check_rank_pattern(pattern: str, where: str) -> None:
    # A SIGTERM to tini, the runner or mpirun takes every rank down without a checkpoint: it must match
    # the ranks alone (the old 'launch[.]pretrain' matched all four).
    lines = openmpi_command_lines()
    assert re.search(pattern, lines["rank"]), f"{where}: {pattern!r} misses the rank {lines['rank']!r}"
    for name in ("tini", "runner", "bare runner", "mpirun"):
        assert not re.search(pattern, lines[name]), f"{where}: {pattern!r} also matches {name}: {lines[name]!r}"


def test_mpi_launcher_pods_stop_the_ranks_through_mpirun() -> None:
    # Deleting the launcher pod SIGTERMs tini, then the runner and mpirun, which kills the job: its preStop
    # must first send mpirun SIGUSR1 (passed on to every rank, which then checkpoints) and wait for it.
    launchers = []
    for root in k8s_validate.kustomizations():
        for obj in k8s_validate.render_kustomization(root):
            if obj["kind"] not in ("MPIJob", "TrainingRuntime"):
                continue
            for path, pod in k8s_validate.pod_specs(obj):
                if obj["kind"] == "MPIJob":
                    launcher = "Launcher" in path
                else:  # a TrainingRuntime's replicated job named launcher (runLauncherAsNode: ranks there too)
                    launcher = obj["spec"]["template"]["spec"]["replicatedJobs"][path[4]]["name"] == "launcher"
                if not launcher:
                    continue
                for container in pod["containers"]:
                    where = f"{k8s_validate.repo_relative(root)}:{k8s_validate.object_name(obj)}:{container['name']}"
                    launchers.append(where)
                    stop = " ".join(container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", []))
                    assert "pkill -USR1 -x 'mpirun|orterun|prterun'" in stop and "while pgrep -x" in stop, where
                    assert pod.get("terminationGracePeriodSeconds", 30) >= 600, where
    assert len(launchers) == 2 * len(k8s_validate.kustomizations()), launchers  # the MPIJob's and the runtime's


def check_command(where: str, argv: list[str], spec: dict[str, Any], monkeypatch, capsys, caplog) -> None:
    if not argv:
        assert spec.get("name") in IMAGE_ENTRYPOINTS, (
            f"{where}: container without a command; name it in IMAGE_ENTRYPOINTS with the reason"
        )
        return
    program = argv[0]
    if program == "/usr/bin/tini":  # PID 1 that forwards SIGTERM to the whole group (-g): the command after --
        assert argv[1:3] == ["-g", "--"] and "tini" in (REPO / "docker" / "Dockerfile.cuda").read_text(), where
        return check_command(where, argv[3:], spec, monkeypatch, capsys, caplog)
    if program == "bertpipe":
        check_bertpipe(argv[1:], where, capsys, caplog)
    elif program == "deepspeed" or argv[:3] == DEEPSPEED_KEEPING_EXIT_CODES:
        from deepspeed.launcher.runner import parse_args as deepspeed_args

        if program != "deepspeed":
            _require_module(argv[2])
        launcher = deepspeed_args(argv[1 if program == "deepspeed" else 3:])
        assert launcher.module and launcher.user_script == "launch.pretrain", where
        if launcher.launcher == "openmpi":  # DeepSpeed's OpenMPI runner refuses these (validate_args)
            assert launcher.num_gpus == -1 and launcher.num_nodes == -1 and not launcher.include, where
            # mpirun starts the ranks over ssh with only the variables it is told to pass on
            assert "-x OMP_NUM_THREADS=" in launcher.launcher_args, where
            # The MPIJob's launcher pod has no GPU: with one worker deepspeed would start the ranks there
            assert launcher.force_multi or "MPIJob" not in where, where
        check_pretrain_worker(launcher.user_args, where, monkeypatch, capsys)
    elif program == "torchrun" or argv[:3] == TORCHRUN_KEEPING_EXIT_CODES:
        from torch.distributed.run import get_args_parser

        if program != "torchrun":
            _require_module(argv[2])
        launcher = _parse_or_fail(get_args_parser(), argv[1 if program == "torchrun" else 3:], where, capsys)
        assert launcher.module and launcher.training_script == "launch.pretrain", where
        check_pretrain_worker(launcher.training_script_args, where, monkeypatch, capsys)
    elif program == "/usr/sbin/sshd":
        assert argv == ["/usr/sbin/sshd", "-De", "-f", "/home/bertpipe/.sshd_config"], where
        port = re.search(r"^Port (\d+)$", (REPO / "docker" / "sshd_config").read_text(), re.M)
        assert port and spec["readinessProbe"]["tcpSocket"]["port"] == int(port.group(1)), where
        assert "docker/sshd_config /home/bertpipe/.sshd_config" in (REPO / "docker" / "Dockerfile.cuda").read_text()
        # sshd is PID 1: on deletion the ranks under it must be stopped (and waited for) before it exits
        stop = " ".join(spec["lifecycle"]["preStop"]["exec"]["command"])
        ranks = re.search(r"r='([^']+)'; pkill -TERM -f \"\$r\"; while pgrep -f \"\$r\"", stop)
        assert ranks, f"{where}: preStop must SIGTERM the ranks and wait for them: {stop}"
        check_rank_pattern(ranks.group(1), where)
        assert "procps" in (REPO / "docker" / "Dockerfile.cuda").read_text(), where
    elif program == "/opt/apache/beam/boot":
        assert argv == ["/opt/apache/beam/boot", "--worker_pool"], where
        assert "/opt/apache/beam /opt/apache/beam" in (REPO / "docker" / "Dockerfile.cpu").read_text()
        # else boot makes its own venv under /opt/apache (not writable by user 1000; blind to /opt/venv's packages)
        assert "RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT=1" in (REPO / "docker" / "Dockerfile.cpu").read_text()
    else:
        pytest.fail(f"{where}: unrecognised program {program!r}; teach this test how to check it")


@pytest.mark.parametrize("where", _ids(), ids=_ids())
def test_manifest_command(where: str, monkeypatch, capsys, caplog) -> None:
    (argv, spec) = next((a, s) for w, a, s in _manifest_commands() if w == where)
    # Bare torchrun exits 1 whatever its workers did, bare deepspeed 0 when its mpirun is killed: a job
    # controller must see the exit code that tells it whether to retry.
    program = argv[3:4] if argv[:1] == ["/usr/bin/tini"] else argv[:1]
    instead = {"deepspeed": DEEPSPEED_KEEPING_EXIT_CODES, "torchrun": TORCHRUN_KEEPING_EXIT_CODES}
    assert not (program and program[0] in instead), f"{where}: run {program[0]} as `{' '.join(instead[program[0]])}`"
    check_command(where, argv, spec, monkeypatch, capsys, caplog)


def test_every_stage_runs_a_bertpipe_command() -> None:
    """The manifests cover the pipeline: download, corpus, pretrain (each launcher), sweep."""
    seen = set()
    for _, argv, _ in _manifest_commands():
        argv = argv[3:] if argv[:1] == ["/usr/bin/tini"] else argv
        if argv[:1] == ["bertpipe"]:
            seen.add(argv[1])
        elif argv[:1] in (["deepspeed"], ["torchrun"]):
            seen.add(argv[0])
        elif argv[:3] == TORCHRUN_KEEPING_EXIT_CODES:
            seen.add("torchrun")
        elif argv[:3] == DEEPSPEED_KEEPING_EXIT_CODES:
            seen.add("deepspeed")
    assert {"download", "corpus", "sweep", "deepspeed", "torchrun"} <= seen


def _documented_commands(text: str) -> list[list[str]]:
    """Commands in the shell blocks of a doc or in `#   ` comment lines, backslash continuations joined."""
    commands, lines = [], []
    for raw in text.splitlines():
        line = re.sub(r"^#\s{1,3}", "", raw.strip()) if raw.lstrip().startswith("#") else raw.strip()
        lines.append(line)
    joined = "\n".join(lines).replace("\\\n", " ")
    for line in joined.splitlines():
        line = line.strip()
        if re.match(r"^(bertpipe|deepspeed|torchrun|python -m launch\.pretrain\.(torchrun|deepspeed_runner)|"
                    r"ray (submit|job submit)|"
                    r"kubectl (apply|kustomize)) ", line):
            commands.append(shlex.split(line, comments=True))
    return commands


def _check_documented(argv: list[str], where: str, monkeypatch, capsys, caplog) -> None:
    if argv[0] == "kubectl":
        # kubectl apply -k DIR [-l bertpipe.io/stage=S] | kubectl kustomize DIR: DIR renders, S selects something.
        directory = argv[argv.index("-k") + 1] if "-k" in argv else argv[2]
        objects = k8s_validate.render_kustomization(REPO / directory)
        if "-l" in argv:
            key, value = argv[argv.index("-l") + 1].split("=")
            assert any(o["metadata"]["labels"].get(key) == value for o in objects), f"{where}: selects nothing"
    elif argv[:2] == ["ray", "submit"]:
        # ray submit CLUSTER.yaml SCRIPT [args]: the script is launch/cli/__main__.py, i.e. `bertpipe ...`.
        assert argv[2] == "deploy/ray-cluster.yaml" and argv[3] == "launch/cli/__main__.py", where
        assert (REPO / argv[2]).is_file() and (REPO / argv[3]).is_file(), where
        check_bertpipe(argv[4:], where, capsys, caplog)
    elif argv[:3] == ["ray", "job", "submit"]:
        rest = argv[argv.index("--") + 1:]
        assert rest[0] == "bertpipe", where
        check_bertpipe(rest[1:], where, capsys, caplog)
    else:
        check_command(where, argv, {}, monkeypatch, capsys, caplog)


@pytest.mark.parametrize("source", ["deploy/ray-cluster.yaml", "deploy/hostfile.example", "docs/scaling-out.md"])
def test_documented_commands(source: str, monkeypatch, capsys, caplog) -> None:
    text = (REPO / source).read_text()
    commands = [c for c in _documented_commands(text) if "..." not in c]
    assert commands, f"{source}: no command found"
    for argv in commands:
        _check_documented(argv, f"{source}: {' '.join(argv)[:80]}", monkeypatch, capsys, caplog)


def test_hostfile_example_parses_with_deepspeed() -> None:
    from deepspeed.launcher.runner import _parse_hostfile

    pool = _parse_hostfile((REPO / "deploy" / "hostfile.example").read_text().splitlines(keepends=True))
    assert list(pool.values()) == [8, 8, 8, 8] and len(pool) == 4
