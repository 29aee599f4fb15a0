"""Self-attention kernels and the padded / unpadded token layouts they run on.

Shape legend: B batch, L padded sequence length, T real (non-pad) tokens in the batch, H hidden,
N heads, D head dim (H = N * D).

Two layouts flow through the encoder:
  padded   x [B, L, H] with an additive key mask [B, 1, 1, L] (0 keep, dtype-min drop), as in the paper;
  unpadded x [T, H]: only real tokens, described by `Unpadded` (flat indices into B*L and the
           cumulative sequence lengths varlen kernels take). Projections, FFN and LayerNorm then
           spend no FLOPs on padding; only attention needs a per-sequence view.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

_warned: set[str] = set()


def _log_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.info(message)


@dataclass
class Unpadded:
    """Where the T real tokens of a [B, L] batch live.

    indices:    [T] int64 flat positions b * L + l of real tokens, in row-major order.
    cu_seqlens: [B + 1] int32 cumulative real lengths (varlen kernels' format).
    batch, seqlen: B and L of the padded layout.
    known_max_seqlen: the longest real length as a host int, when the caller knows it (the loader
      computes it on the CPU with the indices); else read from the device when first needed.
    """

    indices: torch.Tensor
    cu_seqlens: torch.Tensor
    batch: int
    seqlen: int
    known_max_seqlen: int | None = None

    @classmethod
    def from_mask(cls, attention_mask_BL: torch.Tensor) -> "Unpadded":
        """Built on the device from the mask: `nonzero` waits for the device (a host sync, since the
        number of real tokens sizes what follows). The trainer passes `precomputed` layouts instead."""
        mask = attention_mask_BL.bool()
        batch, seqlen = mask.shape
        lengths_B = mask.sum(dim=1, dtype=torch.int32)
        # A row with no token has no [CLS] for the pooler to take: it would take the next row's (or
        # index past the end). Checking costs a host sync, which `nonzero` below makes anyway.
        if batch and not bool((lengths_B > 0).all()):
            empty = torch.nonzero(lengths_B == 0).flatten().tolist()
            raise ValueError(f"attention_mask row(s) {empty[:5]} have no token (all 0): with unpad=True every "
                             "sequence needs at least its [CLS]; drop empty rows from the batch")
        indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
        cu = F.pad(torch.cumsum(lengths_B, dim=0, dtype=torch.int32), (1, 0))
        return cls(indices, cu, batch, seqlen)

    @classmethod
    def precomputed(cls, indices: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, batch: int,
                    seqlen: int) -> "Unpadded":
        """A layout made on the CPU by the data loader (`pipeline.loader.add_unpadded_layout`): no sync."""
        if cu_seqlens.dtype != torch.int32 or cu_seqlens.shape != (batch + 1,):
            raise ValueError(f"cu_seqlens must be int32 of shape [{batch + 1}], got {cu_seqlens.dtype} "
                             f"{tuple(cu_seqlens.shape)}")
        if indices.dtype != torch.int64 or indices.dim() != 1:
            raise ValueError(f"indices must be a 1-D int64 tensor, got {indices.dtype} {tuple(indices.shape)}")
        return cls(indices, cu_seqlens, batch, seqlen, int(max_seqlen))

    @functools.cached_property
    def max_seqlen(self) -> int:
        """Longest real length (a host int, as varlen kernels take it); read only by the varlen path."""
        if self.known_max_seqlen is not None:
            return self.known_max_seqlen
        return int((self.cu_seqlens[1:] - self.cu_seqlens[:-1]).max().item()) if self.batch else 0

    def pad(self, x_TX: torch.Tensor) -> torch.Tensor:
        """[T, ...] -> [B, L, ...] with zeros at padded positions."""
        out = x_TX.new_zeros((self.batch * self.seqlen, *x_TX.shape[1:]))
        out = out.index_copy(0, self.indices, x_TX)
        return out.view(self.batch, self.seqlen, *x_TX.shape[1:])

    def unpad(self, x_BLX: torch.Tensor) -> torch.Tensor:
        """[B, L, ...] -> [T, ...]."""
        return x_BLX.reshape(self.batch * self.seqlen, *x_BLX.shape[2:]).index_select(0, self.indices)

    def first_tokens(self, x_TH: torch.Tensor) -> torch.Tensor:
        """The first real token of each sequence, its [CLS]: [B, H]. (Under left padding the padded
        path pools position 0, a pad token, as Hugging Face does; BERT's inputs are right-padded.)"""
        return x_TH.index_select(0, self.cu_seqlens[:-1].long())

    def key_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """Additive [B, 1, 1, L] key mask of the padded layout."""
        keep = torch.zeros(self.batch * self.seqlen, dtype=torch.bool, device=self.indices.device)
        keep[self.indices] = True
        return additive_key_mask(keep.view(self.batch, self.seqlen), dtype)

    def flat_to_packed(self) -> torch.Tensor:
        """[B * L] map from padded flat position to packed row (-1 at padding)."""
        inv = torch.full((self.batch * self.seqlen,), -1, dtype=torch.long, device=self.indices.device)
        inv[self.indices] = torch.arange(self.indices.numel(), device=self.indices.device)
        return inv


def additive_key_mask(attention_mask_BL: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, L] 1/0 mask -> [B, 1, 1, L] additive mask (0 keep, dtype-min drop), as HF and the paper.

    An additive minimum rather than a boolean mask keeps a fully masked row finite (uniform over
    padding) instead of NaN, and matches transformers' numerics exactly.
    """
    mask = attention_mask_BL[:, None, None, :].to(dtype)
    return (1.0 - mask) * torch.finfo(dtype).min


def eager_attention(q_BNLD, k_BNLD, v_BNLD, mask_B11L, dropout_p: float, training: bool) -> torch.Tensor:
    """The reference: softmax(Q K^T / sqrt(D) + mask) V, with dropout on the probabilities."""
    scores = torch.matmul(q_BNLD, k_BNLD.transpose(-1, -2)) / math.sqrt(q_BNLD.shape[-1])
    if mask_B11L is not None:
        scores = scores + mask_B11L
    probs = torch.softmax(scores, dim=-1)
    probs = F.dropout(probs, p=dropout_p, training=training)
    return torch.matmul(probs, v_BNLD)


def sdpa_attention(q_BNLD, k_BNLD, v_BNLD, mask_B11L, dropout_p: float, training: bool) -> torch.Tensor:
    return F.scaled_dot_product_attention(
        q_BNLD, k_BNLD, v_BNLD, attn_mask=mask_B11L, dropout_p=dropout_p if training else 0.0
    )


def padded_attention(qkv_BL3H: torch.Tensor, mask_B11L, num_heads: int, impl: str, dropout_p: float,
                     training: bool) -> torch.Tensor:
    """[B, L, 3H] fused projections -> [B, L, H] attention output."""
    b, l, three_h = qkv_BL3H.shape
    d = three_h // (3 * num_heads)
    q, k, v = qkv_BL3H.view(b, l, 3, num_heads, d).permute(2, 0, 3, 1, 4).unbind(0)
    fn = sdpa_attention if impl == "sdpa" else eager_attention
    out_BNLD = fn(q, k, v, mask_B11L, dropout_p, training)
    return out_BNLD.transpose(1, 2).reshape(b, l, three_h // 3)


def varlen_refusal(device_type: str, dtype: torch.dtype, dropout_p: float, training: bool,
                   varlen_dropout: bool) -> str | None:
    """Why varlen flash attention cannot run here (None: it can). A pure function of the setting."""
    if device_type != "cuda":
        return f"no varlen attention kernel on {device_type}"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"varlen flash attention needs fp16/bf16, got {dtype}"
    if training and dropout_p > 0 and not varlen_dropout:
        return ("attention dropout > 0 and varlen_dropout is off (set model.fields.varlen_dropout=true to run "
                "flash attention with dropout: 1.14x at BERT-Large seq 128 on an H200, docs/PERFORMANCE.md)")
    return None


def varlen_flash_attention(qkv_T3H: torch.Tensor, layout: Unpadded, num_heads: int, dropout_p: float) -> torch.Tensor:
    """[T, 3H] -> [T, H] through `aten._flash_attention_forward`, the op under `varlen_attn` (whose
    wrapper hard-codes dropout 0): it takes attention dropout and has an autograd node
    (FlashAttentionBackward0 saves the Philox state, so backward replays the same mask).
    cu_seqlens int32 and the max length a host int: nothing here waits for the device."""
    t, three_h = qkv_T3H.shape
    q, k, v = qkv_T3H.view(t, 3, num_heads, three_h // (3 * num_heads)).unbind(1)
    out_TND = torch.ops.aten._flash_attention_forward(
        q, k, v, layout.cu_seqlens, layout.cu_seqlens, layout.max_seqlen, layout.max_seqlen,
        dropout_p, False, False)[0]
    return out_TND.reshape(t, three_h // 3)


def unpadded_attention(qkv_T3H: torch.Tensor, layout: Unpadded, mask_B11L, num_heads: int, impl: str,
                       dropout_p: float, training: bool, varlen_dropout: bool = False) -> torch.Tensor:
    """[T, 3H] fused projections of real tokens -> [T, H] attention output."""
    if "varlen-error" in _warned:
        refusal = "an earlier varlen call failed"
    else:
        refusal = varlen_refusal(qkv_T3H.device.type, qkv_T3H.dtype, dropout_p, training, varlen_dropout)
    if refusal is None:
        try:
            return varlen_flash_attention(qkv_T3H, layout, num_heads, dropout_p if training else 0.0)
        except RuntimeError as err:  # e.g. an older GPU without a flash kernel
            _log_once("varlen-error", f"unpad: varlen attention failed ({err}); re-padding inside attention")
    else:
        _log_once(f"varlen:{refusal}", f"unpad: {refusal}; re-padding inside attention only "
                  "(projections and FFN stay unpadded)")
    qkv_BL3H = layout.pad(qkv_T3H)
    out_BLH = padded_attention(qkv_BL3H, mask_B11L, num_heads, impl, dropout_p, training)
    return layout.unpad(out_BLH)
