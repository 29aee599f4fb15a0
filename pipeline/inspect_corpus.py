"""Read a corpus directory back: manifest checks, stats and decoded instances with masks shown."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.corpus_info import open_corpus
from pipeline.manifest import verify_shards


def read_shard(path: str | Path) -> pa.Table:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"shard {path} listed in the manifest is missing; the corpus is incomplete, rebuild it")
    try:
        if path.suffix == ".parquet":
            table = pq.read_table(path)
        else:
            with pa.memory_map(str(path)) as source:
                table = pa.ipc.open_file(source).read_all()
        table.validate(full=True)  # damaged offsets read past the buffers: a segfault, not an exception, later
        return table
    except (pa.ArrowException, OSError) as err:
        raise ValueError(f"shard {path} cannot be read ({err}); it is damaged: restore it or rebuild the corpus "
                         "(`corpus inspect --verify` checks every shard)") from None


def decode_instance(row: dict, vocab: list[str]) -> str:
    """`[CLS] the [MASK]{cat} sat ...`: masked positions show their original token in braces."""
    labels = dict(zip(row["masked_lm_positions"], row["masked_lm_ids"]))
    words = []
    for pos, tok in enumerate(row["input_ids"]):
        text = vocab[tok] if 0 <= tok < len(vocab) else f"<{tok}>"
        if pos in labels:
            original = vocab[labels[pos]] if 0 <= labels[pos] < len(vocab) else f"<{labels[pos]}>"
            text = f"{text}{{{original}}}" if tok != labels[pos] else f"={text}{{kept}}"
        words.append(text)
    return " ".join(words).replace(" ##", "##")


def summary(corpus_dir: str | Path, num_examples: int = 3, verify: bool = False) -> str:
    """The text `bertpipe corpus inspect` prints; `verify` first checks every shard's sha256."""
    corpus = open_corpus(corpus_dir)  # the checks every reader of a corpus makes, the vocabulary's included
    corpus_dir, manifest, vocab = corpus.dir, corpus.manifest, list(corpus.vocab.tokens)
    if verify:
        verify_shards(corpus_dir, manifest)
    lines = [
        f"corpus {corpus_dir}",
        f"  seq_len {manifest['seq_len']}  dupe_factor {manifest.get('dupe_factor', '?')}  seed {manifest.get('seed', '?')}  "
        f"masked_lm_prob {manifest['masked_lm_prob']}  max_predictions {manifest['max_predictions']}  "
        f"whole_word_mask {manifest['whole_word_mask']}  lowercase {manifest['lowercase']}",
        f"  vocab {manifest['vocab_size']} tokens (sha256 {manifest['vocab_sha256'][:12]}...)",
        f"  instances {manifest['num_instances']}",
        *([f"  verified: all {len(manifest['shards'])} shards match their sha256 in manifest.json"] if verify else []),
        "",
        f"  {'shard':<32} {'split':<8} {'instances':>10}  sha256",
    ]
    for shard in manifest["shards"]:
        lines.append(f"  {shard['path']:<32} {shard['split']:<8} {shard['num_instances']:>10}  {shard['sha256'][:16]}")
    counters = manifest.get("counters")
    counters = counters if isinstance(counters, dict) else {}
    lines += ["", "  counters:" + ("" if counters else " (none recorded)")]
    width = max((len(k) for k in counters), default=10)
    lines += [f"    {k:<{width}}  {v:>12,}" if isinstance(v, int) else f"    {k:<{width}}  {v!r:>12}"
              for k, v in counters.items()]
    train = [s for s in manifest["shards"] if s["split"] == "train" and s["num_instances"]]
    if train and num_examples > 0:
        table = read_shard(corpus_dir / train[0]["path"])
        lengths = np.asarray(table.column("length").to_numpy())
        nsp = np.asarray(table.column("next_sentence_label").to_numpy())
        lines += [
            "",
            f"  {train[0]['path']}: mean length {lengths.mean():.1f}, random-next share {nsp.mean():.3f}",
            "  examples ([MASK]{original}, random{original}, ={kept} tokens):",
        ]
        for row in table.slice(0, num_examples).to_pylist():
            lines.append(f"  - doc {row['doc_id']}  next_sentence_label {row['next_sentence_label']}")
            lines.append("    " + decode_instance(row, vocab))
    return "\n".join(lines)
