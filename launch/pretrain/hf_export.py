"""Run directory -> Hugging Face model directory, and `resolve_checkpoint` for every consumer.

`export_run(run, out, tag)` consolidates the (possibly ZeRO-partitioned) fp32 master weights of a
checkpoint, loads them into our `BertForPreTraining` (strictly: every tensor accounted for), and
writes `config.json`, `model.safetensors`, `vocab.txt`, `tokenizer.json`, `tokenizer_config.json`
and a model card `README.md`. `resolve_checkpoint(path)` is what `features`, `finetune` and `sweep`
call: an HF directory is returned as is; a RUN directory is exported once into `RUN/export/<tag>/`
(written to a temp folder and renamed, so concurrent callers never see half a model).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from launch.pretrain.checkpoints import read_latest, read_meta
from pipeline.vocab import Vocab

log = logging.getLogger(__name__)

_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def is_hf_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and any((path / f).is_file() for f in _WEIGHT_FILES)


def is_run_dir(path: Path) -> bool:
    return (path / "checkpoints" / "latest").is_file()


def resolve_checkpoint(path: str | Path) -> Path:
    """An HF-format directory for `path`: itself if it is one, else the export of a RUN's latest checkpoint."""
    path = Path(path)
    if is_hf_dir(path):
        return path
    if is_run_dir(path):
        tag = read_latest(path / "checkpoints")
        cached = path / "export" / tag
        if not is_hf_dir(cached):
            export_run(path, cached, tag=tag)
        return cached
    raise ValueError(f"{path} is neither a run directory of `bertpipe pretrain` (no checkpoints/latest) nor a "
                     f"Hugging Face model directory (no config.json + model.safetensors); pass one of those")


def consolidated_state_dict(ckpt_dir: Path, tag: str, meta: dict[str, Any]) -> dict[str, torch.Tensor]:
    """fp32 weights of checkpoint `tag`, whatever the ZeRO stage and world size that wrote it."""
    if meta.get("zero_stage", 0) == 0 and meta.get("precision", "fp32") == "fp32":
        # No ZeRO and fp32: the module state in the model file *is* the master copy.
        state = torch.load(ckpt_dir / tag / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
        return {k: v.float() for k, v in state["module"].items()}
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(ckpt_dir), tag=tag)


def export_run(run_dir: str | Path, out: str | Path, tag: str | None = None) -> Path:
    from model import BertConfig, BertForPreTraining, save_pretrained

    run_dir, out = Path(run_dir), Path(out)
    ckpt_dir = run_dir / "checkpoints"
    if not ckpt_dir.is_dir():
        raise ValueError(f"{run_dir} has no checkpoints/; pass a run directory written by `bertpipe pretrain --out`")
    tag = tag or read_latest(ckpt_dir)
    if tag is None or not (ckpt_dir / tag).is_dir():
        available = sorted(p.name for p in ckpt_dir.glob("global_step*") if p.is_dir())
        raise ValueError(f"no checkpoint {tag!r} in {ckpt_dir}; available: {', '.join(available) or 'none'}")
    meta = read_meta(ckpt_dir, tag)
    vocab_file = ckpt_dir / tag / "vocab.txt"
    vocab = Vocab.read(vocab_file, lowercase=bool(meta.get("corpus", {}).get("lowercase", True)))
    trained = BertConfig(**meta["bert_config"])
    vocab.check_rows(trained.vocab_size, f"checkpoint {ckpt_dir / tag}")
    # `model.vocab_size` larger than the vocabulary pads embedding rows no token id reaches; Hugging
    # Face's config must say the real size (its tokenizer and ours agree on it), so export drops them.
    model = BertForPreTraining(trained.replace(vocab_size=vocab.size))
    state = _trim_vocab_rows(consolidated_state_dict(ckpt_dir, tag, meta), model.config.padded_vocab_size)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"checkpoint {ckpt_dir / tag} does not match the model it records: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        save_pretrained(model, tmp, vocab_file=vocab_file)
        vocab.write_tokenizer_files(tmp, model_max_length=model.config.max_position_embeddings)
        (tmp / "README.md").write_text(_model_card(run_dir, tag, meta), encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("exported %s (%s) to %s", run_dir, tag, out)
    return out


def _trim_vocab_rows(state: dict[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]:
    """The word embeddings and MLM bias cut to `rows` (the tied decoder shares the embedding)."""
    names = [n for n in state if n.endswith(("embeddings.word.weight", "mlm.bias"))]
    if any(state[n].shape[0] > rows for n in names):
        log.info("export: dropping %d padded vocabulary rows (model.vocab_size beyond the vocabulary)",
                 max(state[n].shape[0] for n in names) - rows)
    return {n: t[:rows] if n in names else t for n, t in state.items()}


def _model_card(run_dir: Path, tag: str, meta: dict[str, Any]) -> str:
    cfg, corpus, bert = meta["config"], meta.get("corpus", {}), meta["bert_config"]
    last: dict[str, Any] = {}
    last_eval: dict[str, Any] = {}
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line) if line.strip() else {}
            if rec.get("step", 0) <= meta["step"]:
                last = rec
                if "eval_mlm_accuracy" in rec:
                    last_eval = rec

    def fmt(value: Any) -> str:
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    rows = [("loss", last.get("loss")), ("MLM accuracy (train batch)", last.get("mlm_accuracy")),
            ("NSP accuracy (train batch)", last.get("nsp_accuracy")),
            ("held-out MLM accuracy", last_eval.get("eval_mlm_accuracy")),
            ("held-out NSP accuracy", last_eval.get("eval_nsp_accuracy"))]
    table = "\n".join(f"| {name} | {fmt(v)} |" for name, v in rows if v is not None)
    return f"""---
library_name: transformers
tags: [bert, fill-mask, bertpipe]
---
# BERT pre-trained with bertpipe

BERT (`BertForPreTraining`: masked-LM and next-sentence heads) pre-trained with DeepSpeed ZeRO-{meta.get('zero_stage')}
in {meta.get('precision', 'fp32')} by `bertpipe pretrain`, exported from checkpoint `{tag}`.

- Architecture: {bert['num_hidden_layers']} layers, hidden {bert['hidden_size']}, {bert['num_attention_heads']} heads,
  vocabulary {bert['vocab_size']}, {bert['max_position_embeddings']} positions.
- Corpus: `{corpus.get('path')}`, {corpus.get('num_instances')} instances at sequence length {corpus.get('seq_len')}
  (vocab sha256 `{corpus.get('vocab_sha256')}`, lowercase: {corpus.get('lowercase')}).
- Training: {meta['step']} optimizer steps, {meta['position']} samples, global batch {cfg['data']['global_batch_size']},
  optimizer {cfg['optim']['name']} (peak lr {cfg['optim']['lr']}), {meta['world_size']} data-parallel process(es).

## Final metrics (step {last.get('step', meta['step'])})

| metric | value |
|---|---|
{table}

## Use

```python
from transformers import BertForPreTraining, BertTokenizerFast
model = BertForPreTraining.from_pretrained(PATH)
tokenizer = BertTokenizerFast.from_pretrained(PATH)
```
"""
