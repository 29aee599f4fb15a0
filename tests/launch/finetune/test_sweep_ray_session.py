"""The Ray a sweep is sent to, and what a sweep refused on its way there leaves behind: an address with no
cluster, `--address auto`, flags of the local Ray beside an address, a `--ray-temp-dir` that cannot be made,
a cluster without GPUs, a repeated grid value, `--checkpoint .`. Each refusal is one line (exit 2), comes
before Ray starts where it can, and leaves no `sweep_config.json` that would refuse the corrected command.
The cluster tests share one real `ray start --head` (one CPU, no GPU, its own temp dir and ports).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from launch import cli
from launch.finetune.local_ray import MARKER, _make_temp_dir, check_temp_dir, remove_temp_dir
from launch.finetune.trial_records import inputs_fingerprint, write_record
from launch.finetune.tune_sweep import (CONFIG_FILE, _settings, base_settings, check_sweep_out, expand, load_grid,
                                       run_sweep)
from repo_paths import GLUE

TRIAL = {"max_train_samples": 8, "max_eval_samples": 8, "max_seq_len": 32}


def _sweep(checkpoint: Path, out: Path, *extra: str) -> list[str]:
    return ["sweep", "--tasks", "sst2", "--grid", "quick", "--checkpoint", str(checkpoint), "--data-dir", str(GLUE),
            "--out", str(out), "--max-train-samples", "8", "--max-eval-samples", "8", "--max-seq-len", "32", *extra]


def _refused(argv: list[str], capsys) -> str:
    """The one line a refused command printed (exit 2, no traceback)."""
    with pytest.raises(SystemExit) as refused:
        cli.main(argv)
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "Traceback" not in err, err
    return err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def no_ray_address(monkeypatch, tmp_path):
    """No RAY_ADDRESS, and Ray's bootstrap file (`ray start`'s record) looked for in an empty folder."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "no-ray-start"))


@pytest.fixture
def short_dir():
    """A folder of a short path: Ray's socket paths under a --ray-temp-dir must fit 107 bytes (checked first)."""
    path = Path(tempfile.mkdtemp(prefix="bp-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_cluster_that_is_not_there_is_one_line_and_the_corrected_command_is_not_refused(
        tiny_checkpoint, tmp_path, capsys, no_ray_address, monkeypatch):
    # ray:// retried for 30 s and ended in a ConnectionError traceback, a GCS address for minutes; and the
    # sweep_config.json written before left the corrected command refused ("already holds a sweep").
    out = tmp_path / "s"
    port = _free_port()
    started = time.monotonic()
    err = _refused(_sweep(tiny_checkpoint, out, "--address", f"ray://127.0.0.1:{port}"), capsys)
    assert f"cannot reach the Ray cluster at ray://127.0.0.1:{port} (--address ray://127.0.0.1:{port}): " \
           "Connection refused; start the cluster, or fix --address (or RAY_ADDRESS)" in err
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")  # as under `ray job submit`
    err = _refused(_sweep(tiny_checkpoint, out), capsys)
    assert f"(RAY_ADDRESS=127.0.0.1:{port}): Connection refused" in err
    assert time.monotonic() - started < 60
    assert not (out / CONFIG_FILE).exists()
    check_sweep_out(out, resume=False)  # what refused the corrected command


def test_address_auto_means_the_cluster_ray_start_recorded(tiny_checkpoint, tmp_path, capsys, no_ray_address):
    # Ray's legacy fallback for `auto` took any GCS process on the machine: another sweep's private local Ray.
    err = _refused(_sweep(tiny_checkpoint, tmp_path / "s", "--address", "auto"), capsys)
    assert "--address auto: no Ray cluster recorded by `ray start` on this machine (no " \
           f"{tmp_path / 'no-ray-start' / 'ray' / 'ray_current_cluster'}: one started with --temp-dir, or under " \
           "another TMPDIR or RAY_TMPDIR, records itself elsewhere); start one with `ray start --head`" in err
    assert not (tmp_path / "s").exists()


def test_local_ray_flags_beside_an_address_are_refused_not_ignored(tiny_checkpoint, tmp_path, capsys, no_ray_address,
                                                                    monkeypatch, short_dir):
    address = f"ray://127.0.0.1:{_free_port()}"  # refused before any connection is tried
    err = _refused(_sweep(tiny_checkpoint, tmp_path / "s", "--address", address, "--num-cpus", "2"), capsys)
    assert f"--num-cpus only sets up the local Ray, and --address {address} runs the sweep on a Ray cluster, where " \
           "it would be ignored; drop --num-cpus (or drop --address for a local Ray)" in err
    monkeypatch.setenv("RAY_ADDRESS", address)
    err = _refused(_sweep(tiny_checkpoint, tmp_path / "s", "--ray-temp-dir", str(short_dir / "rt")), capsys)
    assert f"--ray-temp-dir only sets up the local Ray, and RAY_ADDRESS={address} runs the sweep on a Ray " \
           "cluster" in err and "(or unset RAY_ADDRESS for a local Ray)" in err
    assert not (short_dir / "rt").exists() and not (tmp_path / "s").exists()


def test_a_ray_temp_dir_that_cannot_be_made_is_named_and_nothing_is_written(tiny_checkpoint, tmp_path, capsys,
                                                                             no_ray_address, short_dir):
    # `afile/rt` blamed --out ("cannot create --out ...: Not a directory") and left sweep_config.json there;
    # a temp dir under /proc was a FileNotFoundError traceback.
    (short_dir / "afile").write_text("a file, not a folder\n")
    for temp, why in [(short_dir / "afile" / "rt", "Not a directory"), (Path("/proc/bp-rt"), "No such file or directory")]:
        err = _refused(_sweep(tiny_checkpoint, tmp_path / "s", "--ray-temp-dir", str(temp)), capsys)
        assert f"cannot create --ray-temp-dir {temp}: {why}" in err and "--out" not in err, err
        assert not (tmp_path / "s").exists()
    # run_sweep (the demo's, a notebook's way in) refuses it too, before --out is written
    with pytest.raises(ValueError, match=r"cannot create --ray-temp-dir .*afile/rt: Not a directory"):
        run_sweep(["sst2"], tiny_checkpoint, GLUE, tmp_path / "s", grid="quick", overrides=TRIAL,
                  temp_dir=str(short_dir / "afile" / "rt"))
    assert not (tmp_path / "s").exists()
    # the check creates nothing it leaves: a temp dir that can be made is made by the sweep, later
    err = _refused(_sweep(tiny_checkpoint, tmp_path / "s", "--ray-temp-dir", str(short_dir / "new" / "rt"),
                          "--seed", "3"), capsys)  # refused after the temp dir's check
    assert "--seed is not a sweep setting" in err and sorted(p.name for p in short_dir.iterdir()) == ["afile"]


def test_the_parents_a_ray_temp_dir_needed_go_with_it_and_only_those(tmp_path):
    # `--ray-temp-dir /tmp/new/a/rt` left /tmp/new and /tmp/new/a behind after the sweep removed rt.
    path, owned = _make_temp_dir(str(tmp_path / "new" / "a" / "rt"))
    assert owned and (path / MARKER).is_file()
    (path / "session_x").mkdir()
    assert remove_temp_dir(path) and not (tmp_path / "new").exists() and tmp_path.is_dir()
    # a parent that holds something else (someone's file, put there during the sweep) stays, and those above it
    path, owned = _make_temp_dir(str(tmp_path / "new" / "a" / "rt"))
    (tmp_path / "new" / "theirs.txt").write_text("not bertpipe's\n")
    assert remove_temp_dir(path)
    assert not (tmp_path / "new" / "a").exists() and (tmp_path / "new" / "theirs.txt").is_file()
    # a temp dir in a folder that was there: that folder stays, even empty
    (tmp_path / "there").mkdir()
    path, _ = _make_temp_dir(str(tmp_path / "there" / "rt"))
    assert remove_temp_dir(path) and (tmp_path / "there").is_dir() and not path.exists()


def _start_beside_others(barrier, path: str, results) -> None:
    barrier.wait()
    try:
        check_temp_dir(path)
        made, owned = _make_temp_dir(path)
        assert owned and (made / MARKER).is_file()
        assert remove_temp_dir(made)
        results.put("ok")
    except Exception as err:  # noqa: BLE001 - reported to the test
        results.put(repr(err))


def test_sweeps_started_together_under_one_new_parent_all_start(short_dir):
    # Each made the missing parents itself, with no room for another doing the same: "cannot create
    # --ray-temp-dir .../sweep2: File exists: .../fresh" in most rounds of four sweeps started at once.
    import multiprocessing

    context = multiprocessing.get_context("fork")
    for round_ in range(8):
        barrier, results = context.Barrier(4), context.Queue()
        procs = [context.Process(target=_start_beside_others,
                                 args=(barrier, str(short_dir / str(round_) / "fresh" / "deeper" / f"s{i}"), results))
                 for i in range(4)]
        for proc in procs:
            proc.start()
        outcomes = [results.get(timeout=60) for _ in procs]
        for proc in procs:
            proc.join(timeout=60)
        assert outcomes == ["ok"] * 4, outcomes


def test_a_repeated_grid_value_is_named_as_such(tiny_checkpoint, tmp_path, capsys):
    # "... would share the trial folder ...; make their values differ in letters or digits": wrong advice.
    grid = tmp_path / "g.yaml"
    grid.write_text("lr: [5.0e-5, 5.0e-5]\n")
    err = _refused(_sweep(tiny_checkpoint, tmp_path / "s", "--grid", str(grid)), capsys)
    assert "error: lr lists 5e-05 twice; remove the repeated value" in err
    with pytest.raises(ValueError, match=r"^lr lists 5e-05 3 times; remove the repeated value$"):
        load_grid({"lr": ["5e-5", 5e-5, 0.00005]})  # equal once typed
    with pytest.raises(ValueError, match=r"^seeds lists 1 twice"):
        run_sweep(["sst2"], tiny_checkpoint, GLUE, tmp_path / "s", grid="quick", seeds=[1, 2, 1], overrides=TRIAL)
    assert not (tmp_path / "s").exists()


def _recorded_sweep(out: Path, checkpoint: Path, grid: dict) -> None:
    """`out` as a sweep whose every trial is recorded: run_sweep then writes its results without starting Ray."""
    base = base_settings("sst2", checkpoint, GLUE, TRIAL, 1)
    (out / "trials").mkdir(parents=True)
    (out / CONFIG_FILE).write_text(json.dumps({"tasks": ["sst2"], "grid": grid, "seeds": [1], "base": base}))
    inputs = inputs_fingerprint(base["checkpoint"], base["data_dir"], exclude=[out, out])
    for p in expand(["sst2"], load_grid(grid), [1]):
        settings = _settings(base, p, out / "trials")
        Path(settings["out"]).mkdir()
        write_record(Path(settings["out"]), settings, {"score": 0.75, "accuracy": 0.75}, inputs)


def test_checkpoint_dot_names_the_system_by_the_folder_and_a_link_by_its_own_name(tiny_checkpoint, tmp_path,
                                                                                   monkeypatch):
    # `--checkpoint .` gave rows named "" in results.md (and sweep.png, Table 7).
    grid = {"lr": [5e-5]}
    _recorded_sweep(tmp_path / "s", tiny_checkpoint, grid)
    monkeypatch.chdir(tiny_checkpoint)
    result = run_sweep(["sst2"], ".", GLUE, tmp_path / "s", grid=grid, overrides=TRIAL, resume=True)
    assert f"| {tiny_checkpoint.name} | 75.0 |" in result.table and "|  |" not in result.table
    # A link is the name the user gave (`bert-base-latest`), not its target's.
    link = tmp_path / "bert-base-latest"
    link.symlink_to(tiny_checkpoint)
    _recorded_sweep(tmp_path / "s2", tiny_checkpoint, grid)
    result = run_sweep(["sst2"], str(link), GLUE, tmp_path / "s2", grid=grid, overrides=TRIAL, resume=True)
    assert "| bert-base-latest | 75.0 |" in result.table


# --- on a real cluster: one `ray start --head` for the tests below ---


@pytest.fixture(scope="module")
def head():
    """A one-CPU, no-GPU cluster started with `ray start` (as the shipped autoscaling cluster is before its GPU
    workers come up), with its own temp dir: Ray's bootstrap file is BASE/ray/ray_current_cluster, which
    `--address auto` finds with RAY_TMPDIR=BASE."""
    base = Path(tempfile.mkdtemp(prefix="bp-head-"))
    gcs, *ports = [_free_port() for _ in range(8)]
    names = ["node-manager-port", "object-manager-port", "ray-client-server-port", "dashboard-agent-listen-port",
             "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port"]
    start = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
             f"--port={gcs}", "--num-cpus=1", "--num-gpus=0", "--include-dashboard=false", "--disable-usage-stats",
             f"--temp-dir={base / 'ray'}", *(f"--{name}={port}" for name, port in zip(names, ports))]
    # its own session: stopping it ends exactly this cluster (never `ray stop`, which stops every Ray here)
    proc = subprocess.Popen(start, env=_ray_env(), start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not (base / "ray" / "ray_current_cluster").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "ray start --head did not come up"
            time.sleep(0.2)
        yield base, gcs
    finally:  # SIGKILL at once: nothing of this cluster needs an orderly stop
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in (int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()):
            try:
                if str(base) in (Path("/proc") / str(pid) / "cmdline").read_bytes().decode(errors="replace"):
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        proc.wait(timeout=30)
        shutil.rmtree(base, ignore_errors=True)


def _ray_env(**extra: str) -> dict[str, str]:
    # Token auth off on both sides: a driver process's auth mode is fixed once Ray has read it, and an
    # earlier local Ray in this process turns it on; the CLI runs in a fresh process for that reason.
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1", **extra}
    env.pop("RAY_ADDRESS", None)
    return env


# Several `bertpipe sweep` commands in one process (Ray and torch imported once): (RAY_TMPDIR, argv) each.
RUN_EACH = """
import contextlib, io, json, os, sys
from launch import cli
for ray_tmpdir, argv in json.loads(sys.argv[1]):
    os.environ["RAY_TMPDIR"] = ray_tmpdir
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exit:
            code = exit.code
    print(json.dumps([code, err.getvalue()]), flush=True)
"""


@pytest.mark.slow
def test_a_cluster_with_no_gpu_now_asks_what_trials_take_and_auto_finds_only_ray_start(head, tiny_checkpoint,
                                                                                        tmp_path):
    base, gcs = head
    grid = tmp_path / "one.yaml"  # one trial: on the old code `auto` attached, and ran it on CPUs
    grid.write_text("lr: [5.0e-5]\n")
    argv = _sweep(tiny_checkpoint, tmp_path / "s", "--grid", str(grid), "--address")
    runs = [
        # A Ray runs here, but `ray start` recorded none where Ray looks: `auto` attached to such a Ray
        # (another sweep's private one), and waited for its CPUs or died with it.
        (str(tmp_path / "elsewhere"), [*argv, "auto"]),
        # The `ray start` cluster, without a GPU yet: every trial ran on CPUs, where an autoscaler adds GPU workers.
        (str(base), [*argv, "auto"]),
        (str(base), [*argv, f"127.0.0.1:{gcs}"]),
    ]
    done = subprocess.run([sys.executable, "-c", RUN_EACH, json.dumps(runs)], env=_ray_env(), capture_output=True,
                          text=True, timeout=300)
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("[")]
    assert len(results) == 3, done.stdout[-3000:] + done.stderr[-3000:]
    (code, err), *on_head = results
    assert code == 2 and "--address auto: no Ray cluster recorded by `ray start` on this machine" in err, err
    for (code, err), address in zip(on_head, ["auto", f"127.0.0.1:{gcs}"]):
        assert code == 2 and "Traceback" not in err, err
        assert f"the Ray cluster (--address {address}) has no GPU now, and its autoscaler may add GPU workers only " \
               "once trials ask for them; say what each trial takes: --gpus-per-trial 1 (GPU workers) or " \
               "--gpus-per-trial 0 (CPUs)" in err, err
    assert not (tmp_path / "s" / CONFIG_FILE).exists()
    check_sweep_out(tmp_path / "s", resume=False)  # the corrected command is not refused
