"""Corpus job throughput against bare `tokenizers`, and peak memory at 1x and 4x the input.

    .venv/bin/python bench/corpus_throughput.py [--copies 4] [--threads N] [--workers 1] [--masking-only]

Measured in the same run on the same text:
- job: `bertpipe corpus` end to end (read, wikitext parse, sentences, WordPiece, NSP instances,
  masking, shards), in a fresh process per run, tokens/s = tokens counted by the job / wall time;
- peer: HF `tokenizers` `encode_batch` over the same sentences (already read and split), the
  floor any WordPiece pipeline pays; warmed up with one untimed call (its first is ~20% slower);
- job and peer timed `--repeats` times (default 5), interleaved job, peer, job, peer...; medians;
- peak memory of the job at 1x and Nx the input (N copies of every file, new document ids): the
  summed RSS of the job's process and its children, sampled every 20 ms (and the kernel's peak RSS
  of the job's own process);
- the reference `create_pretraining_data.py` (google-research/bert) is listed but not run: it needs
  TensorFlow, which this project does not install (issue 12 measured it at 75k tokens/s);
- per-sample masking at seq 128 (the loader's dynamic re-masking): `mask_tokens` against a
  transcription of google-research/bert's per-token Python loop.
Prints a table and the ratios. Both sides get the same cores (`--threads`, default all of them):
the tokenizer's thread pool on both, plus `--workers` local Beam worker processes for the job.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
INPUTS = [DATA / "wiki" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
          DATA / "books" / "persuasion.txt", DATA / "books" / "northangerabbey.txt"]
VOCAB = DATA / "vocab" / "bert-base-uncased-vocab.txt"


def _child(out: str, inputs: list[str], workers: int) -> None:
    """Run the job in this (fresh) process and print its tokens, seconds and peak RSS as JSON."""
    from pipeline.corpus_job import CorpusConfig, run

    cfg = CorpusConfig(inputs=inputs, out=out, vocab=str(VOCAB), seq_len=128, dupe_factor=1, seed=1,
                       instances_per_shard=5000)
    beam_args = [f"--direct_num_workers={workers}"] if workers > 1 else []
    start = time.perf_counter()
    result = run(cfg, beam_args)
    seconds = time.perf_counter() - start
    rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({"tokens": result.manifest["counters"]["tokens"], "seconds": seconds,
                      "instances": result.manifest["num_instances"], "peak_rss_mb": max(rss_self, rss_children) / 1024}))


def _tree_rss_mb(root: int) -> float:
    """Summed RSS of `root` and its descendants, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/statm") as f:
                rss[int(entry)] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):  # the process ended meanwhile
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total / 2**20


def run_job(inputs: list[Path], workers: int, threads: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bertpipe-bench-") as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RAYON_NUM_THREADS": str(threads)}
        with open(Path(tmp) / "stdout", "w+") as out, open(Path(tmp) / "stderr", "w+") as err:
            proc = subprocess.Popen(
                [sys.executable, __file__, "--child", str(Path(tmp) / "out"), str(workers), *map(str, inputs)],
                env=env, stdout=out, stderr=err, text=True,
            )
            peak_tree = 0.0
            while proc.poll() is None:
                peak_tree = max(peak_tree, _tree_rss_mb(proc.pid))
                time.sleep(0.02)
            out.seek(0)
            err.seek(0)
            if proc.returncode != 0:
                sys.exit(f"job failed:\n{err.read()[-3000:]}")
            return {**json.loads(out.read().strip().splitlines()[-1]), "peak_tree_mb": peak_tree}


def peer_setup(inputs: list[Path]):
    """The peer's input (sentences, already read and split) and its tokenizer: not timed."""
    from pipeline.readers import RawDocument, ReadStats, read_file
    from pipeline.tokenize import build_tokenizer, split_sentences

    sentences: list[str] = []
    for path in inputs:
        with open(path, "rb") as f:
            for rec in read_file(f, str(path), "auto", 16_000_000, ReadStats()):
                if isinstance(rec, RawDocument):
                    sentences += split_sentences(rec)
    return sentences, build_tokenizer(VOCAB.read_text(encoding="utf-8"), lowercase=True)


def peer_tokens_per_s(sentences: list[str], tok, fast: bool = False) -> tuple[float, int]:
    """One timed `encode_batch` over all sentences (warm the tokenizer up first: its first call is ~20% slower).

    `fast`: `encode_batch_fast` instead (the same ids, no character offsets), which the job calls."""
    encode = tok._tokenizer.encode_batch_fast if fast else tok.encode_batch
    start = time.perf_counter()
    tokens = sum(len(e.ids) for e in encode(sentences, add_special_tokens=False))
    return tokens / (time.perf_counter() - start), tokens


def _original_masking(tokens: list[int], rng, vocab, masked_lm_prob=0.15, max_predictions=20):
    """google-research/bert `create_masked_lm_predictions`, transcribed (Python lists, per token)."""
    special = vocab.is_special
    cand_indexes = [i for i, t in enumerate(tokens) if not special[t]]
    rng.shuffle(cand_indexes)
    output = list(tokens)
    num_to_predict = min(max_predictions, max(1, int(round(len(tokens) * masked_lm_prob))))
    masked = []
    for index in cand_indexes:
        if len(masked) >= num_to_predict:
            break
        if rng.random() < 0.8:
            output[index] = vocab.mask_id
        elif rng.random() < 0.5:
            output[index] = tokens[index]
        else:
            output[index] = int(vocab.random_ids[rng.randint(0, len(vocab.random_ids) - 1)])
        masked.append((index, tokens[index]))
    masked.sort()
    return output, [i for i, _ in masked], [t for _, t in masked]


def masking_rates(n_rows: int = 2000) -> list[tuple[str, str]]:
    """Per-sample masking of seq-128 rows of real text: ours (numpy) vs the original's Python loop."""
    import random

    import numpy as np

    from pipeline.masking import MaskingVocab, mask_tokens
    from pipeline.tokenize import build_tokenizer

    vocab = MaskingVocab.from_vocab_file(VOCAB)
    tok = build_tokenizer(VOCAB.read_text(encoding="utf-8"), lowercase=True)
    ids = tok.encode(INPUTS[1].read_text(encoding="utf-8")[:400_000], add_special_tokens=False).ids
    rows = [np.array([101] + ids[k : k + 62] + [102] + ids[k + 62 : k + 125] + [102], dtype=np.int32)
            for k in range(0, 125 * n_rows, 125)][:n_rows]

    def best_rate(fn) -> float:
        best = 0.0
        for _ in range(3):
            start = time.perf_counter()
            for row in rows:
                fn(row)
            best = max(best, len(rows) / (time.perf_counter() - start))
        return best

    rng = np.random.default_rng(0)
    ours = best_rate(lambda r: mask_tokens(r, rng=rng, vocab=vocab))
    wwm = best_rate(lambda r: mask_tokens(r, rng=rng, vocab=vocab, whole_word_mask=True))
    py_rng = random.Random(0)
    lists = {id(r): r.tolist() for r in rows}
    original = best_rate(lambda r: _original_masking(lists[id(r)], py_rng, vocab))
    return [
        ("mask_tokens samples/s (seq 128)", f"{ours:,.0f}"),
        ("mask_tokens whole-word samples/s", f"{wwm:,.0f}"),
        ("original Python loop samples/s", f"{original:,.0f}"),
        ("ratio mask_tokens / original", f"{ours / original:.2f}"),
    ]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[4:], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=4, help="N for the Nx-input memory run (default 4)")
    parser.add_argument("--workers", type=int, default=1, help="local Beam worker processes (default 1: in-process)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="tokenizer threads, both sides (default: all cores)")
    parser.add_argument("--books-only", action="store_true", help="book text only (no Wikipedia markup to parse)")
    parser.add_argument("--scale", type=int, default=1, help="copies of the input files that make up 1x (default 1)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="interleaved 1x job / peer pairs; the medians are reported (default 5)")
    parser.add_argument("--masking-only", action="store_true", help="only the per-sample masking rates")
    args = parser.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    if args.masking_only:
        _print(masking_rates())
        return

    inputs = INPUTS[1:] if args.books_only else INPUTS
    with tempfile.TemporaryDirectory(prefix="bertpipe-bench-in-") as tmp:
        def copies(n: int) -> list[Path]:
            out = []
            for k in range(n):
                for path in inputs:
                    copy = Path(tmp) / f"copy{k}-{path.name}"
                    if not copy.exists():
                        shutil.copyfile(path, copy)
                    out.append(copy)
            return out

        one_x = copies(args.scale) if args.scale > 1 else inputs
        sentences, tok = peer_setup(one_x)
        peer_tokens_per_s(sentences, tok)  # warm-up, untimed: the tokenizer's first call is ~20% slower
        peer_tokens_per_s(sentences, tok, fast=True)
        runs, peers, fast_peers = [], [], []
        for _ in range(args.repeats):  # interleaved (job, peer, job, peer, ...): both see the same load
            runs.append(run_job(one_x, args.workers, args.threads))
            peers.append(peer_tokens_per_s(sentences, tok))
            fast_peers.append(peer_tokens_per_s(sentences, tok, fast=True)[0])
        n_x = run_job(copies(args.scale * args.copies), args.workers, args.threads)

    job_rates = [r["tokens"] / r["seconds"] for r in runs]
    job_tps, peer = statistics.median(job_rates), statistics.median(p for p, _ in peers)
    peer_tokens = peers[0][1]
    one = sorted(runs, key=lambda r: r["tokens"] / r["seconds"])[len(runs) // 2]  # the median run
    one_peak = statistics.median(r["peak_tree_mb"] for r in runs)
    ratios = sorted(j / p for j, (p, _) in zip(job_rates, peers))
    rows = [
        ("input 1x", f"{'books' if args.books_only else 'wiki dump + books'} x{args.scale} "
                     f"({sum(p.stat().st_size for p in inputs) * args.scale / 1e6:.1f} MB on disk)"),
        ("threads (tokenizer, both sides) / Beam workers", f"{args.threads} / {args.workers}"),
        ("job tokens/s (1x, median of runs)", f"{job_tps:,.0f}  (runs: {', '.join(f'{r:,.0f}' for r in job_rates)})"),
        ("tokenizers encode_batch tokens/s (warm, median)", f"{peer:,.0f}  (runs: {', '.join(f'{p:,.0f}' for p, _ in peers)})"),
        ("ratio job / encode_batch (medians)", f"{job_tps / peer:.3f}  (per interleaved pair {ratios[0]:.3f}-{ratios[-1]:.3f})"),
        # The job calls `encode_batch_fast` (same ids, no offsets): the ratio against it, for reference.
        ("tokenizers encode_batch_fast tokens/s (warm, median)",
         f"{statistics.median(fast_peers):,.0f}  (runs: {', '.join(f'{p:,.0f}' for p in fast_peers)})"),
        ("ratio job / encode_batch_fast (medians)", f"{job_tps / statistics.median(fast_peers):.3f}"),
        # The reference point; running it would mean installing TensorFlow (tensorflow-cpu
        # 2.21 is a 274 MB wheel plus its dependencies) for one row of one benchmark.
        ("google-research/bert create_pretraining_data.py", "not run: needs TensorFlow, not installed by this project"),
        ("tokens (job / peer)", f"{one['tokens']:,} / {peer_tokens:,}"),
        ("instances 1x", f"{one['instances']:,}"),
        ("job seconds 1x (median run)", f"{one['seconds']:.1f}"),
        ("peak memory 1x (MB, process tree, median of runs)", f"{one_peak:.0f}"),
        (f"peak memory {args.copies}x (MB, process tree)", f"{n_x['peak_tree_mb']:.0f}"),
        (f"memory ratio {args.copies}x / 1x", f"{n_x['peak_tree_mb'] / one_peak:.2f}"),
        (f"peak RSS of the job process 1x / {args.copies}x (MB)", f"{one['peak_rss_mb']:.0f} / {n_x['peak_rss_mb']:.0f}"),
        (f"job tokens/s ({args.copies}x)", f"{n_x['tokens'] / n_x['seconds']:,.0f}"),
    ]
    _print(rows + masking_rates())


def _print(rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
