"""`BertConfig`: the architecture of the paper plus the opt-in fast-path switches.

The architecture fields use the names of the original `bert_config.json` (and of Hugging Face's
`config.json`), so an HF config maps onto this dataclass field for field (see `model/hf.py`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

AttentionImpl = Literal["eager", "sdpa"]

# name -> (num_hidden_layers, hidden_size, num_attention_heads). FFN is always 4H.
_PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 64, 2),  # CPU tests and the demo
    "mini": (4, 256, 4),  # Turc et al.'s BERT-Mini
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


@dataclass
class BertConfig:
    """BERT hyper-parameters (Devlin et al., 2019) and the model's fast-path switches.

    Architecture (defaults are BERT-Base):
      vocab_size: real vocabulary size (30522 for the uncased English vocab).
      hidden_size, num_hidden_layers, num_attention_heads, intermediate_size (4 * hidden).
      max_position_embeddings: learned absolute positions (512).
      type_vocab_size: segment ids (2: sentence A / B).
      hidden_dropout_prob, attention_probs_dropout_prob: 0.1 each, as in the paper.
      classifier_dropout: the fine-tuning heads' dropout; None (default) = hidden_dropout_prob, as in
        transformers, whose checkpoints may set it.
      layer_norm_eps: 1e-12 as in the reference TensorFlow code.
      initializer_range: std of the truncated-normal-like init (0.02).
      pad_token_id: the id whose rows the attention mask usually masks out (0).

    Fast paths (each keeps the eager reference's `state_dict` keys and numerics within tolerance):
      attention_impl: "sdpa" (torch.nn.functional.scaled_dot_product_attention; exact within fp32
        rounding) or "eager" (the reference softmax(QK^T/sqrt(d))V written out).
      unpad: drop padding tokens before the encoder so projections, FFN and LayerNorm spend no
        FLOPs on them; attention runs varlen (flash) on CUDA, and on other devices re-pads only
        inside attention. Hidden states at padded positions are then zeros.
      varlen_dropout: with unpad on CUDA in 16-bit, run varlen flash attention also when training
        with attention dropout (the paper's 0.1) through `aten._flash_attention_forward`. Off here
        (the block is re-padded for attention); on in the bert-large-phase1 and -phase2 presets (phase 1
        measured 1.14x the re-padded step on an H200, docs/PERFORMANCE.md).
      pad_vocab_multiple: pad the embedding / MLM decoder rows to a multiple of this (64 helps
        tensor cores); logits are always trimmed to `vocab_size` and export trims the weights.
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    classifier_dropout: float | None = None
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    attention_impl: AttentionImpl = "sdpa"
    unpad: bool = False
    varlen_dropout: bool = False
    pad_vocab_multiple: int = 1

    def __post_init__(self) -> None:
        # Each below its least: a ZeroDivisionError, an IndexError in the first step or an init that raises.
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.layer_norm_eps > 0 or not self.initializer_range >= 0:
            raise ValueError(f"layer_norm_eps must be positive and initializer_range 0 or more, got "
                             f"{self.layer_norm_eps} and {self.initializer_range}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id must be an id of the vocabulary (0 to {self.vocab_size - 1}), got {self.pad_token_id}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads}); change one of them"
            )
        if self.attention_impl not in ("eager", "sdpa"):
            raise ValueError(f"attention_impl must be 'eager' or 'sdpa', got {self.attention_impl!r}")
        if self.pad_vocab_multiple < 1:
            raise ValueError(f"pad_vocab_multiple must be >= 1, got {self.pad_vocab_multiple}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            if getattr(self, name) is not None and not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")

    @property
    def head_dropout(self) -> float:
        return self.hidden_dropout_prob if self.classifier_dropout is None else self.classifier_dropout

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def padded_vocab_size(self) -> int:
        m = self.pad_vocab_multiple
        return (self.vocab_size + m - 1) // m * m

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "BertConfig":
        """tiny (L2/H64/A2), mini (L4/H256/A4), base (L12/H768/A12) or large (L24/H1024/A16).

        FFN is 4H; any field can be overridden, e.g. `BertConfig.preset("tiny", vocab_size=1000)`.
        """
        if name not in _PRESETS:
            raise ValueError(f"unknown BERT preset {name!r}; choose one of {', '.join(_PRESETS)}")
        layers, hidden, heads = _PRESETS[name]
        fields = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, intermediate_size=4 * hidden)
        fields.update(overrides)
        return cls(**fields)

    def replace(self, **changes: Any) -> "BertConfig":
        return dataclasses.replace(self, **changes)

    def num_parameters(self, include_embeddings: bool = True) -> int:
        """Parameters of the encoder + pooler (tied MLM decoder not double counted)."""
        h, i = self.hidden_size, self.intermediate_size
        per_layer = 4 * h * h + 4 * h + 2 * h * i + i + h + 4 * h
        emb = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * h + 2 * h
        return self.num_hidden_layers * per_layer + h * h + h + (emb if include_embeddings else 0)
