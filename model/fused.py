"""Fused bias+GELU and dropout+residual+LayerNorm through torch.compile, applied from outside.

`compile_fast_paths(model)` compiles, in place (parameter names and the state_dict stay the same),
each feed-forward block, each attention block's output projection + dropout + residual + LayerNorm,
and the MLM head: Inductor fuses the bias add into GELU and dropout+residual+LayerNorm into one
kernel (Triton on GPU, C++ on CPU). Attention itself is left to the SDPA / varlen kernels. Each compiled module is exercised once on a small input
so that a missing compiler fails here, falls back to eager with a log line, and never mid-training.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from model.bert import Attention, FeedForward, MaskedLMHead

logger = logging.getLogger(__name__)


def _revert(module: nn.Module) -> None:
    if isinstance(module, Attention):
        module.__dict__.pop("finish", None)  # the instance attribute shadowing the eager method
    else:
        module._compiled_call_impl = None  # what nn.Module.compile sets; None means eager again


def compile_fast_paths(model: nn.Module, mode: str | None = None) -> int:
    """Compile the fusable blocks of `model`; returns how many were compiled (0 = eager fallback)."""
    targets = [m for m in model.modules() if isinstance(m, (FeedForward, MaskedLMHead, Attention))]
    if not targets:
        raise ValueError(f"{type(model).__name__} has no BERT blocks to compile")
    param = next(model.parameters())
    compiled = 0
    for m in targets:
        # dynamic: with unpadding the token count changes every batch; one graph serves them all.
        if isinstance(m, Attention):
            m.finish = torch.compile(m.finish, dynamic=True, mode=mode)
        else:
            m.compile(dynamic=True, mode=mode)
    try:
        with torch.no_grad():
            for m in targets:
                width = m.out.in_features if isinstance(m, Attention) else (
                    m.up.in_features if isinstance(m, FeedForward) else m.transform.in_features)
                probe = torch.zeros(3, width, device=param.device, dtype=param.dtype)
                m.finish(probe, probe) if isinstance(m, Attention) else m(probe)
                compiled += 1
    except Exception as err:  # noqa: BLE001 - any compiler failure means: run eager, and say so
        for m in targets:
            _revert(m)
        logger.warning("torch.compile fast paths unavailable (%s: %s); running eager", type(err).__name__, str(err).splitlines()[0] if str(err) else "")
        return 0
    logger.info("compiled %d attention-output / feed-forward / MLM-head blocks with torch.compile "
                "(fused bias+GELU, dropout+add+LayerNorm)", compiled)
    return compiled
