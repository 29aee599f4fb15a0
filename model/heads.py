"""Fine-tuning heads of the paper's Figure 4, and Table 7's heads on frozen features: each returns logits;
losses are the caller's.

Shape legend: B batch, L length, C labels or choices, H hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from model.bert import BertModel
from model.config import BertConfig


def init_head(linear: nn.Linear, config: BertConfig) -> None:
    """A task head starts as transformers draws it (its `_init_weights`): normal(0, initializer_range), bias 0.

    Not the encoder's truncated normal (cut at 2 std, so std 0.88x): on CoNLL-2003 NER after one
    epoch, the truncated draw averaged 34.9 entity F1 over 10 seeds, the plain normal one 38.0
    (transformers 37.6), everything else unchanged; as built by default, over 20 seeds: 36.9 against
    37.6, within one standard error (docs/finetune.md, "Parity with transformers").
    """
    nn.init.normal_(linear.weight, mean=0.0, std=config.initializer_range)
    nn.init.zeros_(linear.bias)


@dataclass
class SpanLogits:
    start_logits: torch.Tensor  # [B, L]
    end_logits: torch.Tensor  # [B, L]


class BertForSequenceClassification(nn.Module):
    """Pooled [CLS] -> dropout -> linear: [B, C] logits (C = num_labels; 1 = regression, e.g. STS-B)."""

    def __init__(self, config: BertConfig, num_labels: int) -> None:
        super().__init__()
        if num_labels < 1:
            raise ValueError(f"num_labels must be >= 1 (1 = regression), got {num_labels}")
        self.config = config
        self.num_labels = num_labels
        self.bert = BertModel(config)
        self.dropout = nn.Dropout(config.head_dropout)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_head(self.classifier, config)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None) -> torch.Tensor:
        pooled = self.bert(input_ids, token_type_ids, attention_mask).pooled_output
        return self.classifier(self.dropout(pooled))


class BertForQuestionAnswering(nn.Module):
    """Per-token start and end logits (SQuAD): a [H, 2] projection of the last hidden states."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        init_head(self.qa_outputs, config)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None) -> SpanLogits:
        h_BLH = self.bert(input_ids, token_type_ids, attention_mask).last_hidden_state
        start, end = self.qa_outputs(h_BLH).unbind(-1)
        return SpanLogits(start.contiguous(), end.contiguous())


class BertForTokenClassification(nn.Module):
    """Per-token labels (NER): dropout + linear on the last hidden states: [B, L, C] logits."""

    def __init__(self, config: BertConfig, num_labels: int) -> None:
        super().__init__()
        if num_labels < 2:
            raise ValueError(f"num_labels must be >= 2 for token classification, got {num_labels}")
        self.config = config
        self.num_labels = num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(config.head_dropout)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_head(self.classifier, config)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None) -> torch.Tensor:
        h_BLH = self.bert(input_ids, token_type_ids, attention_mask).last_hidden_state
        return self.classifier(self.dropout(h_BLH))


class BertForMultipleChoice(nn.Module):
    """SWAG: inputs [B, C, L] (one sequence per choice) -> pooled -> linear(H, 1) -> [B, C] logits."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.dropout = nn.Dropout(config.head_dropout)
        self.classifier = nn.Linear(config.hidden_size, 1)
        init_head(self.classifier, config)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None) -> torch.Tensor:
        if input_ids.dim() != 3:
            raise ValueError(f"multiple choice expects input_ids of shape [batch, choices, length], got {tuple(input_ids.shape)}")
        b, c, l = input_ids.shape

        def flat(t):
            return None if t is None else t.reshape(b * c, l)

        pooled = self.bert(flat(input_ids), flat(token_type_ids), flat(attention_mask)).pooled_output
        return self.classifier(self.dropout(pooled)).view(b, c)


# ---- the feature-based approach (the paper's Table 7): heads on frozen activations --------------------
# Shape legend here: K chosen layers, F combined feature width (H, or K*H when concatenated), D LSTM units.


class ScalarMix(nn.Module):
    """ELMo's learned layer mix, Table 7's "weighted sum": gamma * sum_k softmax(w)_k h_k."""

    def __init__(self, num_layers: int) -> None:
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(num_layers))  # equal weights at the start
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, layers_BLKH: torch.Tensor) -> torch.Tensor:
        return self.gamma * torch.einsum("blkh,k->blh", layers_BLKH, self.weights.softmax(0))


class FrozenFeatureHead(nn.Module):
    """A new head on frozen activations [B, L, K, H]: combine the K layers (concat, sum or ScalarMix),
    then a two-layer BiLSTM (`lstm_hidden` units per direction; 0 = none, a linear head) and a linear
    classifier, as in the paper's "two-layer 768-dimensional BiLSTM before the classification layer".

    per_token=True: [B, L, C] logits at every position (NER). per_token=False: [B, C] for the text,
    from the BiLSTM's last states of both directions, or without a BiLSTM from the [CLS] position.
    """

    def __init__(self, num_layers: int, hidden_size: int, num_labels: int, *, combine: str, per_token: bool,
                 lstm_hidden: int = 768, lstm_layers: int = 2, dropout: float = 0.1) -> None:
        super().__init__()
        if combine not in ("concat", "sum", "weighted"):
            raise ValueError(f"combine must be concat, sum or weighted, got {combine!r}")
        self.combine, self.per_token = combine, per_token
        self.mix = ScalarMix(num_layers) if combine == "weighted" else None
        width = hidden_size * num_layers if combine == "concat" else hidden_size
        self.dropout = nn.Dropout(dropout)
        self.lstm = (nn.LSTM(width, lstm_hidden, num_layers=lstm_layers, bidirectional=True, batch_first=True,
                             dropout=dropout if lstm_layers > 1 else 0.0) if lstm_hidden > 0 else None)
        self.classifier = nn.Linear(2 * lstm_hidden if self.lstm is not None else width, num_labels)

    def forward(self, layers_BLKH: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.combine == "concat":
            x_BLF = layers_BLKH.flatten(2)
        elif self.combine == "sum":
            x_BLF = layers_BLKH.sum(2)
        else:
            x_BLF = self.mix(layers_BLKH)
        x_BLF = self.dropout(x_BLF)
        if self.lstm is None:
            return self.classifier(x_BLF if self.per_token else x_BLF[:, 0])
        # Packed, so that padding never enters the backward direction.
        lengths = attention_mask.sum(1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(x_BLF, lengths, batch_first=True, enforce_sorted=False)
        out, (h_n, _) = self.lstm(packed)
        if not self.per_token:
            return self.classifier(self.dropout(torch.cat([h_n[-2], h_n[-1]], dim=-1)))  # [B, 2D]
        out_BLD, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x_BLF.shape[1])
        return self.classifier(self.dropout(out_BLD))
