"""The BERT encoder and its pre-training heads (Devlin et al., 2019), as plain nn.Modules.

Shape legend: B batch, L padded length, T real tokens, H hidden, I intermediate (4H), V vocab,
P masked-LM predictions per sequence.

Module names are our own (one fused QKV projection, `layers.N.ffn.up`, ...); `model/hf.py` maps them
to and from Hugging Face's names. Post-LayerNorm, exact (erf) GELU, learned absolute positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from model.attention import Unpadded, additive_key_mask, padded_attention, unpadded_attention
from model.config import BertConfig


@dataclass
class BertOutput:
    last_hidden_state: torch.Tensor  # [B, L, H]; zeros at padded positions when config.unpad
    pooled_output: torch.Tensor | None  # [B, H] tanh(W h_[CLS] + b); None without a pooler
    hidden_states: tuple[torch.Tensor, ...] | None = None  # embeddings + each layer, [B, L, H] each


class PreTrainingOutput(NamedTuple):
    """A tuple, not a dataclass: DeepSpeed finds a forward's output tensors only inside tensors, tuples,
    lists and dicts, and hooks them to run its pre-backward step; unseen, that step never ran and
    bf16 ZeRO-1 with gradient accumulation summed micro-batch k's gradient GA-k times."""

    mlm_logits: torch.Tensor  # [B, P, V] at masked_lm_positions, else [B, L, V]
    nsp_logits: torch.Tensor  # [B, 2]; class 0 = B follows A, 1 = random B


@dataclass
class _Encoded:
    """Encoder output in whichever layout it ran: [B, L, H] (layout None) or [T, H]."""

    x: torch.Tensor
    layout: Unpadded | None
    hidden_states: list[torch.Tensor] | None

    def padded(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.layout is None else self.layout.pad(x)


class Embeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(config.padded_vocab_size, config.hidden_size)
        self.position = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids, position_ids) -> torch.Tensor:
        x = self.word(input_ids) + self.position(position_ids) + self.token_type(token_type_ids)
        return self.dropout(self.norm(x))


class Attention(nn.Module):
    """Multi-head self-attention with one fused [3H, H] QKV projection, then dropout-add-LayerNorm."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.impl = config.attention_impl
        self.attn_dropout = config.attention_probs_dropout_prob
        self.varlen_dropout = config.varlen_dropout
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.out = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, mask_B11L: torch.Tensor | None, layout: Unpadded | None) -> torch.Tensor:
        qkv = self.qkv(x)
        if layout is None:
            ctx = padded_attention(qkv, mask_B11L, self.num_heads, self.impl, self.attn_dropout, self.training)
        else:
            ctx = unpadded_attention(qkv, layout, mask_B11L, self.num_heads, self.impl, self.attn_dropout,
                                     self.training, self.varlen_dropout)
        return self.finish(x, ctx)

    def finish(self, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """Output projection + dropout + residual + LayerNorm (what `compile_fast_paths` fuses)."""
        return self.norm(x + self.dropout(self.out(ctx)))


class FeedForward(nn.Module):
    """up (H->4H) + bias + exact GELU, down (4H->H), dropout-add-LayerNorm.

    Kept as one module so that `model.fused.compile_fast_paths` can fuse bias+GELU and
    dropout+residual+LayerNorm into a few kernels without changing parameter names.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.dropout(self.down(F.gelu(self.up(x)))))


class Layer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = Attention(config)
        self.ffn = FeedForward(config)

    def forward(self, x: torch.Tensor, mask_B11L: torch.Tensor | None, layout: Unpadded | None) -> torch.Tensor:
        return self.ffn(self.attention(x, mask_B11L, layout))


class Encoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_hidden_layers))
        # Set by model.activation_checkpointing.apply_activation_checkpointing: recompute every n-th layer's
        # activations in backward (0 = off). A plain attribute so the state_dict is unchanged.
        self.checkpoint_every = 0

    def forward(self, x, mask_B11L, layout, hidden_states: list[torch.Tensor] | None) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            if self.checkpoint_every and self.training and i % self.checkpoint_every == 0 and torch.is_grad_enabled():
                # Non-reentrant: works with unused inputs, kwargs and restores dropout RNG state.
                x = checkpoint(layer, x, mask_B11L, layout, use_reentrant=False)
            else:
                x = layer(x, mask_B11L, layout)
            if hidden_states is not None:
                hidden_states.append(x)
        return x


class Pooler(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, cls_BH: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(cls_BH))


def init_weights(module: nn.Module, config: BertConfig) -> None:
    """The reference initialisation: truncated normal(0, initializer_range) at +-2 std, zero biases,
    LayerNorm at identity. Rows that only pad the vocabulary are zero (never looked up)."""
    std = config.initializer_range
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            if std > 0:
                nn.init.trunc_normal_(m.weight, mean=0.0, std=std, a=-2 * std, b=2 * std)
            else:  # initializer_range 0, which an HF config may hold: trunc_normal_ divides by the std
                nn.init.zeros_(m.weight)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    for m in module.modules():
        if isinstance(m, Embeddings):
            with torch.no_grad():
                m.word.weight[config.vocab_size:].zero_()


class BertModel(nn.Module):
    """Embeddings + L post-LN transformer layers + tanh pooler over [CLS].

    `add_pooling_layer=False` (token-level heads, as in transformers) leaves the pooler out.
    """

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)
        self.pooler = Pooler(config) if add_pooling_layer else None
        init_weights(self, config)

    def encode(self, input_ids, token_type_ids=None, attention_mask=None, output_hidden_states: bool = False,
               layout: Unpadded | None = None) -> _Encoded:
        """Run embeddings + encoder in the configured layout (padded, or unpadded [T, H]).

        `layout`: with `config.unpad`, the unpadded layout of `attention_mask` made on the CPU by the
        data loader (`Unpadded.precomputed`); without it, it is built here from the mask (a host sync).
        """
        b, l = input_ids.shape
        if l > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {l} exceeds max_position_embeddings={self.config.max_position_embeddings}; "
                "truncate the inputs"
            )
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        position_ids = torch.arange(l, device=input_ids.device).expand(b, l)
        hidden: list[torch.Tensor] | None = [] if output_hidden_states else None
        if self.config.unpad and attention_mask is not None:
            layout = layout if layout is not None else Unpadded.from_mask(attention_mask)
            flat = layout.indices
            x = self.embeddings(
                input_ids.reshape(-1)[flat], token_type_ids.reshape(-1)[flat], position_ids.reshape(-1)[flat]
            )
            # Read only where attention re-pads (no varlen kernel); built once for all layers.
            mask = layout.key_mask(x.dtype)
        else:
            layout = None
            x = self.embeddings(input_ids, token_type_ids, position_ids)
            mask = None if attention_mask is None else additive_key_mask(attention_mask, x.dtype)
        if hidden is not None:
            hidden.append(x)
        x = self.encoder(x, mask, layout, hidden)
        return _Encoded(x, layout, hidden)

    def pool(self, enc: _Encoded) -> torch.Tensor | None:
        if self.pooler is None:
            return None
        cls = enc.x[:, 0] if enc.layout is None else enc.layout.first_tokens(enc.x)
        return self.pooler(cls)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, output_hidden_states: bool = False) -> BertOutput:
        enc = self.encode(input_ids, token_type_ids, attention_mask, output_hidden_states)
        hidden = None if enc.hidden_states is None else tuple(enc.padded(h) for h in enc.hidden_states)
        return BertOutput(enc.padded(enc.x), self.pool(enc), hidden)


class MaskedLMHead(nn.Module):
    """transform (dense + GELU + LayerNorm), then the decoder tied to the word embeddings, + bias."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        self.vocab_size = config.vocab_size
        self.transform = nn.Linear(config.hidden_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.padded_vocab_size))
        # Tied, not copied: a reference to the embedding module, not registered as a child, so the
        # weight appears once in state_dict() and parameters() (DeepSpeed partitions it once).
        self._word_embeddings = [word_embeddings]

    @property
    def decoder_weight(self) -> nn.Parameter:
        """The tied [V_padded, H] weight (owned by the word embeddings). Under ZeRO-3 register it as
        an external parameter of this module: `deepspeed.zero.register_external_parameter(model.mlm,
        model.mlm.decoder_weight)`."""
        return self._word_embeddings[0].weight

    def forward(self, x_XH: torch.Tensor) -> torch.Tensor:
        h = self.norm(F.gelu(self.transform(x_XH)))
        logits = F.linear(h, self.decoder_weight, self.bias)
        if logits.shape[-1] != self.vocab_size:
            logits = logits[..., : self.vocab_size]  # drop rows that only pad the vocabulary
        return logits


class BertForPreTraining(nn.Module):
    """BERT with the masked-LM and next-sentence heads.

    With `masked_lm_positions` [B, P] the decoder (the largest matmul at V=30522) runs only at those
    P positions per sequence, and `mlm_logits` is [B, P, V]; padded entries (position 0 by the
    loader's convention) produce logits the loss ignores via label -100.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.mlm = MaskedLMHead(config, self.bert.embeddings.word)
        self.nsp = nn.Linear(config.hidden_size, 2)
        init_weights(self.mlm, config)
        init_weights(self.nsp, config)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, masked_lm_positions=None,
                layout: Unpadded | None = None) -> PreTrainingOutput:
        """`layout`: the batch's precomputed unpadded layout (see `BertModel.encode`), used with `config.unpad`."""
        enc = self.bert.encode(input_ids, token_type_ids, attention_mask, layout=layout)
        if masked_lm_positions is None:
            mlm_in = enc.padded(enc.x)
        else:
            b, l = input_ids.shape
            flat_BP = masked_lm_positions.long() + torch.arange(b, device=input_ids.device)[:, None] * l
            if enc.layout is None:
                mlm_in = enc.x.reshape(b * l, -1)[flat_BP]
            else:
                mlm_in = enc.x[enc.layout.flat_to_packed()[flat_BP]]
        return PreTrainingOutput(self.mlm(mlm_in), self.nsp(self.bert.pool(enc)))
