"""`FinetuneConfig`: every knob of one fine-tuning run (CLI flags, YAML and sweep trials all map here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class FinetuneConfig:
    """One fine-tuning run.

    Where:
      task: a name from `launch.finetune.tasks.task_names()` (sst2, mnli, squad, conll2003, swag, classify, ...).
      data_dir: the GLUE-download-like directory (DIR/SST-2/train.tsv) or one holding the task's own files.
      checkpoint: a bertpipe pre-training RUN directory or a Hugging Face BERT directory.
      out: output directory (metrics.json, predictions, the fine-tuned model).
      vocab: optional vocabulary the user expects; refused unless it is the checkpoint's own.
    Optimisation (the paper's grid: batch 16/32, lr 5e-5/3e-5/2e-5, epochs 2/3/4):
      lr, batch_size, epochs, warmup (fraction of steps with linear warm-up, then linear decay),
      weight_decay (AdamW, not on biases and LayerNorm), max_grad_norm, seed.
    Data:
      max_seq_len; max_train_samples / max_eval_samples (a fixed random subset, the same for every
      seed, so seeds vary only the run); skip_malformed (count and skip bad lines instead of stopping);
      group_by_length: batch examples of similar length together (less padding, faster; random otherwise).
      text_column, text_pair_column, label_column: columns of the user's own data (classify/regress/tag).
      doc_stride, max_query_length, n_best, max_answer_length: SQuAD windows and answer decoding.
      doc_context: NER windows filled with the neighbouring sentences of the document.
    Run:
      freeze: train only the task head on frozen BERT features (the feature-based approach, cheap).
      device: auto | cpu | cuda; precision: auto (bf16 autocast on CUDA, fp32 on CPU) | fp32 | bf16.
      threads: torch CPU threads (None: leave as set by OMP_NUM_THREADS).
      save_model: write the fine-tuned model (HF format) to OUT/model; sweeps turn it off by default.
      progress: show a progress bar.
    """

    task: str = ""
    data_dir: str = ""
    checkpoint: str = ""
    out: str = ""
    vocab: str | None = None
    lr: float = 2e-5
    batch_size: int = 32
    eval_batch_size: int = 64
    epochs: int = 3
    warmup: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 42
    max_seq_len: int = 128
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    skip_malformed: bool = False
    group_by_length: bool = True
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"
    doc_stride: int = 128
    max_query_length: int = 64
    n_best: int = 20
    max_answer_length: int = 30
    doc_context: bool = False
    freeze: bool = False
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    threads: int | None = None
    save_model: bool = True
    progress: bool = True

    def validate(self) -> None:
        """Refuse settings that cannot train, naming the flag to change."""
        checks = [
            (bool(self.task), "--task is required"),
            (bool(self.data_dir), "--data-dir is required"),
            (bool(self.checkpoint), "--checkpoint is required"),
            (bool(self.out), "--out is required"),
            (self.lr > 0, f"--lr must be positive, got {self.lr}"),
            (self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}"),
            (self.eval_batch_size >= 1, f"eval_batch_size must be >= 1, got {self.eval_batch_size}"),
            (self.epochs >= 1, f"--epochs must be >= 1, got {self.epochs}"),
            (0.0 <= self.warmup < 1.0, f"--warmup is a fraction of the steps in [0, 1), got {self.warmup}"),
            (8 <= self.max_seq_len <= 512, f"--max-seq-len must be in [8, 512], got {self.max_seq_len}"),
            (self.max_train_samples is None or self.max_train_samples >= 1, "--max-train-samples must be >= 1"),
            (self.max_eval_samples is None or self.max_eval_samples >= 1, "--max-eval-samples must be >= 1"),
            (1 <= self.doc_stride, f"--doc-stride must be >= 1, got {self.doc_stride}"),
            (self.max_query_length >= 1, "--max-query-length must be >= 1"),
            (self.n_best >= 1 and self.max_answer_length >= 1, "--n-best and --max-answer-length must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
