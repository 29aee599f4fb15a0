"""A run's DeepSpeed checkpoint -> Hugging Face model files, reading DeepSpeed's files safely.

`write_export(ckpt_dir, tag, meta, dest, run_dir)` consolidates the (possibly ZeRO-partitioned) fp32
master weights of one checkpoint, loads them into our `BertForPreTraining` (strictly: every tensor
accounted for), and writes `config.json`, `model.safetensors`, `vocab.txt`, `tokenizer.json`,
`tokenizer_config.json` and a model card `README.md` into `dest`. Which checkpoint, and where the
files may go, is decided by `launch.export_dirs` (`export_run`, `resolve_checkpoint`).

Reading DeepSpeed's `.pt` files: `torch.load(weights_only=True)` with an allow-list of the few
DeepSpeed classes they hold (`DEEPSPEED_SAFE_GLOBALS`): ours through `load_checkpoint_file`
(`model.torch_files.load_torch_file`), DeepSpeed's own loads (which pass `weights_only=False`) inside
`safe_deepspeed_loads()`, which sets torch's `TORCH_FORCE_WEIGHTS_ONLY_LOAD` switch (read at every
`torch.load`) for their duration. This module imports DeepSpeed only when it consolidates ZeRO shards.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import pickle
from pathlib import Path
from typing import Any, Iterator
from unittest import mock

import torch

from launch.environ import restoring_environ
from launch.pretrain.training_log import read_records
from model.torch_files import load_torch_file
from pipeline.vocab import Vocab

log = logging.getLogger(__name__)

# The only non-tensor classes DeepSpeed's checkpoint files hold (ZeRO 0-3, fp32/bf16, universal; listed
# by torch.serialization.get_unsafe_globals_in_checkpoint): plain records, safe to rebuild from a file.
DEEPSPEED_SAFE_GLOBALS = (
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
)
FORCE_WEIGHTS_ONLY, NO_FORCE_WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


def deepspeed_safe_globals() -> tuple[Any, ...]:
    """The classes `DEEPSPEED_SAFE_GLOBALS` names (those this DeepSpeed version has)."""
    found = []
    for dotted in DEEPSPEED_SAFE_GLOBALS:
        module, _, name = dotted.rpartition(".")
        cls = getattr(importlib.import_module(module), name, None)
        if cls is not None:
            found.append(cls)
    return tuple(found)


def load_checkpoint_file(path: Path) -> Any:
    """One file of a run's checkpoint: tensors, plain values and DeepSpeed's few records, nothing else."""
    return load_torch_file(path, allowed_globals=deepspeed_safe_globals())


@contextlib.contextmanager
def safe_deepspeed_loads(what: Path) -> Iterator[None]:
    """DeepSpeed's own `torch.load`s of checkpoint `what` as `weights_only=True` with our allow-list."""
    with restoring_environ(FORCE_WEIGHTS_ONLY, NO_FORCE_WEIGHTS_ONLY):
        os.environ[FORCE_WEIGHTS_ONLY] = "1"
        os.environ.pop(NO_FORCE_WEIGHTS_ONLY, None)
        try:
            with torch.serialization.safe_globals(list(deepspeed_safe_globals())):
                yield
        except pickle.UnpicklingError as err:  # the files were checked before; this one changed since
            raise ValueError(f"{what}: refused to load a file that is not tensors only "
                             f"({str(err).splitlines()[-1][:200]})") from None


def consolidated_state_dict(ckpt_dir: Path, tag: str, meta: dict[str, Any]) -> dict[str, torch.Tensor]:
    """fp32 weights of checkpoint `tag`, whatever the ZeRO stage and world size that wrote it."""
    if meta.get("zero_stage", 0) == 0 and meta.get("precision", "fp32") == "fp32":
        # No ZeRO and fp32: the module state in the model file *is* the master copy.
        state = load_checkpoint_file(ckpt_dir / tag / "mp_rank_00_model_states.pt")
        return {k: v.float() for k, v in state["module"].items()}
    if meta.get("zero_stage", 0) < 3 and any((ckpt_dir / tag).glob(BF16_OPTIM_FILES)):
        return _bf16_optimizer_master(ckpt_dir / tag)  # ZeRO-3 names its bf16 files alike; zero_to_fp32 reads those
    from deepspeed.utils import zero_to_fp32

    # zero_to_fp32 prints what it does ("Processing zero checkpoint ...": five lines, and tqdm progress bars
    # on stderr, for the tiny model); the export's own line says it. Its errors are exceptions, which still
    # come through. The bars go by replacing its tqdm: a redirect of stderr would also take our log records.
    with safe_deepspeed_loads(ckpt_dir / tag), contextlib.redirect_stdout(io.StringIO()), \
            mock.patch.object(zero_to_fp32, "tqdm", lambda items, **_: items):
        return zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(ckpt_dir), tag=tag)


# DeepSpeed's BF16_Optimizer (bf16 with fp32 gradient accumulation: our bf16 at ZeRO-1) writes these;
# zero_to_fp32 refuses them ("is not a zero checkpoint").
BF16_OPTIM_FILES = "bf16_zero_pp_rank_*_mp_rank_00_optim_states.pt"


def _bf16_optimizer_master(folder: Path) -> dict[str, torch.Tensor]:
    """The fp32 master weights of a BF16_Optimizer checkpoint: each rank holds a flat fp32 slice of each
    parameter group (the last padded); in rank order they make the group, cut into its parameters in the
    order and shapes the model file records (`param_shapes`). Buffers come from the module state."""
    files = sorted(folder.glob(BF16_OPTIM_FILES), key=lambda f: int(f.name.split("_")[4]))
    slices = [load_checkpoint_file(f)["optimizer_state_dict"] for f in files]
    model = load_checkpoint_file(folder / "mp_rank_00_model_states.pt")
    state: dict[str, torch.Tensor] = {}
    for g, shapes in enumerate(model["param_shapes"]):
        flat = torch.cat([s["single_partition_of_fp32_groups"][g] for s in slices])
        size = sum(shape.numel() for shape in shapes.values())
        if flat.numel() - sum(s["group_paddings"][g] for s in slices) != size:
            raise ValueError(f"checkpoint {folder}: its {len(files)} optimizer file(s) hold {flat.numel():,} values of "
                             f"parameter group {g}, not the {size:,} its parameters need (files missing?)")
        offset = 0
        for name, shape in shapes.items():
            state[name] = flat[offset:offset + shape.numel()].view(shape).clone()
            offset += shape.numel()
    for name, source in (model.get("shared_params") or {}).items():
        state[name] = state[source]
    state.update({name: model["module"][name].float() for name in model.get("buffer_names") or ()})
    return state


def write_export(ckpt_dir: Path, tag: str, meta: dict[str, Any], dest: Path, run_dir: Path) -> None:
    """The HF files of checkpoint `tag` (its metadata `meta`, already read and verified, with its `config`
    and `bert_config`: `export_dirs.export_run` checks) into `dest`."""
    from model import BertConfig, BertForPreTraining, save_pretrained

    vocab_file = ckpt_dir / tag / "vocab.txt"
    vocab = Vocab.read(vocab_file, lowercase=bool(meta.get("corpus", {}).get("lowercase", True)))
    try:
        trained = BertConfig(**meta["bert_config"])
    except (TypeError, ValueError) as err:  # metadata saved before its seal, edited since
        raise ValueError(f"checkpoint {ckpt_dir / tag}: the bert_config its metadata records is not a model's "
                         f"({err})") from None
    vocab.check_rows(trained.vocab_size, f"checkpoint {ckpt_dir / tag}")
    # `model.vocab_size` larger than the vocabulary pads embedding rows no token id reaches; Hugging
    # Face's config must say the real size (its tokenizer and ours agree on it), so export drops them.
    model = BertForPreTraining(trained.replace(vocab_size=vocab.size))
    state = _trim_vocab_rows(consolidated_state_dict(ckpt_dir, tag, meta), model.config.padded_vocab_size)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as err:  # a tensor of another shape than the metadata's model has
        raise ValueError(f"checkpoint {ckpt_dir / tag} does not match the model its metadata records: "
                         f"{str(err).splitlines()[-1].strip()}") from None
    if missing or unexpected:
        raise ValueError(f"checkpoint {ckpt_dir / tag} does not match the model it records: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    save_pretrained(model, dest, vocab_file=vocab_file)
    vocab.write_tokenizer_files(dest, model_max_length=model.config.max_position_embeddings)
    (dest / "README.md").write_text(_model_card(run_dir, tag, meta, vocab.size), encoding="utf-8")


def _trim_vocab_rows(state: dict[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]:
    """The word embeddings and MLM bias cut to `rows` (the tied decoder shares the embedding)."""
    names = [n for n in state if n.endswith(("embeddings.word.weight", "mlm.bias"))]
    if any(state[n].shape[0] > rows for n in names):
        log.info("export: dropping %d padded vocabulary rows (model.vocab_size beyond the vocabulary)",
                 max(state[n].shape[0] for n in names) - rows)
    return {n: t[:rows] if n in names else t for n, t in state.items()}


def _model_card(run_dir: Path, tag: str, meta: dict[str, Any], vocab_size: int) -> str:
    """The exported folder's README; `vocab_size` is the exported one (padded rows dropped)."""
    cfg, corpus, bert = meta["config"], meta.get("corpus", {}), meta["bert_config"]
    last: dict[str, Any] = {}
    last_eval: dict[str, Any] = {}
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for rec in read_records(metrics):
            if rec.get("step", 0) <= meta["step"]:
                last = rec
                if "eval_mlm_accuracy" in rec:
                    last_eval = rec

    def fmt(value: Any) -> str:
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    rows = [("loss", last.get("loss")), ("MLM accuracy (train batch)", last.get("mlm_accuracy")),
            ("NSP accuracy (train batch)", last.get("nsp_accuracy")),
            ("held-out MLM accuracy", last_eval.get("eval_mlm_accuracy")),
            ("held-out MLM accuracy at [MASK]", last_eval.get("eval_mlm_accuracy_at_mask")),
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
  vocabulary {vocab_size}, {bert['max_position_embeddings']} positions.
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
