"""Shard verification speed: what `pretrain`'s preflight and `corpus inspect --verify` cost on 1 GB.

Ours: `pipeline.manifest.verify_shards` (every shard's sha256 against manifest.json, shards hashed in
parallel threads, min(8, cpu_count, shards) of them). Peer, measured in the same run on the same
files: coreutils `sha256sum`, given the same parallelism (the shards split round-robin over N
concurrent `sha256sum` processes, N = our thread count). Also a 1-thread comparison: ours with
threads=1 against one `sha256sum` process over all shards (what a user would run by hand). Each pair
is timed interleaved (peer, ours, peer, ours, ...); figures are the best of --repeats.

  python bench/shard_verify.py [--gib 1.0] [--shards 16] [--repeats 3]

The shards are real Arrow shards of the bundled data, copied until the corpus reaches --gib; the
files are freshly written, so both sides read them from the page cache: this measures hashing,
the part that would burden start-up (a cold disk adds its own read time to both sides alike).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.manifest import sha256_file, verify_shards  # noqa: E402


def build(root: Path, gib: float, shards: int) -> dict:
    """A corpus directory of `shards` files totalling about `gib` GiB, with a manifest listing their sha256."""
    seed = root / "seed"
    subprocess.run([sys.executable, "-m", "launch.cli", "corpus", "--input", str(REPO / "data" / "books"),
                    "--vocab", str(REPO / "data" / "vocab" / "bert-base-uncased-vocab.txt"), "--out", str(seed),
                    "--seq-len", "128", "--dupe-factor", "1", "--num-shards", "1", "--progress-seconds", "0"],
                   check=True, capture_output=True, cwd=REPO)
    manifest = json.loads((seed / "manifest.json").read_text())
    block = (seed / manifest["shards"][0]["path"]).read_bytes()
    per_shard = int(gib * (1 << 30)) // shards
    corpus = root / "corpus"
    corpus.mkdir()
    entries = []
    for i in range(shards):
        path = corpus / f"train-{i:05d}-of-{shards:05d}.arrow"
        with open(path, "wb") as f:
            written = 0
            while written < per_shard:
                f.write(block)
                written += len(block)
        entries.append({"path": path.name, "split": "train", "num_instances": 0, "sha256": sha256_file(path)})
    return {"shards": entries, "dir": corpus, "bytes": sum((corpus / e["path"]).stat().st_size for e in entries)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bertpipe-bench-verify-") as tmp:
        corpus = build(Path(tmp), args.gib, args.shards)
        files = [str(corpus["dir"] / e["path"]) for e in corpus["shards"]]
        threads = min(8, os.cpu_count() or 1, max(1, len(files)))  # verify_shards' default
        manifest = {"shards": corpus["shards"]}

        def peer_parallel(n: int) -> None:
            procs = [subprocess.Popen(["sha256sum", *files[i::n]], stdout=subprocess.DEVNULL) for i in range(n)]
            if any(p.wait() != 0 for p in procs):
                raise RuntimeError("sha256sum failed")

        pairs = [(f"{threads} threads", threads, lambda: verify_shards(corpus["dir"], manifest, threads=threads),
                  f"{threads} sha256sum processes", lambda: peer_parallel(threads)),
                 ("1 thread", 1, lambda: verify_shards(corpus["dir"], manifest, threads=1),
                  "1 sha256sum process", lambda: peer_parallel(1))]
        gib = corpus["bytes"] / (1 << 30)
        print(f"corpus: {gib:.2f} GiB in {args.shards} shards; {os.cpu_count()} CPUs; best of {args.repeats}, "
              "interleaved")
        for label, _, ours_fn, peer_label, peer_fn in pairs:
            ours, peer = [], []
            for _ in range(args.repeats):  # interleaved, so both see the same machine load
                start = time.perf_counter()
                peer_fn()
                peer.append(time.perf_counter() - start)
                start = time.perf_counter()
                ours_fn()
                ours.append(time.perf_counter() - start)
            best_ours, best_peer = min(ours), min(peer)
            print(f"  {'verify_shards, ' + label:<34} {best_ours:6.2f} s  {gib / best_ours:6.2f} GiB/s")
            print(f"  {'coreutils, ' + peer_label:<34} {best_peer:6.2f} s  {gib / best_peer:6.2f} GiB/s")
            print(f"  ratio ours/peer speed ({label}): {best_peer / best_ours:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
