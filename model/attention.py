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
    lengths:    [B] int32 real length of each sequence.
    batch, seqlen: B and L of the padded layout.
    """

    indices: torch.Tensor
    cu_seqlens: torch.Tensor
    lengths: torch.Tensor  # [B] int32
    batch: int
    seqlen: int

    @classmethod
    def from_mask(cls, attention_mask_BL: torch.Tensor) -> "Unpadded":
        mask = attention_mask_BL.bool()
        batch, seqlen = mask.shape
        lengths_B = mask.sum(dim=1, dtype=torch.int32)
        # The one host sync of the unpadded path: the number of real tokens sizes what follows.
        indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
        cu = F.pad(torch.cumsum(lengths_B, dim=0, dtype=torch.int32), (1, 0))
        return cls(indices, cu, lengths_B, batch, seqlen)

    @functools.cached_property
    def max_seqlen(self) -> int:
        """Longest real length (a host int, as varlen kernels take it); read only by the varlen path."""
        return int(self.lengths.max().item()) if self.batch else 0

    def pad(self, x_TX: torch.Tensor) -> torch.Tensor:
        """[T, ...] -> [B, L, ...] with zeros at padded positions."""
        out = x_TX.new_zeros((self.batch * self.seqlen, *x_TX.shape[1:]))
        out = out.index_copy(0, self.indices, x_TX)
        return out.view(self.batch, self.seqlen, *x_TX.shape[1:])

    def unpad(self, x_BLX: torch.Tensor) -> torch.Tensor:
        """[B, L, ...] -> [T, ...]."""
        return x_BLX.reshape(self.batch * self.seqlen, *x_BLX.shape[2:]).index_select(0, self.indices)

    def first_tokens(self, x_TH: torch.Tensor) -> torch.Tensor:
        """The [CLS] row of each sequence: [B, H]."""
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


def _varlen_usable(qkv: torch.Tensor, dropout_p: float, training: bool) -> bool:
    if "varlen-error" in _warned:
        return False
    if qkv.device.type != "cuda":
        _log_once("varlen-device", f"unpad: no varlen attention kernel on {qkv.device.type}; "
                  "re-padding inside attention only (projections and FFN stay unpadded)")
        return False
    if qkv.dtype not in (torch.float16, torch.bfloat16):
        _log_once("varlen-dtype", f"unpad: varlen flash attention needs fp16/bf16, got {qkv.dtype}; "
                  "re-padding inside attention")
        return False
    if training and dropout_p > 0:
        _log_once("varlen-dropout", "unpad: varlen flash attention has no attention-probability dropout; "
                  "set attention_probs_dropout_prob=0 to use it. Re-padding inside attention")
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        _log_once("varlen-import", "unpad: torch.nn.attention.varlen is unavailable; re-padding inside attention")
        return False
    return True


def unpadded_attention(qkv_T3H: torch.Tensor, layout: Unpadded, mask_B11L, num_heads: int, impl: str,
                       dropout_p: float, training: bool) -> torch.Tensor:
    """[T, 3H] fused projections of real tokens -> [T, H] attention output."""
    t, three_h = qkv_T3H.shape
    d = three_h // (3 * num_heads)
    if _varlen_usable(qkv_T3H, dropout_p, training):
        from torch.nn.attention.varlen import varlen_attn

        q, k, v = qkv_T3H.view(t, 3, num_heads, d).unbind(1)
        try:
            out_TND = varlen_attn(q, k, v, layout.cu_seqlens, layout.cu_seqlens, layout.max_seqlen, layout.max_seqlen)
            return out_TND.reshape(t, three_h // 3)
        except RuntimeError as err:  # e.g. an older GPU without a flash kernel
            _log_once("varlen-error", f"unpad: varlen attention failed ({err}); re-padding inside attention")
    qkv_BL3H = layout.pad(qkv_T3H)
    out_BLH = padded_attention(qkv_BL3H, mask_B11L, num_heads, impl, dropout_p, training)
    return layout.unpad(out_BLH)
