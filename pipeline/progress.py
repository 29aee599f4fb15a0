"""Progress of a running corpus job: workers write small count files, the driver prints their sum.

Beam's counters reach the driver only when a local job ends, so a long run would print nothing.
Instead each DoFn instance writes its running counts to `DIR/<stage>-<uuid>.json` (replaced
atomically, at most every `WRITE_EVERY_S` seconds and at the end of each bundle), and a thread on
the driver sums the files into one log line. That works wherever the workers share the driver's
file system (the local runners, a portable job service with a worker pool on the same machine);
on a cluster, the runner's UI shows the job's counters instead, and no files are written for a
remote `--out`. Progress never touches the output: the final counts come from Beam's metrics.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid

log = logging.getLogger(__name__)

WRITE_EVERY_S = 1.0
FIELDS = ("documents", "sentences", "tokens", "instances")


def local_progress_dir(tmp_dir: str) -> str | None:
    """Where workers write progress: under the job's temp dir when it is a local path, else None."""
    return None if "://" in tmp_dir else os.path.join(tmp_dir, "progress")


class ProgressWriter:
    """One DoFn instance's running counts; a no-op when `directory` is None."""

    def __init__(self, directory: str | None, stage: str):
        self.path = os.path.join(directory, f"{stage}-{uuid.uuid4().hex}.json") if directory else None
        self.counts = dict.fromkeys(FIELDS, 0)
        self.written_at = 0.0

    def add(self, **counts: int) -> None:
        for name, value in counts.items():
            self.counts[name] += value
        if self.path and time.monotonic() - self.written_at >= WRITE_EVERY_S:
            self.flush()

    def flush(self) -> None:
        if not self.path:
            return
        self.written_at = time.monotonic()
        try:
            # Never re-created here: the driver makes it, and deletes it with the job's temp dir, and a
            # worker's teardown flush after that (portable runners tear down late) would put it back.
            tmp = f"{self.path}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(self.counts, f)
            os.replace(tmp, self.path)
        except OSError as err:  # progress is best effort; a full disk must not fail the job here
            log.debug("progress file %s not written: %s", self.path, err)


def read_progress(directory: str) -> dict[str, int]:
    totals = dict.fromkeys(FIELDS, 0)
    try:
        names = [n for n in os.listdir(directory) if n.endswith(".json")]
    except OSError:
        return totals
    for name in names:
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                counts = json.load(f)
        except (OSError, ValueError):  # replaced or removed while being read: next time
            continue
        for field in FIELDS:
            totals[field] += int(counts.get(field, 0))
    return totals


def format_progress(counts: dict[str, int], seconds: float) -> str:
    rate = counts["tokens"] / seconds if seconds > 0 else 0.0
    return (f"progress: {counts['documents']:,} documents, {counts['sentences']:,} sentences, "
            f"{counts['tokens']:,} tokens ({rate:,.0f} tokens/s), {counts['instances']:,} instances, {seconds:.0f} s")


class ProgressReporter:
    """A driver thread that logs the workers' summed progress every `every_s` seconds while running."""

    def __init__(self, directory: str | None, every_s: float):
        self.directory = directory
        self.every_s = every_s
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.start_time = time.monotonic()

    def __enter__(self) -> ProgressReporter:
        if self.directory:
            os.makedirs(self.directory, exist_ok=True)  # the workers only write into it
        if self.directory and self.every_s > 0:
            self.thread = threading.Thread(target=self._run, name="corpus-progress", daemon=True)
            self.thread.start()
        return self

    def _run(self) -> None:
        last = None
        while not self.stop_event.wait(self.every_s):
            counts = read_progress(self.directory)
            if counts != last:  # quiet while a stage without counts runs (shuffles, shard writing)
                log.info(format_progress(counts, time.monotonic() - self.start_time))
                last = counts

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join()
