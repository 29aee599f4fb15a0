"""BERT as plain nn.Modules: encoder, pre-training and fine-tuning heads, HF checkpoint adapter.

Nothing in this package imports torch.distributed, deepspeed, ray, apache_beam or argparse
(tests/test_layering.py::test_model_package_imports_nothing_forbidden keeps it so): parallelism
and launching are applied from outside.

    from model import BertConfig, BertForPreTraining, apply_activation_checkpointing
    model = BertForPreTraining(BertConfig.preset("base", unpad=True, pad_vocab_multiple=64))
    apply_activation_checkpointing(model)          # optional, from the trainer
    out = model(input_ids, token_type_ids, attention_mask, masked_lm_positions)
"""

from model.attention import Unpadded
from model.bert import BertModel, BertOutput, BertForPreTraining, PreTrainingOutput
from model.activation_checkpointing import apply_activation_checkpointing
from model.config import BertConfig
from model.fused import compile_fast_paths
from model.heads import (
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    SpanLogits,
)
from model.hf import LoadReport, load_pretrained, save_pretrained
from model.losses import masked_lm_loss, mlm_counts_at_mask, pretraining_loss

__all__ = [
    "BertConfig",
    "BertModel",
    "BertOutput",
    "BertForPreTraining",
    "PreTrainingOutput",
    "Unpadded",
    "BertForSequenceClassification",
    "BertForQuestionAnswering",
    "BertForTokenClassification",
    "BertForMultipleChoice",
    "SpanLogits",
    "LoadReport",
    "load_pretrained",
    "save_pretrained",
    "apply_activation_checkpointing",
    "compile_fast_paths",
    "masked_lm_loss",
    "mlm_counts_at_mask",
    "pretraining_loss",
]
