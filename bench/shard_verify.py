"""Shard verification speed: what `pretrain`'s preflight and `corpus inspect --verify` cost on 1 GB.

Ours: `pipeline.manifest.verify_shards` (every shard's sha256 against manifest.json, shards hashed in
parallel threads). Peer, measured in the same run on the same files: coreutils `sha256sum` over all
shards in one process (what a user would run by hand).

  python bench/shard_verify.py [--gib 1.0] [--shards 16] [--repeats 3]

The shards are real Arrow shards of the bundled data, copied until the corpus reaches --gib; the
files are freshly written, so both sides read them from the page cache: this measures hashing,
the part that would burden start-up (a cold disk adds its own read time to both sides alike).
"""

from __future__ import annotations

import argparse
import json
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
        ours, peer = [], []
        for _ in range(args.repeats):  # interleaved, so both see the same machine load
            start = time.perf_counter()
            subprocess.run(["sha256sum", *files], check=True, capture_output=True)
            peer.append(time.perf_counter() - start)
            start = time.perf_counter()
            verify_shards(corpus["dir"], {"shards": corpus["shards"]})
            ours.append(time.perf_counter() - start)
        gib = corpus["bytes"] / (1 << 30)
        best_ours, best_peer = min(ours), min(peer)
        print(f"corpus: {gib:.2f} GiB in {args.shards} shards; best of {args.repeats}")
        print(f"  {'verify_shards (ours, threads)':<34} {best_ours:6.2f} s  {gib / best_ours:6.2f} GiB/s")
        print(f"  {'sha256sum (coreutils, 1 process)':<34} {best_peer:6.2f} s  {gib / best_peer:6.2f} GiB/s")
        print(f"  ratio ours/peer speed: {best_peer / best_ours:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
