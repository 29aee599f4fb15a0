"""A sweep's driver killed (SIGKILL) right after a trial finished, or stopped with Ctrl-C: the finished
trial is never run again, and no Ray process or temp dir of that sweep outlives it (issue 11).
Real `bertpipe sweep` processes on a real local Ray, tiny trials, one CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from launch.finetune.local_ray import MARKER, _make_temp_dir, remove_temp_dir
from launch.finetune.trial_records import RECORD, inputs_fingerprint, read_record, write_record
import as_from_a_shell
from repo_paths import GLUE

# --num-cpus 1: one trial at a time, so the second trial is running when the first has just finished.
TINY = ["--max-train-samples", "32", "--max-eval-samples", "32", "--max-seq-len", "32", "--num-cpus", "1"]


@pytest.fixture
def ray_temp():
    """A --ray-temp-dir that does not exist yet (so the sweep creates it, and must remove it). Short:
    Ray's socket paths under it must stay within the 107 bytes of a unix socket name."""
    base = Path(tempfile.mkdtemp(prefix="bp-"))
    yield base / "ray"
    shutil.rmtree(base, ignore_errors=True)


def _argv(checkpoint, out, ray_temp, grid="quick") -> list[str]:
    return [sys.executable, "-m", "launch.cli", "sweep", "--tasks", "sst2", "--checkpoint", str(checkpoint),
            "--data-dir", str(GLUE), "--out", str(out), "--ray-temp-dir", str(ray_temp), "--grid", str(grid), *TINY]


def _start(argv, log: Path) -> subprocess.Popen:
    return as_from_a_shell.popen(argv, stdout=subprocess.DEVNULL, stderr=open(log, "w"),
                                 env=dict(os.environ, OMP_NUM_THREADS="1"))


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the sweep ended (rc {proc.returncode}) before {path} appeared"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.02)


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, start time, state), straight from /proc."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        table[int(entry.name)] = (int(fields[1]), int(fields[19]), fields[0])
    return table


def _tree(root: int) -> dict[int, int]:
    """Every process below `root`: pid -> start time."""
    table, found, todo = _processes(), {}, [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, start, _) in table.items():
            if ppid == parent:
                found[pid] = start
                todo.append(pid)
    return found


def _alive(procs: dict[int, int]) -> list[int]:
    table = _processes()
    return [pid for pid, start in procs.items() if pid in table and table[pid][1] == start and table[pid][2] != "Z"]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _stamp(path: Path) -> tuple[int, int, bytes]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns, path.read_bytes()


@pytest.mark.slow
def test_sigkill_of_the_driver_leaves_no_ray_behind_and_resume_keeps_the_finished_trial(
        tiny_checkpoint, tmp_path, ray_temp):
    out = tmp_path / "sweep"
    # One trial: killed right after it finished, nothing is left to run (the mixed case, finished and
    # unfinished trials, is test_sweep.py's crash-and-resume test).
    grid = tmp_path / "one.yaml"
    grid.write_text("lr: [5.0e-5]\nbatch_size: [32]\nepochs: [1]\n")
    argv = _argv(tiny_checkpoint, out, ray_temp, grid)
    first_trial = out / "trials" / "sst2-bs32-ep1-lr5e-05-seed1"
    driver = _start(argv, tmp_path / "first.log")
    try:
        _wait_for(first_trial / RECORD, driver)
        ray_procs = _tree(driver.pid)  # Ray's services and agents, the trial worker, the watchdog
        cmdlines = [_cmdline(pid) for pid in ray_procs]
        os.kill(driver.pid, signal.SIGKILL)  # only the driver: what the OOM killer or `kill -9 PID` does
        driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    killed = time.monotonic()
    assert any("raylet" in c for c in cmdlines) and len(ray_procs) >= 5, cmdlines  # a real Ray was running
    while (_alive(ray_procs) or ray_temp.exists()) and time.monotonic() - killed < 30:
        time.sleep(0.1)
    gone_after = time.monotonic() - killed
    assert not _alive(ray_procs) and not ray_temp.exists(), (_alive(ray_procs), gone_after)
    assert gone_after < 10, f"Ray outlived the killed driver by {gone_after:.1f} s"
    assert "ended without stopping its local Ray" in (tmp_path / "first.log").read_text()

    assert not (out / "results.json").exists()  # the kill came before the sweep could end
    before = {name: _stamp(first_trial / name) for name in (RECORD, "metrics.json")}
    resumed = subprocess.run(argv + ["--resume"], capture_output=True, text=True, timeout=600,
                             env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "1 of 1 trials already finished, 0 to run" in resumed.stderr
    # Not run again: the fine-tuning run would have rewritten its metrics.json, the trial its record; with
    # nothing to run, Ray is not even started.
    assert {name: _stamp(first_trial / name) for name in before} == before
    assert "started a local Ray" not in resumed.stderr and not ray_temp.exists()
    results = json.loads((out / "results.json").read_text())
    assert [t["point"]["index"] for t in results["trials"]] == [0] and not results["trials"][0]["error"]
    assert results["trials"][0]["metrics"] == json.loads((first_trial / RECORD).read_text())["metrics"]
    assert "| System | SST-2 | Average |" in resumed.stdout


@pytest.mark.slow
@pytest.mark.parametrize("sig,group,code,said", [
    (signal.SIGINT, True, 130, "interrupted"),  # what a terminal's Ctrl-C does: the whole foreground group
    # Ray's driver handler printed a stack dump and exited 1 (a scheduler stopping the driver), or aborted
    # with 134 when the whole group got it (`timeout`, a pod's processes).
    (signal.SIGTERM, True, 143, "stopped by SIGTERM"), (signal.SIGTERM, False, 143, "stopped by SIGTERM")],
    ids=["sigint-group", "sigterm-group", "sigterm-driver"])
def test_ctrl_c_or_sigterm_on_sweep_is_one_line_and_its_exit_code(tiny_checkpoint, tmp_path, ray_temp, sig, group,
                                                                  code, said):
    out = tmp_path / "sweep"
    log = tmp_path / "sweep.err"
    driver = _start(_argv(tiny_checkpoint, out, ray_temp), log)
    try:
        _wait_for(out / "trials" / "sst2-bs32-ep1-lr5e-05-seed1" / RECORD, driver)  # the second trial is starting or running
        offset = log.stat().st_size
        if group:
            os.killpg(driver.pid, sig)
        else:
            driver.send_signal(sig)
        assert driver.wait(timeout=120) == code
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    text = log.read_text()
    after = [line for line in text[offset:].splitlines() if " INFO " not in line]
    # Once in CI (about 1 run in 20) the driver's shutdown never ended after this line (cause not found:
    # no stack was taken). The CLI now ends the process after EXIT_GRACE_S with a second line naming
    # what it waited on (tested in test_one_writer_and_interrupts.py).
    if len(after) == 2 and after[1].startswith("bertpipe sweep: still exiting after "):
        after.pop()
    assert len(after) == 1 and after[0].startswith(f"bertpipe sweep: {said}; "), after
    assert "--resume" in after[0] and "Traceback" not in text
    assert not (out / "results.json").exists() and (out / "trials" / "sst2-bs32-ep1-lr5e-05-seed1" / RECORD).is_file()
    assert not ray_temp.exists()


def test_trial_records_verify_their_settings_inputs_and_checksum(tmp_path):
    settings = {"task": "sst2", "lr": 5e-5, "batch_size": 32, "out": str(tmp_path)}
    metrics = {"accuracy": 0.5, "score": 0.5}
    assert read_record(tmp_path, settings, "in") == (None, "")  # not finished: no record, nothing to say
    path = write_record(tmp_path, settings, metrics, "in")
    assert read_record(tmp_path, settings, "in") == (metrics, "")
    assert sorted(p.name for p in tmp_path.iterdir()) == [RECORD]  # no temporary file left behind
    got, why = read_record(tmp_path, {**settings, "lr": 3e-5}, "in")
    assert got is None and "other settings (lr)" in why
    for where_or_how in ({"threads": 2}, {"feature_cache": str(tmp_path / "cache")}, {"progress": False}):
        assert read_record(tmp_path, {**settings, **where_or_how}, "in") == (metrics, "")  # not what it computed
    got, why = read_record(tmp_path, {**settings, "save_model": True}, "in")  # what it wrote: run it again
    assert got is None and "other settings (save_model)" in why
    got, why = read_record(tmp_path, settings, "other")
    assert got is None and "the checkpoint or the data changed" in why
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "metrics": {"accuracy": 0.9, "score": 0.9}}))
    got, why = read_record(tmp_path, settings, "in")
    assert got is None and "sha256" in why and str(path) in why
    path.write_text(path.read_text()[:40])  # torn
    got, why = read_record(tmp_path, settings, "in")
    assert got is None and "does not parse" in why


def test_inputs_fingerprint_sees_a_checkpoint_rewritten_in_place(tiny_checkpoint, tmp_path):
    ckpt = Path(shutil.copytree(tiny_checkpoint, tmp_path / "ckpt"))
    before = inputs_fingerprint(ckpt, GLUE / "SST-2")
    (ckpt / "export").mkdir()  # what bertpipe writes into a run dir itself does not count
    (ckpt / "export" / "x.safetensors").write_bytes(b"x")
    assert inputs_fingerprint(ckpt, GLUE / "SST-2") == before
    weights = next(ckpt.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")  # new weights, same path
    os.utime(weights, ns=(0, weights.stat().st_mtime_ns + 1_000_000))
    assert inputs_fingerprint(ckpt, GLUE / "SST-2") != before


def test_inputs_fingerprint_sees_a_file_renamed(tiny_checkpoint, tmp_path):
    # Same bytes, same size, same mtime under another name: dev.tsv gone, so a trial scored on it must rerun.
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").write_text("a\t1\n")
    (data / "dev.tsv").write_text("b\t0\n")  # the same size as train.tsv
    before = inputs_fingerprint(tiny_checkpoint, data)
    os.rename(data / "dev.tsv", data / "test.tsv")  # keeps the mtime; still sorts before train.tsv
    assert inputs_fingerprint(tiny_checkpoint, data) != before


def test_inputs_fingerprint_sees_data_behind_a_linked_folder(tiny_checkpoint, tmp_path):
    # rglob did not enter data/SST-2 -> elsewhere: an edit there kept stale trials on --resume
    real = Path(shutil.copytree(GLUE / "SST-2", tmp_path / "real" / "SST-2"))
    data = tmp_path / "data"
    data.mkdir()
    (data / "SST-2").symlink_to(real)
    (data / "loop").symlink_to(data)  # a link loop ends
    before = inputs_fingerprint(tiny_checkpoint, data)
    train = real / "train.tsv"
    train.write_text(train.read_text() + "one more line\t1\n")
    assert inputs_fingerprint(tiny_checkpoint, data) != before


def test_inputs_fingerprint_leaves_out_the_sweeps_own_folders_inside_the_data(tiny_checkpoint, tmp_path):
    # `--out DATA/sweep`: each trial's records and Tune logs changed the fingerprint, and --resume ran
    # every finished trial again ("records a run on other files").
    data = Path(shutil.copytree(GLUE / "SST-2", tmp_path / "data" / "SST-2")).parent
    before = inputs_fingerprint(tiny_checkpoint, data, exclude=[data / "sweep", data / "cache"])
    for folder in ("sweep/trials/t1", "cache/features"):
        (data / folder).mkdir(parents=True)
        (data / folder / "written.json").write_text("{}")
    assert inputs_fingerprint(tiny_checkpoint, data, exclude=[data / "sweep", data / "cache"]) == before
    assert inputs_fingerprint(tiny_checkpoint, data, exclude=[data / "sweep"]) != before


def test_only_a_ray_temp_dir_bertpipe_created_is_removed(tmp_path):
    foreign = tmp_path / "theirs"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("not ours")
    path, owned = _make_temp_dir(str(foreign))
    assert not owned and not (foreign / MARKER).exists()
    assert not remove_temp_dir(foreign) and (foreign / "keep.txt").is_file()
    empty = tmp_path / "empty"  # made by the user for this: theirs all the same
    empty.mkdir()
    path, owned = _make_temp_dir(str(empty))
    assert not owned and not remove_temp_dir(empty) and empty.is_dir()
    path, owned = _make_temp_dir(str(tmp_path / "new"))
    assert owned and (path / MARKER).is_file()
    (path / "session_x").mkdir()
    assert remove_temp_dir(path) and not path.exists()


@pytest.mark.slow
def test_local_ray_in_process_cleans_up_only_its_own_processes(ray_temp):
    """`ray_session` inside a longer-lived process (a notebook, this test): on a normal end its Ray's
    processes and temp dir are gone, and a child the process had started before is left alone; its
    Ray exports no metrics."""
    import ray

    from launch.finetune.local_ray import ray_session

    assert not ray.is_initialized()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        with ray_session(num_cpus=1, temp_dir=str(ray_temp)):
            assert ray.get(ray.remote(lambda: 1 + 1).remote()) == 2
            assert (ray_temp / MARKER).is_file()
            # Ray's metrics export is off in the driver too (its exporter thread once crashed a sweep).
            driver_logs = list((ray_temp / "session_latest" / "logs").glob("python-core-driver-*.log"))
            assert driver_logs and all("Disabled stats" in p.read_text() for p in driver_logs)
            ray_procs = {pid: start for pid, start in _tree(os.getpid()).items() if pid != bystander.pid}
        assert len(ray_procs) >= 4 and not ray.is_initialized()
        deadline = time.monotonic() + 10
        while _alive(ray_procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(ray_procs) and not ray_temp.exists()
        assert bystander.poll() is None  # started before the sweep's Ray: not its to kill
    finally:
        bystander.kill()
        bystander.wait()


AFTER_RAY = """
import os, signal, sys
from launch import cli
from launch.errors import Terminated
from launch.finetune.local_ray import ray_session

cli._stop_on_sigterm()
with ray_session(num_cpus=1, temp_dir=sys.argv[1]):
    pass
try:  # what a sweep does after its Ray: results.json, results.md, sweep.png (and the rest of the demo)
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pause()
except Terminated:
    print("stopped as Ctrl-C stops it")
"""


@pytest.mark.slow
def test_sigterm_after_the_local_ray_stopped_still_stops_the_command_in_one_line(ray_temp):
    """ray.shutdown leaves SIGTERM at the system's default (Python still names Ray's handler): the sweep was
    killed silently while it wrote its results."""
    done = subprocess.run([sys.executable, "-c", AFTER_RAY, str(ray_temp)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0 and done.stdout.strip() == "stopped as Ctrl-C stops it", (done.returncode,
                                                                                          done.stderr[-2000:])


@pytest.mark.slow
def test_sigterm_after_the_local_rays_gcs_went_still_stops_the_sweep_in_one_line(tiny_checkpoint, tmp_path, ray_temp):
    # A SIGTERM to the whole group stops the GCS too; a driver blocked in a GCS call then never ran its handler,
    # and Ray ended it 60 s later with exit 1 and a line of its own (test_ctrl_c_or_sigterm_on_sweep's rare
    # "exit 1" in CI). Made certain here: the GCS goes first, the driver's SIGTERM 5 s later.
    out = tmp_path / "sweep"
    log = tmp_path / "sweep.err"
    driver = _start(_argv(tiny_checkpoint, out, ray_temp), log)
    try:
        _wait_for(out / "trials" / "sst2-bs32-ep1-lr5e-05-seed1" / RECORD, driver)
        gcs = [pid for pid in _tree(driver.pid) if "gcs_server" in _cmdline(pid) and str(ray_temp) in _cmdline(pid)]
        assert len(gcs) == 1, [_cmdline(pid) for pid in _tree(driver.pid)]
        offset = log.stat().st_size
        os.kill(gcs[0], signal.SIGTERM)
        time.sleep(5)
        signalled = time.monotonic()
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(timeout=120) == 143
        took = time.monotonic() - signalled
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    after = [line for line in log.read_text()[offset:].splitlines() if " INFO " not in line]
    assert after == ["bertpipe sweep: stopped by SIGTERM; finished trials are kept; continue with the same command "
                     "plus --resume"], after
    assert took < 45, took  # ended by the deadline (local_ray.STOP_WITHIN_S), before Ray's own exit at 60 s
    assert not ray_temp.exists() and (out / "trials" / "sst2-bs32-ep1-lr5e-05-seed1" / RECORD).is_file()


SIGTERM_IN_SHUTDOWN = """
import os, signal, sys
import ray
from launch.errors import Terminated
from launch.finetune.local_ray import ray_session

def stop(signum, frame):  # what the CLI's entry point installs (launch.cli._stop_on_sigterm)
    raise Terminated

signal.signal(signal.SIGTERM, stop)
real = ray.shutdown

def shutdown(*args, **kwargs):  # the SIGTERM lands while the finished sweep stops its Ray
    os.kill(os.getpid(), signal.SIGTERM)
    return real(*args, **kwargs)

ray.shutdown = shutdown
try:
    with ray_session(num_cpus=1, temp_dir=sys.argv[1]):
        pass
except Terminated:
    print("terminated", flush=True)
    os._exit(143)
print("not stopped", flush=True)
"""


@pytest.mark.slow
def test_sigterm_while_the_local_ray_shuts_down_is_the_commands_interrupt(ray_temp):
    # Ray's own handler (`ray.init`'s, back once the sweep's ended) was in place while Ray shut down: a SIGTERM
    # then exited 15, silently, and the demo called its sweep step "failed (exit code 15)".
    done = subprocess.run([sys.executable, "-c", SIGTERM_IN_SHUTDOWN, str(ray_temp)], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert (done.returncode, done.stdout.strip()) == (143, "terminated"), (done.returncode, done.stderr[-2000:])
    assert not ray_temp.exists()


DEADLINE_RACE = """
import os, signal, sys, threading, time
from launch.errors import set_stopped_line
from launch.finetune.local_ray import _EndIfStuck

set_stopped_line("bertpipe sweep: {how}; the deadline's line")
signal.signal(signal.SIGTERM, lambda signum, frame: None)  # the main thread is past its own handler
handing_over = threading.Lock()  # LocalRay.hand_over's, which the main thread holds as the deadline comes

def hand_over():
    with handing_over:
        pass

deadline = _EndIfStuck(0.5, before_exit=hand_over)
with handing_over:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1.5)  # the watchdog's clean-up, slower than the deadline
deadline.close()
print("bertpipe sweep: stopped by SIGTERM; the main thread's line", file=sys.stderr, flush=True)
"""


def test_the_deadline_and_the_main_thread_never_both_report_the_interrupt():
    # The main thread, in LocalRay.hand_over when the deadline came, returned and printed the CLI's line, and the
    # deadline thread, let through by the same lock, printed its own and ended the process: two lines.
    done = subprocess.run([sys.executable, "-c", DEADLINE_RACE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 143 and done.stderr.splitlines() == [
        "bertpipe sweep: stopped by SIGTERM; the deadline's line"], (done.returncode, done.stderr)
