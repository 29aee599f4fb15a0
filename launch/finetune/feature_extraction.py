"""Contextual features from a BERT checkpoint: the paper's feature-based approach (its Table 7).

Every row of Table 7 is a `layers` choice: `embeddings`, `second-to-last`, `last`, `last4-weighted`,
`last4-concat`, `all-weighted` (the paper's weighted sums: scalar weights learned with the task, as
in ELMo, so only `finetune --feature-based` takes them), the plain sums `last4-sum` and `all-sum`, or
explicit indices `N[,M...]` (0 = embeddings, 1..L = encoder layers, negative counts from the last;
several are concatenated).
`pool` chooses one vector per text (`cls`, masked `mean`) or per-token vectors (`none`).

Shape legend: B batch, L length, H hidden, F feature width (H, or kH for concatenations).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal, Sequence

import numpy as np
import torch

from launch.finetune.device import pick_device
from launch.finetune.finetune_config import FeaturesConfig, layers_error
from model import BertModel, load_pretrained
from pipeline.vocab import Vocab, check_embedding_rows

logger = logging.getLogger(__name__)



@dataclass
class LayerSelection:
    indices: list[int]  # into hidden_states: 0 = embeddings, i = output of layer i
    combine: Literal["concat", "sum", "weighted"]  # weighted: softmax-normalised weights learned by a head


def parse_layers(spec: str, num_layers: int) -> LayerSelection:
    """A `--layers` value -> which hidden states to take and how to combine them."""
    spec = spec.strip()
    last = num_layers
    named = {
        "embeddings": ([0], "concat"),
        "last": ([last], "concat"),
        "second-to-last": ([last - 1], "concat"),
        "last4-concat": (list(range(last - 3, last + 1)), "concat"),
        "last4-sum": (list(range(last - 3, last + 1)), "sum"),
        "all-sum": (list(range(1, last + 1)), "sum"),
        "last4-weighted": (list(range(last - 3, last + 1)), "weighted"),
        "all-weighted": (list(range(1, last + 1)), "weighted"),
    }
    if spec in named:
        indices, combine = named[spec]
        if min(indices) < 0 or (spec.startswith("last4") and num_layers < 4):
            raise ValueError(f"--layers {spec} needs at least 4 layers; the model has {num_layers}")
        return LayerSelection(indices, combine)  # type: ignore[arg-type]
    unreadable = layers_error(spec)
    if unreadable:
        raise ValueError(unreadable)
    raw = [int(p) for p in spec.split(",") if p.strip()]
    indices = []
    for i in raw:
        j = i + last + 1 if i < 0 else i
        if not 0 <= j <= last:
            raise ValueError(f"--layers: layer {i} is out of range; the model has layers 0 (embeddings) to {last}")
        if j in indices:  # `1,1` or `-1,2` on a 2-layer model: the same layer twice, surely a typo
            raise ValueError(f"--layers {spec}: layer {j} is named twice; name each layer once")
        indices.append(j)
    return LayerSelection(indices, "concat")


def check_layers_fit(checkpoint: str | Path, specs: Sequence[str]) -> None:
    """Refuse `--layers` choices the checkpoint lacks (last4-* on a 2-layer model), before a sweep
    starts Ray. A checkpoint path this machine cannot see (a remote cluster's) is left to the trials."""
    from launch.export_dirs import resolve_checkpoint

    if not Path(checkpoint).is_dir():
        return
    hf_dir = resolve_checkpoint(checkpoint)  # a RUN's export is made once here and reused by the trials
    num_layers = int(json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))["num_hidden_layers"])
    for spec in dict.fromkeys(specs):
        parse_layers(spec, num_layers)


def read_texts(path: Path, text_field: str = "text") -> list[str]:
    """`.txt`: one text per line (blank lines kept, so rows match lines); `.jsonl`: a `text_field` per line."""
    if not path.is_file():
        raise ValueError(f"input {path} is a directory; pass one .txt or .jsonl file" if path.is_dir()
                         else f"input {path} is not a regular file (a pipe or a device); pass one .txt or .jsonl "
                              "file" if path.exists() else f"input file {path} does not exist")
    try:
        # Lines end at \n, \r\n or \r only, as `wc -l` and editors count them: str.splitlines also cuts at
        # form feeds, \x1c-\x1e, U+0085 and U+2028/9 (a JSON string may hold those raw), and every row after
        # one would belong to the wrong line. utf-8-sig: a byte-order mark is not part of the first text.
        with open(path, encoding="utf-8-sig") as f:
            lines = [line.removesuffix("\n") for line in f]
    except UnicodeDecodeError as err:
        raise ValueError(f"input file {path} is not UTF-8 text ({err.reason} at byte {err.start}); "
                         "convert it to UTF-8") from None
    if path.suffix == ".jsonl":
        texts = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                raise ValueError(f"{path}:{n}: blank line; every line of a .jsonl input must be a JSON object")
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n}: not valid JSON ({err.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
                raise ValueError(f"{path}:{n}: no string field {text_field!r} (choose the field with --text-field)")
            texts.append(record[text_field])
        return texts
    if path.suffix != ".txt":
        raise ValueError(f"input {path} must end in .txt (one text per line) or .jsonl (one JSON object per line)")
    empty = sum(1 for t in lines if not t.strip())
    if empty:
        logger.warning("%s: %d blank lines kept as empty texts so that output rows match input lines", path, empty)
    return lines


def load_tokenizer(checkpoint: Path, max_seq_len: int):
    """The checkpoint's vocab.txt with its casing (`pipeline.vocab`: tokenizer_config.json's
    do_lower_case, else the vocabulary's own), truncating to `max_seq_len`."""
    tok = Vocab.read(checkpoint).tokenizer()
    tok.enable_truncation(max_length=max_seq_len)
    return tok


@dataclass
class FeatureBatch:
    rows: list[int]  # input row of each text
    vectors: list[np.ndarray]  # pooled: [F] each; none: [tokens, F] each
    tokens: list[list[str]] | None  # pool=none only


class FeatureExtractor:
    def __init__(self, checkpoint: Path, cfg: FeaturesConfig) -> None:
        self.cfg = cfg
        self.device = pick_device(cfg.device)
        self.model, report = load_pretrained(BertModel, checkpoint, config_overrides={"unpad": True})
        self.model.to(self.device).eval()
        if cfg.dtype == "bf16":
            self.model.to(torch.bfloat16)
        self.max_len = min(cfg.max_seq_len, self.model.config.max_position_embeddings)
        self.tokenizer = load_tokenizer(checkpoint, self.max_len)
        check_embedding_rows(self.tokenizer.get_vocab_size(), self.model.config.vocab_size,
                             vocab=str(checkpoint / "vocab.txt"), model=f"checkpoint {checkpoint}")
        self.layers = parse_layers(cfg.layers, self.model.config.num_hidden_layers)
        if self.layers.combine == "weighted":
            raise ValueError(f"--layers {cfg.layers}: its weights are learned with a task; use `bertpipe finetune "
                             f"--feature-based --layers {cfg.layers}`, or the plain sum {cfg.layers.replace('weighted', 'sum')}")
        self.truncated = 0

    @property
    def width(self) -> int:
        h = self.model.config.hidden_size
        return h * len(self.layers.indices) if self.layers.combine == "concat" else h

    def _combine(self, hidden: tuple[torch.Tensor, ...]) -> torch.Tensor:
        picked = [hidden[i] for i in self.layers.indices]
        if self.layers.combine == "sum":
            return torch.stack(picked).sum(0)
        return torch.cat(picked, dim=-1)

    @torch.no_grad()
    def batches(self, texts: list[str]) -> Iterator[FeatureBatch]:
        """Feature batches; texts are length-sorted within windows (less padding), rows say where each goes."""
        bs = self.cfg.batch_size
        window = 64 * bs
        for start in range(0, len(texts), window):
            chunk = texts[start:start + window]
            # A word is what whitespace separates, as in CoNLL files and fine-tuning's labels; by the tokenizer's
            # own word ids `U.S.` was four words and `Jean-Pierre` three, each with a vector.
            encodings = (self.tokenizer.encode_batch([t.split() for t in chunk], is_pretokenized=True)
                         if self.cfg.first_subtoken else self.tokenizer.encode_batch(chunk))
            order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
            for b in range(0, len(order), bs):
                idx = order[b:b + bs]
                yield self._run([encodings[i] for i in idx], [start + i for i in idx])

    def _run(self, encodings, rows: list[int]) -> FeatureBatch:
        self.truncated += sum(1 for e in encodings if e.overflowing)
        length = max(len(e.ids) for e in encodings)
        ids = torch.zeros(len(encodings), length, dtype=torch.long)
        types = torch.zeros_like(ids)
        mask = torch.zeros_like(ids)
        for i, e in enumerate(encodings):
            n = len(e.ids)
            ids[i, :n] = torch.tensor(e.ids)
            types[i, :n] = torch.tensor(e.type_ids)
            mask[i, :n] = 1
        ids, types, mask = (t.to(self.device) for t in (ids, types, mask))
        out = self.model(ids, types, mask, output_hidden_states=True)
        feats_BLF = self._combine(out.hidden_states).float()
        pool = self.cfg.pool
        if pool == "cls":
            return FeatureBatch(rows, list(feats_BLF[:, 0].cpu().numpy()), None)
        if pool == "mean":
            m = mask.unsqueeze(-1).to(feats_BLF.dtype)
            mean_BF = (feats_BLF * m).sum(1) / m.sum(1).clamp(min=1.0)
            return FeatureBatch(rows, list(mean_BF.cpu().numpy()), None)
        feats = feats_BLF.cpu().numpy()
        vectors, tokens = [], []
        for i, e in enumerate(encodings):
            n = len(e.ids)
            keep = list(range(n))
            if self.cfg.first_subtoken:
                keep, prev = [], None
                for j, w in enumerate(e.word_ids):
                    if w is not None and w != prev:
                        keep.append(j)
                    prev = w
            vectors.append(feats[i, keep])
            tokens.append([e.tokens[j] for j in keep])
        return FeatureBatch(rows, vectors, tokens)


def write_pooled(extractor: FeatureExtractor, texts: list[str], out: Path, progress) -> Path:
    matrix = np.zeros((len(texts), extractor.width), dtype=np.float32)
    for batch in extractor.batches(texts):
        for row, vec in zip(batch.rows, batch.vectors):
            matrix[row] = vec
        progress(len(batch.rows))
    with open(out, "wb") as f:  # a file object: np.save would append .npy to a path lacking it
        np.save(f, matrix)
    return out


def write_tokens(extractor: FeatureExtractor, texts: list[str], out: Path, progress) -> Path:
    """Per-token vectors to Parquet, one row per text in input order: row, tokens, features [n, F]."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    width = extractor.width
    schema = pa.schema([
        ("row", pa.int64()),
        ("tokens", pa.list_(pa.string())),
        ("features", pa.list_(pa.list_(pa.float32(), width))),
    ])
    pending: dict[int, tuple[list[str], np.ndarray]] = {}
    next_row = 0
    with pq.ParquetWriter(out, schema) as writer:
        for batch in extractor.batches(texts):
            for row, vec, toks in zip(batch.rows, batch.vectors, batch.tokens or []):
                pending[row] = (toks, vec)
            progress(len(batch.rows))
            # Rows are sorted by length inside a window; emit the in-order prefix as it completes.
            ready = []
            while next_row in pending:
                ready.append((next_row, *pending.pop(next_row)))
                next_row += 1
            if ready:
                writer.write_table(_token_table(ready, schema, width))
    assert not pending, "every row is written exactly once"
    return out


def _token_table(items, schema, width: int):
    import pyarrow as pa

    rows = [r for r, _, _ in items]
    tokens = [t for _, t, _ in items]
    offsets = np.cumsum([0] + [v.shape[0] for _, _, v in items]).astype(np.int32)
    flat = np.concatenate([v.reshape(-1) for _, _, v in items]).astype(np.float32) if items else np.zeros(0, np.float32)
    inner = pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), width)
    features = pa.ListArray.from_arrays(pa.array(offsets), inner)
    return pa.Table.from_arrays([pa.array(rows, pa.int64()), pa.array(tokens, pa.list_(pa.string())), features], schema=schema)
