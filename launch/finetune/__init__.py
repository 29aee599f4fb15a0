"""Fine-tuning on downstream tasks: readers for the official layouts, metrics, features, a runner.

- `tasks.get_task(name)`: the task registry (GLUE, SQuAD v1.1, CoNLL-2003, SWAG, and the user's own
  data as `classify` / `regress` / `tag`).
- `runner.FinetuneConfig` + `runner.finetune(cfg)`: one fine-tuning run from one checkpoint; writes
  `OUT/metrics.json`, dev predictions, test predictions (GLUE submission form) and the fine-tuned model.
- `launch.finetune.tune_sweep.run_sweep(...)` runs many of these as Ray Tune trials.
"""

from launch.finetune.examples import DataError

__all__ = ["DataError"]
