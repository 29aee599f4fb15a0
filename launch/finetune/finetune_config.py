"""The fine-tuning configs, torch-free so `--help` is fast: `FinetuneConfig` (one fine-tuning run; CLI
flags, YAML and sweep trials all map here) and `FeaturesConfig` (`bertpipe features`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

# Other spellings of task names (`launch.finetune.tasks.get_task` takes them; here, torch-free, so that a
# config resolves its task's defaults from any spelling).
TASK_ALIASES = {
    "sst-2": "sst2", "sts-b": "stsb", "mnli-m": "mnli", "ner": "conll2003", "conll": "conll2003",
    "squad1.1": "squad", "squad-v1.1": "squad",
}


# What only the head of `finetune --feature-based` reads.
FEATURE_HEAD_SETTINGS = ("feature_lr", "feature_head", "lstm_hidden")
# The named `--layers` choices (launch/finetune/feature_extraction.py: parse_layers says what each takes).
NAMED_LAYERS = ("embeddings", "last", "second-to-last", "last4-concat", "last4-sum", "all-sum", "last4-weighted",
                "all-weighted")


def layers_error(spec: str) -> str | None:
    """Why a `--layers` value cannot be read, before any model is loaded (its range is checked against the
    model's depth later); None if it can."""
    if spec.strip() in NAMED_LAYERS:
        return None
    try:
        if [int(p) for p in spec.split(",") if p.strip()]:
            return None
    except ValueError:
        pass
    return f"--layers {spec!r} is not one of {', '.join(NAMED_LAYERS)} or a list of layer numbers like 9,10,11,12"


def canonical_task(name: str) -> str:
    """`SQuAD`, `squad1.1` -> `squad`; names not in the alias table are only lower-cased."""
    return TASK_ALIASES.get(name.lower(), name.lower())


@dataclass
class FinetuneConfig:
    """One fine-tuning run.

    Where:
      task: a name from `launch.finetune.tasks.task_names()` (sst2, mnli, squad, conll2003, swag, classify, ...).
      data_dir: the GLUE-download-like directory (DIR/SST-2/train.tsv) or one holding the task's own files.
      checkpoint: a bertpipe pre-training RUN directory or a Hugging Face BERT directory.
      out: output directory (metrics.json, predictions, log_history.json, learning_curve.png, tensorboard/, the model).
      vocab: optional vocabulary the user expects; refused unless it is the checkpoint's own.
    Optimisation (the paper's grid: batch 16/32, lr 5e-5/3e-5/2e-5, epochs 2/3/4):
      lr, batch_size, epochs, warmup (fraction of steps with linear warm-up, then linear decay),
      weight_decay (AdamW, not on biases and LayerNorm), max_grad_norm, seed.
      micro_batch_size: run each batch through the model in slices of this many examples and
        accumulate their gradients, for when a batch does not fit in memory (BERT-Large at seq 384 on
        a small GPU): the update is the whole batch's, so batch_size keeps its meaning.
    Data:
      max_seq_len; max_train_samples / max_eval_samples (a fixed random subset, the same for every
      seed, so seeds vary only the run); skip_malformed (count and skip bad lines instead of stopping);
      group_by_length: batch examples of similar length together (less padding, faster; random otherwise);
        None (default) groups sentence-level tasks and not token tasks, where it cost NER F1.
      text_column, text_pair_column, label_column: columns of the user's own data (classify/regress/tag).
      doc_stride, max_query_length, n_best, max_answer_length: SQuAD windows and answer decoding.
      doc_context: NER windows filled with the neighbouring sentences of the document.
    Run:
      freeze: fine-tune the task model with the encoder's weights fixed (its own head; the encoder still
        runs every step, with dropout). Not the paper's feature-based approach: that is feature_based.
      init: `random` keeps the checkpoint's architecture and vocabulary but draws fresh weights, the
        control run that shows what pre-training adds (`make demo` prints both).
    Feature-based (the paper's Table 7; launch/finetune/feature_based.py):
      feature_based: train a new head (feature_head: a two-layer BiLSTM of lstm_hidden units per
        direction then linear, or linear only; lr feature_lr) on the frozen activations of `layers`
        (any `bertpipe features --layers` choice, plus the learned ELMo-style weighted sums
        last4-weighted / all-weighted), computed once per checkpoint, data, split and max_seq_len and
        cached in feature_cache.
      unpad: run the encoder on the batch's real tokens only (projections, FFN and LayerNorm skip the
        padding; same maths). ~1.8-2x faster on NER's random batches, where padding is most of a batch.
      device: auto | cpu | cuda; precision: auto (bf16 autocast on CUDA, fp32 on CPU) | fp32 | bf16.
      threads: torch CPU threads (None: leave as set by OMP_NUM_THREADS).
      save_model: write the fine-tuned model (HF format) to OUT/model; sweeps turn it off by default.
      progress: show a progress bar.
    """

    task: str = ""  # sst2, mnli, qqp, qnli, cola, stsb, mrpc, rte, wnli, squad, conll2003, swag, classify, regress, tag
    data_dir: str = ""  # GLUE-download-like dir (DIR/SST-2/train.tsv) or one holding the task's own files
    checkpoint: str = ""  # a bertpipe pre-training RUN dir or a Hugging Face BERT dir
    out: str = ""  # output directory (metrics.json, predictions, log_history.json, learning_curve.png, tensorboard/, the model)
    vocab: str | None = None  # vocabulary you expect the checkpoint to use; refused unless it is the checkpoint's own
    lr: float = 2e-5  # peak learning rate (paper grid: 5e-5, 3e-5, 2e-5)
    batch_size: int = 32  # training batch size (paper grid: 16, 32)
    micro_batch_size: int | None = None  # examples through the model at once, for memory: each batch's gradient accumulates over slices this size (the same update); null: the whole batch
    eval_batch_size: int = 64  # evaluation batch size
    epochs: int = 3  # training epochs (paper grid: 2, 3, 4)
    warmup: float = 0.1  # fraction of steps with linear warm-up, then linear decay
    decay_over: Literal["after_warmup", "run"] = "after_warmup"  # the decay from the peak over the steps after warm-up (transformers' run_glue), or over the whole run (google-research/bert's run_classifier: 0.9 x peak when a 10% warm-up ends)
    weight_decay: float = 0.01  # AdamW weight decay, not on biases and LayerNorm
    adam_epsilon: float = 1e-6  # AdamW epsilon (the paper's code: 1e-6; transformers' default: 1e-8)
    max_grad_norm: float = 1.0  # gradient clipping (0 = off)
    seed: int = 42  # random seed of the head's init and the data order
    max_seq_len: int | None = None  # maximum tokens per input; null: 384 for squad (the paper's, as run_squad), else 128
    max_train_samples: int | None = None  # train on a fixed random subset of N examples (the same for every seed)
    max_eval_samples: int | None = None  # evaluate on a fixed random subset of N labelled examples (test files are predicted whole)
    skip_malformed: bool = False  # count and skip malformed lines instead of stopping at the first
    group_by_length: bool | None = None  # batch similar lengths together (faster); null: yes, except token tasks (NER)
    text_column: str = "text"  # classify/regress/tag: column with the text
    text_pair_column: str | None = None  # classify/regress: column with the second text of a pair
    label_column: str = "label"  # classify/regress/tag: column with the label
    doc_stride: int | None = None  # squad: tokens between the starts of context windows; null: 128 (the paper's, at seq 384) or half a window when that is shorter
    max_query_length: int = 64  # squad: question tokens kept
    n_best: int = 20  # squad: start/end candidates considered
    max_answer_length: int = 30  # squad: longest answer in tokens
    doc_context: bool = False  # conll2003: fill windows with the document's neighbouring sentences (-DOCSTART- marks documents)
    freeze: bool = False  # fine-tune the task model with the encoder's weights fixed (its head on the last layer, run each step with dropout; any task; saves the model); Table 7's cached approach is --feature-based
    feature_based: bool = False  # Table 7's feature-based approach: a new head on frozen activations of --layers, computed once and cached
    layers: str = "last"  # --feature-based: embeddings|second-to-last|last|last4-weighted|last4-concat|all-weighted|last4-sum|all-sum|N[,M...] (negative, from the top: --layers=-2,-1)
    feature_head: Literal["bilstm", "linear"] = "bilstm"  # --feature-based: two-layer BiLSTM then linear (the paper's), or linear only
    lstm_hidden: int = 768  # --feature-based: BiLSTM hidden size per direction (the paper's 768)
    feature_lr: float = 1e-3  # --feature-based: peak lr of the randomly initialised head (--lr is fine-tuning's)
    feature_cache: str | None = None  # --feature-based: activation cache dir (null: $XDG_CACHE_HOME/bertpipe/features, ~/.cache/...)
    unpad: bool = True  # run the encoder on real tokens only, skipping padding (same maths; faster where batches pad a lot)
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto = cuda if available, else cpu
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto = bf16 autocast on CUDA, fp32 on CPU
    threads: int | None = None  # torch CPU threads (null: as OMP_NUM_THREADS sets)
    save_model: bool = True  # write the fine-tuned model (HF format) to OUT/model
    progress: bool = True  # show a progress bar
    init: Literal["checkpoint", "random"] = "checkpoint"  # random: the checkpoint's architecture and vocabulary with fresh weights (the control that shows what pre-training adds)
    eval_every_epoch: bool = True  # evaluate on dev after every epoch (OUT/log_history.json, learning_curve.png)
    tensorboard: bool = True  # TensorBoard scalars in OUT/tensorboard/ (loss, lr per step; dev metrics per epoch)

    def __post_init__(self) -> None:
        if self.max_seq_len is None:  # resolved here, so the config a run saves says what it ran
            self.max_seq_len = 384 if canonical_task(self.task or "") == "squad" else 128

    def unused_settings(self) -> set[str]:
        """Fields this setup does not read: a sweep varying one would run copies of the same trial."""
        return {"lr"} if self.feature_based else set(FEATURE_HEAD_SETTINGS)

    def validate(self) -> None:
        """Refuse settings that cannot train, naming the flag to change."""
        for name in ("lr", "feature_lr", "warmup", "weight_decay", "adam_epsilon", "max_grad_norm"):  # inf passed the bounds
            if not math.isfinite(value := getattr(self, name)):
                raise ValueError(f"--{name.replace('_', '-')} must be a finite number, got {value}")
        checks = [
            (bool(self.task), "--task is required"),
            (bool(self.data_dir), "--data-dir is required"),
            (bool(self.checkpoint), "--checkpoint is required"),
            (bool(self.out), "--out is required"),
            (self.lr > 0, f"--lr must be positive, got {self.lr}"),
            (self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}"),
            (self.micro_batch_size is None or self.micro_batch_size >= 1,
             f"--micro-batch-size must be >= 1 (or null: the whole batch), got {self.micro_batch_size}"),
            (self.eval_batch_size >= 1, f"eval_batch_size must be >= 1, got {self.eval_batch_size}"),
            (self.epochs >= 1, f"--epochs must be >= 1, got {self.epochs}"),
            (0.0 <= self.warmup < 1.0, f"--warmup is a fraction of the steps in [0, 1), got {self.warmup}"),
            (self.weight_decay >= 0, f"--weight-decay must be 0 or more, got {self.weight_decay}"),
            (self.adam_epsilon > 0, f"--adam-epsilon must be positive, got {self.adam_epsilon}"),
            (self.max_grad_norm >= 0, f"--max-grad-norm must be 0 (off) or more, got {self.max_grad_norm}"),
            (self.threads is None or self.threads >= 1, f"--threads must be >= 1 (or null: as OMP_NUM_THREADS sets), "
                                                        f"got {self.threads}"),
            # Only CoNLL-2003 files mark their documents (-DOCSTART-); elsewhere the flag did nothing.
            (not self.doc_context or canonical_task(self.task or "") == "conll2003",
             f"--doc-context fills NER windows from the documents of CoNLL-2003 files (-DOCSTART- lines); "
             f"{self.task} has none: drop it"),
            (8 <= self.max_seq_len <= 512, f"--max-seq-len must be in [8, 512], got {self.max_seq_len}"),
            (self.max_train_samples is None or self.max_train_samples >= 1, "--max-train-samples must be >= 1"),
            (self.max_eval_samples is None or self.max_eval_samples >= 1, "--max-eval-samples must be >= 1"),
            (self.doc_stride is None or self.doc_stride >= 1, f"--doc-stride must be >= 1, got {self.doc_stride}"),
            (self.max_query_length >= 1, "--max-query-length must be >= 1"),
            (self.n_best >= 1 and self.max_answer_length >= 1, "--n-best and --max-answer-length must be >= 1"),
            (self.lstm_hidden >= 1, f"--lstm-hidden must be >= 1, got {self.lstm_hidden}"),
            (self.feature_lr > 0, f"--feature-lr must be positive, got {self.feature_lr}"),
            (not (self.freeze and self.feature_based), "--freeze and --feature-based are two different setups; choose one"),
            (self.feature_based or self.layers == "last",
             f"--layers {self.layers} chooses the frozen features of --feature-based; add --feature-based, or drop --layers"),
            (not self.feature_based or layers_error(self.layers) is None, layers_error(self.layers) or ""),
            (self.init == "checkpoint" or not (self.freeze or self.feature_based),
             "--init random with --freeze or --feature-based would train a head on random features; drop one"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


Pool = Literal["none", "cls", "mean"]


@dataclass
class FeaturesConfig:
    """`bertpipe features` settings (CLI flags map onto these fields)."""

    layers: str = "last"  # embeddings|last|second-to-last|last4-concat|last4-sum|all-sum|N[,M...] (negative: --layers=-2,-1); the learned *-weighted sums need finetune --feature-based
    pool: Pool = "mean"  # none: per-token vectors to Parquet; cls / mean: one vector per text to .npy
    batch_size: int = 32  # texts per forward pass
    max_seq_len: int = 512  # texts longer than this (in word pieces, with [CLS]/[SEP]) are truncated
    first_subtoken: bool = False  # pool=none: keep only the first word piece of each word, no [CLS]/[SEP]
    text_field: str = "text"  # the JSONL key holding the text
    device: str = "auto"  # auto = cuda if available, else cpu
    dtype: Literal["fp32", "bf16"] = "fp32"  # compute dtype
