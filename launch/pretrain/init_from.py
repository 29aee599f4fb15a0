"""Phase 2's start (`checkpoint.init_from`): a phase-1 run's (or an HF directory's) weights in the
model this run's config describes; its optimizer, schedule and loader start fresh.

The run's config stays the one description of the model: the checkpoint must have the same
architecture, and dropout and the fast-path switches are this run's. So a resumed phase-2 run, which
builds the model from its config, continues exactly the model the first run trained.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch

from launch.export_dirs import resolve_checkpoint
from launch.pretrain.process_group import on_rank0
from pipeline.manifest import sha256_file

log = logging.getLogger(__name__)

# What the weights fix; every other BertConfig field (dropout, init range, fast paths) is the run's.
ARCHITECTURE = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "pad_token_id")


def load_init_from(path: str, bert_cfg: Any, vocab_file: Path) -> torch.nn.Module:
    from model import BertForPreTraining, load_pretrained

    # A RUN dir is verified and exported on first use by rank 0 alone (concurrent exports of the
    # same folder would replace each other under the readers' feet); every rank reads the result.
    hf_dir = on_rank0(lambda: resolve_checkpoint(Path(path)))
    if not (hf_dir / "vocab.txt").is_file():  # an HF directory may come without one: a FileNotFoundError traceback
        raise ValueError(f"checkpoint.init_from {hf_dir} has no vocab.txt, so it cannot be checked against the corpus "
                         f"vocabulary; copy the phase-1 vocab.txt ({vocab_file} if it is this corpus's) into it")
    if sha256_file(hf_dir / "vocab.txt") != sha256_file(vocab_file):
        raise ValueError(f"{hf_dir / 'vocab.txt'} differs from the corpus vocabulary {vocab_file}; "
                         f"phase 2 must use the phase-1 vocabulary")
    run_fields = {f.name: getattr(bert_cfg, f.name) for f in dataclasses.fields(bert_cfg) if f.name not in ARCHITECTURE}
    model, report = load_pretrained(BertForPreTraining, hf_dir, config_overrides=run_fields)
    if model.config.vocab_size < bert_cfg.vocab_size:
        model = _with_padded_rows(model, bert_cfg.vocab_size)
    differ = [f"{name} {getattr(model.config, name)} there, {getattr(bert_cfg, name)} here" for name in ARCHITECTURE
              if getattr(model.config, name) != getattr(bert_cfg, name)]
    if differ:
        raise ValueError(f"checkpoint.init_from {path} is not the model this config describes ({'; '.join(differ)}); "
                         "set model.preset, model.vocab_size and model.fields to the phase-1 run's")
    if report.missing_keys:
        raise ValueError(f"{hf_dir} lacks {', '.join(report.missing_keys[:5])}; init_from needs a pre-training checkpoint")
    log.info("initialised from %s", hf_dir)
    return model


def _with_padded_rows(model: torch.nn.Module, vocab_size: int) -> torch.nn.Module:
    """`model` with `vocab_size` vocabulary rows: a phase-1 run trained with a padded `model.vocab_size`
    is exported with its real rows only (the rows no token id reaches are dropped), so this run's padded
    config found 30522 "there" against its own 30600 and refused. The extra rows are drawn afresh, as in
    any new model of this size (the trainer seeded the draw)."""
    from model import BertForPreTraining

    padded = BertForPreTraining(dataclasses.replace(model.config, vocab_size=vocab_size))
    state, rows = model.state_dict(), model.config.vocab_size
    mine = padded.state_dict()
    for name, tensor in state.items():
        if name.endswith(("embeddings.word.weight", "mlm.bias")):
            tensor = torch.cat([tensor[:rows], mine[name][rows:]])
        mine[name] = tensor
    padded.load_state_dict(mine)
    log.info("init_from: %d vocabulary rows from the checkpoint, %d padding rows drawn afresh (model.vocab_size %d)",
             rows, vocab_size - rows, vocab_size)
    return padded
