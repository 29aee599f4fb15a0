"""Downloader throughput on loopback: `pipeline.download.http.fetch` vs. a plain urllib copy.

Serves one file of random bytes from a local `http.server` and times, in the same run:
  peer         urllib.urlopen + shutil.copyfileobj to disk (no resume, no verification)
  peer+sha1    the same, then a separate sha1 pass over the file (what a download script does)
  fetch        ours as `download wikipedia` runs it: .part file, sha1 hashed while writing, progress
               accounting, size + sha1 check, atomic rename
  fetch+sha256 ours as `download books` runs it (also a sha256 for the manifest)
and prints each one's MiB/s and the ratio of ours to each peer (time ratio; > 1 = slower).
Loopback takes the network out, so this measures the client's overhead, not a mirror's speed.

    .venv/bin/python bench/download_throughput.py [--mib 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import shutil
import statistics
import tempfile
import threading
import time
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from pipeline.download.http import ByteProgress, RetryPolicy, fetch


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def _peer(url: str, dest: Path) -> None:
    with urllib.request.urlopen(url) as resp, open(dest, "wb") as f:
        shutil.copyfileobj(resp, f, 1 << 20)


def _peer_sha1(url: str, dest: Path) -> None:
    _peer(url, dest)
    h = hashlib.sha1()
    with open(dest, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)


def _ours(url: str, dest: Path, size: int, sha1: str, extra: tuple[str, ...]) -> None:
    progress = ByteProgress(size, enabled=False)
    fetch(url, dest, expected_size=size, checksums={"sha1": sha1}, policy=RetryPolicy(max_retries=0),
          progress=progress, extra_digests=extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=256, help="file size in MiB (default 256)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per contender; the median is reported")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-download-") as tmp:
        root = Path(tmp)
        served, out = root / "served", root / "out"
        served.mkdir()
        out.mkdir()
        data = os.urandom(args.mib << 20)
        (served / "file.bin").write_bytes(data)
        sha1, size = hashlib.sha1(data).hexdigest(), len(data)
        del data
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(served)))
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{httpd.server_address[1]}/file.bin"
        contenders = {
            "peer": lambda dest: _peer(url, dest),
            "peer+sha1": lambda dest: _peer_sha1(url, dest),
            "fetch": lambda dest: _ours(url, dest, size, sha1, ()),
            "fetch+sha256": lambda dest: _ours(url, dest, size, sha1, ("sha256",)),
        }
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(args.repeats):
            for name, run in contenders.items():  # interleaved so drift hits all alike
                dest = out / f"{name}.bin"
                dest.unlink(missing_ok=True)
                start = time.perf_counter()
                run(dest)
                times[name].append(time.perf_counter() - start)
                dest.unlink()
        httpd.shutdown()

    median = {name: statistics.median(t) for name, t in times.items()}
    print(f"loopback download of {args.mib} MiB, median of {args.repeats}:")
    for name, seconds in median.items():
        print(f"  {name:<12} {seconds:7.3f} s  {args.mib / seconds:8.1f} MiB/s")
    print(f"ratio fetch / peer      = {median['fetch'] / median['peer']:.2f}  (ours also verifies the sha1)")
    print(f"ratio fetch / peer+sha1 = {median['fetch'] / median['peer+sha1']:.2f}  (same work: download and verify sha1)")


if __name__ == "__main__":
    main()
