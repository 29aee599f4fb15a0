"""Worker for test_grad_accumulation.py: which gradient one step with gradient accumulation applies.

Usage: accumulation_worker.py CORPUS OUT DTYPE ZERO_STAGE. Builds the real Trainer (tiny BERT,
DeepSpeed over gloo in one process, dropout 0, no clipping), runs one step of 2 micro-batches of 8,
and prints JSON: the gradient norm the optimizer is handed, next to the norm of the mean of the two
micro-batches' gradients computed by a plain copy of the model in fp32.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from launch.config import load_config
from launch.pretrain.pretrain_config import PretrainConfig
from launch.pretrain.trainer import Trainer
from model import BertForPreTraining, pretraining_loss

MICRO, ACCUM = 8, 2


def main(corpus: Path, out: Path, dtype: str, stage: str) -> None:
    cfg = load_config(PretrainConfig, "tiny", [
        "schedule.total_steps=6", "log.eval_every=0", "log.tensorboard=false", "data.prefetch=0",
        f"data.micro_batch_size={MICRO}", f"data.global_batch_size={MICRO * ACCUM}", "optim.max_grad_norm=1e6",
        "model.fields.hidden_dropout_prob=0.0", "model.fields.attention_probs_dropout_prob=0.0",
        f"precision.dtype={dtype}", f"zero.stage={stage}"])
    trainer = Trainer(cfg, data_dir=corpus, run_dir=out)
    trainer.setup()
    trainer.engine.train()
    torch.manual_seed(cfg.seed)  # the trainer's own init: the same weights
    plain = BertForPreTraining(trainer.bert_config).float()
    batches = [trainer.loader.batch_at(MICRO * i) for i in range(ACCUM)]
    grads = []
    for b in batches:
        plain.zero_grad()
        o = plain(b["input_ids"], b["token_type_ids"], b["attention_mask"], b["masked_lm_positions"])
        pretraining_loss(o.mlm_logits, o.nsp_logits, b["masked_lm_ids"], b["next_sentence_label"])[0].backward()
        grads.append(torch.cat([p.grad.double().flatten() for p in plain.parameters()]))
    handed = []  # squared norms; ZeRO-1 in fp32 steps its inner optimizer once per parameter group
    trainer.scheduler.optimizer.register_step_pre_hook(lambda opt, *_: handed.append(sum(
        p.grad.double().pow(2).sum().item() for g in opt.param_groups for p in g["params"] if p.grad is not None)))
    trainer.run_step(iter((b, MICRO * (i + 1)) for i, b in enumerate(batches)))
    print(json.dumps({"optimizer": type(trainer.engine.optimizer).__name__, "handed_norm": sum(handed) ** 0.5,
                      "mean_norm": (sum(grads) / ACCUM).norm().item(),
                      "first_twice_norm": (2 * grads[0] + grads[1]).norm().item() / ACCUM}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4])
