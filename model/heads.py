"""Fine-tuning heads of the paper's Figure 4: each returns logits; losses are the caller's.

Shape legend: B batch, L length, C labels or choices, H hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from model.bert import BertModel, init_weights
from model.config import BertConfig


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
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_weights(self.classifier, config)

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
        init_weights(self.qa_outputs, config)

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
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_weights(self.classifier, config)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None) -> torch.Tensor:
        h_BLH = self.bert(input_ids, token_type_ids, attention_mask).last_hidden_state
        return self.classifier(self.dropout(h_BLH))


class BertForMultipleChoice(nn.Module):
    """SWAG: inputs [B, C, L] (one sequence per choice) -> pooled -> linear(H, 1) -> [B, C] logits."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, 1)
        init_weights(self.classifier, config)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None) -> torch.Tensor:
        if input_ids.dim() != 3:
            raise ValueError(f"multiple choice expects input_ids of shape [batch, choices, length], got {tuple(input_ids.shape)}")
        b, c, l = input_ids.shape

        def flat(t):
            return None if t is None else t.reshape(b * c, l)

        pooled = self.bert(flat(input_ids), flat(token_type_ids), flat(attention_mask)).pooled_output
        return self.classifier(self.dropout(pooled)).view(b, c)
