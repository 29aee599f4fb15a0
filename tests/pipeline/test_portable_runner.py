"""The corpus job through Beam's portability layer, which is what Flink, Spark and Dataflow run.

Those engines cannot run here (no Maven, no container engine), but their Python workers execute
Beam's portable SDK harness. So the job service (`local_job_service_main`) and an EXTERNAL SDK
worker pool (`worker_pool_main`) are started as separate processes on free loopback ports, the job
is submitted with `--runner=PortableRunner`, and its shards and counters must equal the local
runner's (the session corpus, built on `FnApiRunner`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.manifest import read_manifest
from repo_paths import BOOKS, REPO, VOCAB, WIKI_DUMP

# A healthy submission takes ~30-60 s on a busy 2-core machine. A pool whose workers cannot start
# would leave the client waiting ~300 s for a DEADLINE_EXCEEDED that names no cause: a worker's
# traceback in the pool's log fails the test at once, and anything else fails at the timeout.
SUBMIT_TIMEOUT_S = 180
WORKER_CRASH = b"Traceback (most recent call last)"
START_TIMEOUT_S = 60
# The same settings as the session corpus (tests/conftest.py `small_corpus`).
SMALL_CORPUS_SETTINGS = dict(seq_len=64, max_predictions=10, dupe_factor=1, seed=1234, num_shards=2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _tail(path: Path, n: int = 3000) -> str:
    return path.read_bytes()[-n:].decode("utf-8", errors="replace") if path.exists() else "(no log)"


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL, to the whole process group: the pool's SDK workers are in it."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


class PortableServices:
    """A job service and an EXTERNAL worker pool, each in its own process group, logs in `logs`."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.procs: list[subprocess.Popen] = []
        # The pool starts each SDK worker as a bare `python`: it must be this venv's interpreter.
        self.env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                    "PYTHONPATH": str(REPO)}

    def _start(self, name: str, argv: list[str]) -> subprocess.Popen:
        with open(self.logs / f"{name}.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", *argv], stdout=log, stderr=subprocess.STDOUT,
                                    cwd=REPO, env=self.env, start_new_session=True)
        self.procs.append(proc)
        return proc

    def _wait_until(self, ready, proc: subprocess.Popen, name: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{name} did not start (exit code {proc.poll()}):\n{_tail(self.logs / f'{name}.log')}")
            time.sleep(0.2)

    def start(self) -> None:
        port_file = self.logs / "job_service.port"
        job = self._start("job_service", ["apache_beam.runners.portability.local_job_service_main",
                                          "--port=0", f"--port_file={port_file}"])
        self._wait_until(port_file.exists, job, "job_service")
        self.job_endpoint = f"localhost:{int(port_file.read_text())}"
        pool_port = _free_port()
        pool = self._start("worker_pool", ["apache_beam.runners.worker.worker_pool_main", f"--service_port={pool_port}"])
        self._wait_until(lambda: _accepts(pool_port), pool, "worker_pool")
        self.pool_endpoint = f"localhost:{pool_port}"

    def stop(self) -> None:
        for proc in reversed(self.procs):
            _stop(proc)

    def beam_args(self) -> list[str]:
        return ["--runner=PortableRunner", f"--job_endpoint={self.job_endpoint}", "--environment_type=EXTERNAL",
                f"--environment_config={self.pool_endpoint}"]


@pytest.fixture(scope="module")
def portable_services(tmp_path_factory):
    services = PortableServices(tmp_path_factory.mktemp("portable-logs"))
    try:
        services.start()
        yield services
    finally:
        services.stop()


def _submit(services: PortableServices, out: Path) -> None:
    """Run the corpus job in a child process, killed (with the services' logs shown) past the timeout."""
    settings = ", ".join(f"{k}={v!r}" for k, v in SMALL_CORPUS_SETTINGS.items())
    code = (
        "import sys\n"
        "from pipeline.corpus_job import CorpusConfig, run\n"
        f"run(CorpusConfig(inputs={[str(BOOKS[1]), str(WIKI_DUMP)]!r}, out={str(out)!r}, vocab={str(VOCAB)!r}, {settings}),"
        " sys.argv[1:])\n"
    )
    log = services.logs / "submit.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-c", code, *services.beam_args()], stdout=f, stderr=subprocess.STDOUT,
                                cwd=REPO, env=services.env, start_new_session=True)
        deadline = time.monotonic() + SUBMIT_TIMEOUT_S
        while proc.poll() is None:
            crashed = WORKER_CRASH in (services.logs / "worker_pool.log").read_bytes()
            if crashed or time.monotonic() > deadline:
                _stop(proc)
                why = "an SDK worker crashed" if crashed else f"the job did not finish in {SUBMIT_TIMEOUT_S} s"
                pytest.fail(f"portable run: {why}; can the pool start `python` workers with apache_beam and this "
                            f"repo?\nworker pool log:\n{_tail(services.logs / 'worker_pool.log')}\n"
                            f"job service log:\n{_tail(services.logs / 'job_service.log')}\nclient log:\n{_tail(log)}")
            time.sleep(1)
    assert proc.returncode == 0, f"the portable job failed:\n{_tail(log, 6000)}"


@pytest.mark.slow
def test_portable_runner_with_external_workers_matches_local_runner(small_corpus, portable_services, tmp_path):
    assert BOOKS[1].name == "persuasion.txt"  # the session corpus's book
    out = tmp_path / "portable"
    _submit(portable_services, out)
    local, portable = read_manifest(small_corpus), read_manifest(out)
    assert [(s["path"], s["sha256"]) for s in portable["shards"]] == [(s["path"], s["sha256"]) for s in local["shards"]]
    for shard in portable["shards"]:
        assert (out / shard["path"]).read_bytes() == (small_corpus / shard["path"]).read_bytes()
    assert portable["counters"] == local["counters"]
    assert portable["counters"]["instances"] > 1000
    # The work really ran in the pool's SDK worker processes, not in the client.
    assert "Starting worker with command" in (portable_services.logs / "worker_pool.log").read_text(errors="replace")
