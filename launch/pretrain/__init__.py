"""Pre-training: the DeepSpeed trainer and what it owns.

- `pretrain_config.PretrainConfig`: the typed config (presets in `launch/configs/`);
  `deepspeed_config.build_ds_config` generates DeepSpeed's JSON from it.
- `trainer.Trainer`: step, log, checkpoint, evaluate; `optimizers` (AdamW, ZeRO-correct LAMB),
  `schedule` (the LR schedule), `checkpoints` (atomic save, resume), `training_log` (metrics.jsonl,
  TensorBoard, progress).
- `worker.main`: the per-process entry point (`python -m launch.pretrain` under `deepspeed`,
  `torchrun` or `bertpipe pretrain --nproc N`, whose local launch is `launcher`); `torchrun.main`:
  torchrun exiting with the failed worker's own code (`python -m launch.pretrain.torchrun`);
  `deepspeed_runner.main`: DeepSpeed's runner exiting 128 + N, not 0, when its mpirun is killed by signal N.
- `hf_export`: a run's checkpoint -> Hugging Face directory.
"""
