"""Everything `bertpipe pretrain` can refuse before a process starts or a step runs: the config against the
corpus (vocabulary, seq_len, batch and world size) and, last, every shard's sha256. The CLI calls it before
it launches workers; the trainer again on every rank (cheap, but for the shard hashes: once per launch)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from launch.pretrain.pretrain_config import PretrainConfig, validate
from pipeline.corpus_info import CorpusInfo, open_corpus
from pipeline.manifest import verify_shards

# Set once this process has checked the corpus's shards; inherited by the workers it starts.
SHARDS_VERIFIED_ENV = "BERTPIPE_SHARDS_VERIFIED"


def in_this_process(check: Callable[[], Any]) -> Any:
    return check()


def preflight(cfg: PretrainConfig, corpus: CorpusInfo | Path, *, world_size: int, device_type: str,
              run_check: Callable[[Callable[[], Any]], Any] | None = in_this_process) -> tuple[Any, int]:
    """Everything that can be refused before any process starts, each checked once here (the corpus
    directory itself by `open_corpus`); returns the model's BertConfig and the gradient accumulation.

    `run_check` runs the shard check: here, on rank 0 for every rank (the trainer's `on_rank0`), or not at
    all (None: the CLI under a launcher leaves it to the trainer, whose rank 0 does it once)."""
    from model import BertConfig

    grad_accum = validate(cfg, world_size=world_size, device_type=device_type)
    corpus = corpus if isinstance(corpus, CorpusInfo) else open_corpus(corpus)
    data_dir, manifest = corpus.dir, corpus.manifest
    corpus_vocab = corpus.vocab.size
    vocab_size = cfg.model.vocab_size or corpus_vocab
    if vocab_size < corpus_vocab:
        raise ValueError(f"model.vocab_size={vocab_size} is smaller than the corpus vocabulary ({corpus_vocab} "
                         f"tokens, {corpus.vocab_file}); set model.vocab_size=null to take the corpus's")
    bert_cfg = BertConfig.preset(cfg.model.preset, vocab_size=vocab_size, **cfg.model.fields)  # fields checked by validate
    if int(manifest["seq_len"]) > bert_cfg.max_position_embeddings:
        raise ValueError(f"the corpus has seq_len {manifest['seq_len']} but the model has only "
                         f"{bert_cfg.max_position_embeddings} positions; raise model.fields.max_position_embeddings "
                         f"or rebuild the corpus with a shorter --seq-len")
    train = corpus.num_instances("train")
    if train == 0:
        raise ValueError(f"the corpus {data_dir} has no training instances (its manifest.json counters say what "
                         "was skipped and why); rebuild it from more input")
    corpus.check_fits(cfg.data.global_batch_size)
    # Last, as it reads every shard: a damaged shard is named here, not found mid-run. Once per launch: workers
    # of `bertpipe pretrain --nproc N` skip it (their parent just did it); under a launcher the trainer's
    # `run_check` is `on_rank0` (64 ranks each hashing the whole corpus read it 64 times from shared storage).
    if run_check is not None and os.environ.get(SHARDS_VERIFIED_ENV) != str(Path(data_dir).resolve()):
        run_check(lambda: verify_shards(data_dir, manifest))
        os.environ[SHARDS_VERIFIED_ENV] = str(Path(data_dir).resolve())
    return bert_cfg, grad_accum
