"""Worker for test_lamb_zero.py: our LAMB driven by DeepSpeed ZeRO on every rank of a gloo group.

Usage (one process per rank, RANK/WORLD_SIZE/... set by launch.pretrain.launcher): lamb_worker.py OUT STAGE...
For each ZeRO stage it trains the same tiny BERT for 3 steps on fixed batches (rank r takes half r of
each batch) and rank 0 saves the consolidated fp32 parameters plus each rank's segment map.
"""

from __future__ import annotations

import sys
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.utils import safe_get_full_fp32_param

from launch.pretrain.optimizers import Lamb, attach_zero_partitioning, param_groups
from launch.pretrain.process_group import init_distributed
from launch.pretrain.worker import leave_process_group
from model import BertConfig, BertForPreTraining

STEPS, BATCH, SEQ, PRED = 3, 8, 16, 3
CLIP = 1.0  # global-norm clipping, done by DeepSpeed before our step (and by the reference)


def make_model() -> BertForPreTraining:
    torch.manual_seed(0)
    cfg = BertConfig.preset("tiny", vocab_size=101, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                            max_position_embeddings=32)
    return BertForPreTraining(cfg)


def make_batches() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(5, 101, (BATCH, SEQ), generator=g)
        out.append({
            "input_ids": ids,
            "token_type_ids": (torch.arange(SEQ) >= SEQ // 2).long().expand(BATCH, SEQ).contiguous(),
            "attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long),
            "masked_lm_positions": torch.randint(1, SEQ, (BATCH, PRED), generator=g),
            "masked_lm_ids": torch.randint(5, 101, (BATCH, PRED), generator=g),
            "next_sentence_label": torch.randint(0, 2, (BATCH,), generator=g),
        })
    return out


def loss_fn(model, b: dict[str, torch.Tensor]) -> torch.Tensor:
    out = model(b["input_ids"], b["token_type_ids"], b["attention_mask"], b["masked_lm_positions"])
    mlm = torch.nn.functional.cross_entropy(out.mlm_logits.reshape(-1, out.mlm_logits.shape[-1]), b["masked_lm_ids"].reshape(-1))
    return mlm + torch.nn.functional.cross_entropy(out.nsp_logits, b["next_sentence_label"])


def new_lamb(model) -> Lamb:
    return Lamb(param_groups(model, 0.01), lr=0.01, weight_decay=0.01)


def main(out: Path, stages: list[int]) -> None:
    init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    half = BATCH // world
    for stage in stages:
        model = make_model()
        params = list(model.parameters())
        lamb = new_lamb(model)
        ds = {"train_micro_batch_size_per_gpu": half, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": stage, "reduce_bucket_size": 5000, "allgather_bucket_size": 5000,
                                    "stage3_param_persistence_threshold": 0},
              "gradient_clipping": CLIP, "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False,
              "steps_per_print": 10**9}
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=lamb, config=ds)
        if stage == 3:
            deepspeed.zero.register_external_parameter(model.mlm, model.mlm.decoder_weight)
        attach_zero_partitioning(lamb, engine, params)
        for b in make_batches():
            mine = {k: v[rank * half:(rank + 1) * half] for k, v in b.items()}
            loss = loss_fn(engine, mine)
            engine.backward(loss)
            engine.step()
        full = [safe_get_full_fp32_param(p).clone() for p in params]
        segs = [(s.param_index, s.start, s.numel) for _, ss in lamb._segments.values() for s in ss]
        gathered = [None] * world
        dist.all_gather_object(gathered, segs)
        if rank == 0:
            torch.save({"params": full, "segments": gathered}, out / f"zero{stage}.pt")
        dist.barrier()
        engine.destroy()
    # As the trainer does: an exit with the gloo group open can abort in its communication thread
    # ("terminate called without an active exception", exit 134; seen once in CI).
    leave_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), [int(s) for s in sys.argv[2:]])
