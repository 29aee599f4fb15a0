"""The corpus job: `run(config, beam_args)` builds and runs the Beam pipeline, then the manifest.

    files -> ReadDocuments -> TokenizeDocuments -> CreateInstances -> WriteShards -> shard files
                  \\________________\\______________ dead letters (ids + reasons) -> dead_letter/

Shaped like Beam's `wordcount.py`: options in, pipeline out. Every stage is a composite PTransform
in its own module. The local default runner is named (`FnApiRunner`), so Beam never tries to
download Prism; any other runner and its options pass through untouched.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import logging
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.atomic_write import write_text_atomic
from pipeline.record_files import WriteRecordFiles, read_jsonl_records, read_record_files
from pipeline.corpus_output import (TMP, WriteDeadLetters, clear_previous_output, delete_tree, is_remote, mark_unfinished, outside,
                                    refuse_inputs_in_out, same_file)
from pipeline.named_writes import write_file
from pipeline.instances import InstanceSettings
from pipeline.masking import MaskingVocab
from pipeline.nsp import CreateInstances, SplitSettings
from pipeline.readers import FORMATS as INPUT_FORMATS
from pipeline.progress import ProgressReporter, local_progress_dir
from pipeline.shards import WriteShards
from pipeline.sources import DEAD_LETTER, ReadDocuments, expand_inputs
from pipeline.tokenize import TokenizeDocuments
from pipeline.vocab import SPECIAL_TOKENS, build_tokenizer, read_vocab_tokens, vocab_is_cased
from pipeline.vocab_training import CountWords, read_count_files, train_wordpiece
from pipeline.manifest import FORMAT, FORMAT_VERSION

log = logging.getLogger(__name__)

SEQ_LEN_RANGE = (8, 4096)
# BERT's vocab.txt is 0.2 MB, a 250,000-token multilingual one about 5 MB: far more is not a vocabulary,
# and reading it whole cost memory without bound (/dev/zero grew until the kernel killed the command).
VOCAB_MAX_BYTES = 64 << 20
# Beam decompresses a vocab by its name's suffix; one compressed under a plain name is told by its first bytes.
COMPRESSED_MAGIC = {b"BZh": "bzip2", b"\x1f\x8b": "gzip", b"\xfd7zXZ\x00": "xz", b"PK\x03\x04": "zip"}
LOCAL_RUNNER = "FnApiRunner"

@dataclass
class CorpusConfig:
    """Settings of one corpus build (saved in the manifest as `config`)."""

    inputs: list[str] = field(default_factory=list)  # files, directories, globs (any Beam filesystem)
    out: str = ""  # output directory
    vocab: str | None = None  # a BERT vocab.txt, or None with train_vocab_size
    train_vocab_size: int | None = None  # train a WordPiece vocab of this size on the input
    seq_len: int = 128  # [CLS] A [SEP] B [SEP], at most this many tokens
    dupe_factor: int = 5  # copies of each document with different segmentation and masks
    seed: int = 12345  # global seed; the output is a function of the inputs and the seed
    masked_lm_prob: float = 0.15  # share of (non-special) tokens masked
    max_predictions: int = 20  # cap on masked tokens per instance
    short_seq_prob: float = 0.1  # share of documents (each copy) given a shorter random target length
    whole_word_mask: bool = False  # mask all pieces of a word together
    lowercase: bool | None = None  # None: uncased unless the vocab is cased
    num_shards: int = 0  # train shards; 0 = one per `instances_per_shard`
    instances_per_shard: int = 100_000  # shard size when num_shards is 0
    heldout_fraction: float = 0.02  # share of whole documents in the heldout split
    docs_per_bucket: int = 1000  # NSP negatives come from a bucket of about this many documents
    input_format: str = "auto"  # auto | wiki-xml | text | lines | jsonl | wikiextractor
    shard_format: str = "arrow"  # arrow | parquet
    max_document_bytes: int = 16_000_000  # larger documents are skipped (counted, dead-lettered)
    max_unk_share: float = 0.05  # fail when more word pieces than this are [UNK] (the vocab does not fit the text)
    progress_seconds: float = 10.0  # log a progress line this often while the job runs (0: never)

    def validate(self) -> None:
        """Raise `ValueError` (what to change) before any work starts."""
        lo, hi = SEQ_LEN_RANGE
        if not lo <= self.seq_len <= hi:
            raise ValueError(f"--seq-len {self.seq_len} is out of range; use {lo}..{hi} (BERT uses 128 and 512)")
        if (self.vocab is None) == (self.train_vocab_size is None):
            raise ValueError("give exactly one of --vocab VOCAB.txt or --train-vocab-size N")
        if self.vocab is not None and not FileSystems.exists(self.vocab):
            raise ValueError(f"vocab file {self.vocab} does not exist; pass a BERT vocab.txt or --train-vocab-size N")
        if self.train_vocab_size is not None and not 100 <= self.train_vocab_size <= 1_000_000:
            raise ValueError("--train-vocab-size must be between 100 and 1000000 (BERT uses 30522)")
        checks = [
            (self.dupe_factor >= 1, "--dupe-factor must be at least 1"),
            (0.0 < self.masked_lm_prob < 1.0, "--masked-lm-prob must be in (0, 1)"),
            (self.max_predictions >= 1, "--max-predictions must be at least 1"),
            (0.0 <= self.short_seq_prob <= 1.0, "--short-seq-prob must be in [0, 1]"),
            (0.0 <= self.heldout_fraction < 1.0, "--heldout-fraction must be in [0, 1)"),
            (self.num_shards >= 0, "--num-shards must be 0 (auto) or more"),
            (self.instances_per_shard >= 1, "--instances-per-shard must be at least 1"),
            (self.docs_per_bucket >= 2, "--docs-per-bucket must be at least 2"),
            (self.input_format in INPUT_FORMATS, f"--format {self.input_format!r} is not one of {' | '.join(INPUT_FORMATS)}"),
            (self.shard_format in ("arrow", "parquet"), "--shard-format must be arrow or parquet"),
            (self.max_document_bytes >= 1024, "--max-document-bytes must be at least 1024"),
            (self.progress_seconds >= 0, "--progress-seconds must be 0 (off) or more"),
            (0.0 <= self.max_unk_share <= 1.0, "--max-unk-share is a share in [0, 1]"),
            (bool(self.inputs), "give at least one --input"),
            (bool(self.out), "give --out DIR"),
            (not os.path.isfile(self.out), f"--out {self.out} is a file; pass a directory"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


@dataclass
class CorpusResult:
    out: Path
    manifest: dict
    seconds: float


def pipeline_options(beam_args: Sequence[str]) -> PipelineOptions:
    """Beam options with the local runner named explicitly (never the Prism download)."""
    args = list(beam_args)
    if not any(a == "--runner" or a.startswith("--runner=") for a in args):
        args.append(f"--runner={LOCAL_RUNNER}")
    workers = [a for a in args if a.startswith("--direct_num_workers")]
    if workers and not any(a.startswith("--direct_running_mode") for a in args):
        # Several local workers only run in parallel as separate processes (the GIL).
        args.append("--direct_running_mode=multi_processing")
    return PipelineOptions(args)


def return_large_frees_to_os() -> bool:
    """Fix glibc's mmap threshold at its default 128 KiB, so freed large blocks go back to the OS.

    The local runner holds each stage's output as ~1 MB chunks and frees them stage by stage.
    glibc raises its mmap threshold to the size of each mmapped block freed (up to 32 MB), after
    which such blocks come from the heap, where freed memory stays in the process: the peak RSS
    then tracks the largest sum of stages seen, not the data alive. Measured on 4x the bench's
    book input: peak 487 -> 417 MB (1x: 349 -> 328 MB), and not slower (23.0 vs 28.3 s, A/B
    medians under load). A no-op outside glibc (macOS, musl). Returns whether it was applied.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_mmap_threshold = -3  # <malloc.h> M_MMAP_THRESHOLD
    return bool(mallopt(m_mmap_threshold, 128 * 1024))


def _counters(result) -> dict[str, int]:
    totals: dict[str, int] = defaultdict(int)
    for counter in result.metrics().query(MetricsFilter())["counters"]:
        if counter.key.metric.namespace != "corpus":
            continue
        value = counter.committed if counter.committed is not None else counter.attempted
        totals[counter.key.metric.name] += int(value or 0)
    return dict(sorted(totals.items()))












def _check_result(config: CorpusConfig, counters: dict[str, int], instances: int, num_files: int,
                  trained: int | None) -> None:
    """Refuse a corpus that is not one: no instances at all, or a vocabulary that turned the text into [UNK].
    `trained`: the size of the vocabulary trained here (None: --vocab)."""
    skipped = {k: v for k, v in counters.items() if k.startswith("skipped_") and v}
    if instances == 0:
        why = ", ".join(f"{k} {v}" for k, v in skipped.items()) or "nothing was skipped: the input holds no text"
        raise ValueError(f"no instances were produced from {num_files} input file(s) ({why}); check --input "
                         f"and --format; dead_letter/ in --out lists the skipped records")
    tokens, unk = counters.get("tokens", 0), counters.get("unk_tokens", 0)
    if tokens and unk / tokens > config.max_unk_share:
        fix = (f"the input is too small to train a vocabulary: {trained} tokens were learnt where --train-vocab-size "
               f"{config.train_vocab_size} asked for more; give more text, or pass --vocab"
               if trained is not None and trained < config.train_vocab_size
               else f"a vocabulary of --train-vocab-size {config.train_vocab_size} cannot spell this text's characters; "
               "raise --train-vocab-size" if config.vocab is None  # trained here: too small to spell it
               else "the vocabulary does not fit this text. Pass the BERT WordPiece vocab.txt made for it (cased or "
               "uncased like the text) or --train-vocab-size N"
               + ("; drop --no-lowercase if the vocab is uncased" if config.lowercase is False else ""))
        raise ValueError(f"{unk / tokens:.1%} of the {tokens:,} word pieces are [UNK] (limit --max-unk-share "
                         f"{config.max_unk_share}): {fix}; --max-unk-share 1 accepts it as it is")


def _train_vocab(config: CorpusConfig, files: list[str], lowercase: bool, options: PipelineOptions, tmp: str) -> tuple[str, dict]:
    log.info("stage 1/2: counting words of %d files to train a %d-token vocabulary", len(files), config.train_vocab_size)
    with beam.Pipeline(options=options) as p:
        read = p | "Files" >> beam.Create(files) | "Read" >> ReadDocuments(config.input_format, config.max_document_bytes)
        (
            read.documents
            | "CountWords" >> CountWords(lowercase)
            | "Json" >> beam.Map(lambda kv: json.dumps(list(kv), ensure_ascii=False))
            | "Write" >> WriteRecordFiles(tmp, "word_counts")
        )
    counters = _counters(p.result)
    counts = read_count_files(read_record_files(tmp, "word_counts"))
    tokens = train_wordpiece(counts, config.train_vocab_size, lowercase)
    log.info("trained a vocabulary of %d tokens from %d distinct words", len(tokens), len(counts))
    return "\n".join(tokens) + "\n", {k: v for k, v in counters.items() if k.startswith("vocab_")}




def _read_vocab_file(path: str) -> str:
    """The text of `--vocab`; `ValueError` naming the file when it cannot be read, is not a regular file,
    is too large for a vocabulary, or is not UTF-8."""
    if not is_remote(path) and os.path.exists(path) and not (os.path.isfile(path) or os.path.isdir(path)):
        # Reading a named pipe blocks until a writer comes; a device (/dev/zero) never ends.
        raise ValueError(f"--vocab {path} is not a regular file (a named pipe, socket or device); "
                         "write the vocabulary to a file and pass that")
    if (size := _vocab_size(path)) is not None:
        _refuse_large_vocab(path, size)
    try:  # `vocab.txt.gz` is read decompressed, as before; the read is bounded either way
        with FileSystems.open(path) as f:
            raw = f.read(VOCAB_MAX_BYTES + 1)  # a remote file's size may be unknown, a decompressed one's is
    except OSError as err:  # a directory, or no permission
        raise ValueError(f"vocab file {path} cannot be read ({err}); pass a BERT vocab.txt") from None
    if len(raw) > VOCAB_MAX_BYTES:
        _refuse_large_vocab(path, None)
    try:
        return raw.decode("utf-8-sig")  # a BOM (Notepad) would otherwise turn [PAD] into "\ufeff[PAD]"
    except UnicodeDecodeError as err:
        packed = next((kind for magic, kind in COMPRESSED_MAGIC.items() if raw.startswith(magic)), None)
        if packed:
            raise ValueError(f"vocab {path} is {packed}-compressed under a name that does not say so; decompress "
                             "it, or name it for its compression (vocab.txt.gz)") from None
        raise ValueError(f"vocab {path} is not UTF-8 text ({err}); pass a BERT vocab.txt") from None


def _vocab_size(path: str) -> int | None:
    try:
        return FileSystems.get_filesystem(path).size(path)  # not `match`: a `[` or `*` in the name is no pattern
    except (OSError, NotImplementedError):  # Beam's BeamIOError is an OSError; some file systems have no sizes
        return None


def _refuse_large_vocab(path: str, size: int | None) -> None:
    """`ValueError` for a `--vocab` over VOCAB_MAX_BYTES (`size` None: read past it, its size unknown)."""
    if size is not None and size <= VOCAB_MAX_BYTES:
        return  # the file on disk may still decompress to more: the bounded read catches that
    said = f"{size:,} bytes" if size is not None else f"over {VOCAB_MAX_BYTES:,} bytes"
    raise ValueError(f"--vocab {path} is {said}, too large for a vocabulary (at most {VOCAB_MAX_BYTES >> 20} MB; "
                     "BERT's vocab.txt is 0.2 MB): pass the vocab.txt itself")


def _vocab_ids(vocab_text: str, source: str, lowercase: bool) -> tuple[MaskingVocab, int, int]:
    """(masking vocab, [CLS] id, [SEP] id), after every check the workers' tokenizer would make;
    `ValueError` naming `source` otherwise, so that no worker fails on the vocabulary mid-job."""
    tokens = read_vocab_tokens(vocab_text)
    missing = [t for t in SPECIAL_TOKENS if t not in set(tokens)]
    if missing:
        raise ValueError(f"vocab {source} lacks {' '.join(missing)}; a BERT vocab.txt needs "
                         f"{' '.join(SPECIAL_TOKENS)}, one token per line")
    # Twice: the corpus would take [CLS]/[SEP] at their first line, masking and the tokenizer at their last,
    # and [CLS]/[SEP] positions be masked as if they were words.
    twice = [t for t in SPECIAL_TOKENS if tokens.count(t) > 1]
    if twice:
        lines = [i + 1 for i, t in enumerate(tokens) if t == twice[0]]
        raise ValueError(f"vocab {source} lists {twice[0]} {len(lines)} times (lines {', '.join(map(str, lines))}); "
                         "each special token needs exactly one line")
    if len(set(tokens)) < len(tokens):
        log.warning("vocab %s lists %d token(s) more than once; each keeps the id of its last line", source,
                    len(tokens) - len(set(tokens)))
    try:
        build_tokenizer(tokens, lowercase, specials_in_text=False)  # what `TokenizeDocuments` builds on every worker
        masking_vocab = MaskingVocab.from_tokens(tokens)
    except ValueError as err:
        raise ValueError(f"vocab {source}: {err}") from err
    return masking_vocab, tokens.index("[CLS]"), tokens.index("[SEP]")


def _lowercase(config: CorpusConfig, vocab_text: str) -> bool:
    return config.lowercase if config.lowercase is not None else not vocab_is_cased(read_vocab_tokens(vocab_text))


def run(config: CorpusConfig, beam_args: Sequence[str] = ()) -> CorpusResult:
    """Build the corpus in `config.out`; raises `ValueError` for bad settings before any work."""
    options = pipeline_options(beam_args)
    # Before any path is looked at: Beam hands a file system its options (--hdfs_host, --s3_endpoint_url,
    # credentials) only when a Pipeline is built, and HDFS and S3 refuse to work without them.
    FileSystems.set_options(options)
    config.validate()
    start = time.time()
    refuse_inputs_in_out(config.inputs, config.out)
    files = outside(expand_inputs(config.inputs), config.out)
    text_files = [f for f in files if not (config.vocab and same_file(f, config.vocab))]
    if len(text_files) < len(files):  # `--input data --vocab data/vocab.txt`
        log.info("not reading --vocab %s as text", config.vocab)
        if not text_files:
            raise ValueError(f"the only input file is --vocab {config.vocab}; give the text with --input")
        files = text_files
    runner = options.view_as(beam.options.pipeline_options.StandardOptions).runner
    if runner == LOCAL_RUNNER:  # this process holds every stage's output
        log.debug("glibc mmap threshold fixed: %s", return_large_frees_to_os())
    if config.vocab is not None:
        # Checked in full before the output directory is touched: a bad vocab must not cost the last
        # corpus. Only what needs the job itself (a trained vocab, the result) is checked later.
        vocab_text = _read_vocab_file(config.vocab)
        lowercase = _lowercase(config, vocab_text)
        vocab_ids = _vocab_ids(vocab_text, config.vocab, lowercase)
    out = config.out.rstrip("/")
    users_vocab = clear_previous_output(out, config.vocab, vocab_text if config.vocab is not None else None)
    # Before the job writes anything: dead letters and shards may come before its other temp files.
    mark_unfinished(out, users_vocab)
    tmp = FileSystems.join(out, TMP)
    extra_counters: dict[str, int] = {}

    if config.vocab is None:
        lowercase = True if config.lowercase is None else config.lowercase
        vocab_text, extra_counters = _train_vocab(config, files, lowercase, options, tmp)
        vocab_ids = _vocab_ids(vocab_text, "trained by --train-vocab-size", lowercase)
    tokens = read_vocab_tokens(vocab_text)
    masking_vocab, cls_id, sep_id = vocab_ids

    settings = InstanceSettings(
        seq_len=config.seq_len, short_seq_prob=config.short_seq_prob, masked_lm_prob=config.masked_lm_prob,
        max_predictions=config.max_predictions, whole_word_mask=config.whole_word_mask, cls_id=cls_id, sep_id=sep_id,
    )
    split_settings = SplitSettings(config.seed, config.heldout_fraction, config.docs_per_bucket, config.dupe_factor)
    stage = "stage 2/2" if config.vocab is None else "corpus"
    log.info("%s: %d input files -> %s (runner %s)", stage, len(files), out, runner)

    progress_dir = local_progress_dir(tmp) if config.progress_seconds > 0 else None
    with ProgressReporter(progress_dir, config.progress_seconds), beam.Pipeline(options=options) as p:
        read = p | "Files" >> beam.Create(files) | "Read" >> ReadDocuments(config.input_format, config.max_document_bytes)
        tokenized = read.documents | "Tokenize" >> TokenizeDocuments(vocab_text, lowercase, progress_dir)
        shards = (
            tokenized.documents
            | "Instances" >> CreateInstances(split_settings, settings, masking_vocab, progress_dir)
            | "Shards" >> WriteShards(out, config.shard_format, config.num_shards, config.instances_per_shard)
        )
        shards | "ShardInfo" >> beam.Map(json.dumps) | "WriteShardInfo" >> WriteRecordFiles(tmp, "shards")
        (
            (read[DEAD_LETTER], tokenized[DEAD_LETTER])
            | "DeadLetters" >> beam.Flatten()
            | "WriteDeadLetters" >> WriteDeadLetters(out)
        )
    counters = {**_counters(p.result), **extra_counters}

    shard_infos = sorted(read_jsonl_records(read_record_files(tmp, "shards")), key=lambda s: (s["split"] != "train", s["path"]))
    # Checked before the manifest is written: a failed corpus stays recognisably unfinished.
    _check_result(config, counters, sum(s["num_instances"] for s in shard_infos), len(files),
                  len(tokens) if config.vocab is None else None)
    train = [s["num_instances"] for s in shard_infos if s["split"] == "train"]
    if not any(train):  # the documents that train made none
        raise ValueError(f"every instance went to the heldout split, none to training (--heldout-fraction "
                         f"{config.heldout_fraction} of a few documents); lower --heldout-fraction or add input")
    if config.num_shards and train.count(0):  # each a file to write, list, hash and open for nothing (5,000: 21 MB)
        log.warning("%d of the %d train shards are empty: --num-shards %d is more than the corpus's %d training "
                    "instances fill; lower it", train.count(0), len(train), config.num_shards, sum(train))
    if not (config.vocab and same_file(FileSystems.join(out, "vocab.txt"), config.vocab)):  # else: already these bytes
        write_file(FileSystems.join(out, "vocab.txt"), vocab_text.encode("utf-8"))  # a full disk's error names it
    cfg = dataclasses.asdict(config)
    cfg["lowercase"] = lowercase
    cfg["inputs"] = sorted(set(config.inputs))  # the same inputs in any order: the same manifest bytes
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "seed": config.seed,
        "seq_len": config.seq_len,
        "dupe_factor": config.dupe_factor,
        "masked_lm_prob": config.masked_lm_prob,
        "max_predictions": config.max_predictions,
        "short_seq_prob": config.short_seq_prob,
        "whole_word_mask": config.whole_word_mask,
        "lowercase": lowercase,
        "vocab_file": "vocab.txt",
        "vocab_sha256": hashlib.sha256(vocab_text.encode("utf-8")).hexdigest(),
        "vocab_size": len(tokens),
        "vocab_is_users": users_vocab,  # --vocab OUT/vocab.txt: the user's file, never deleted with this corpus
        "shard_format": config.shard_format,
        "num_instances": sum(s["num_instances"] for s in shard_infos),
        "shards": shard_infos,
        "counters": counters,
        "inputs": files,
        "config": cfg,
    }
    # The manifest marks a finished corpus: never half there. Locally written aside and renamed; an object
    # store makes an object visible only once it is whole.
    text = json.dumps(manifest, indent=2, sort_keys=False)
    if is_remote(out):
        with FileSystems.create(FileSystems.join(out, "manifest.json")) as f:
            f.write(text.encode("utf-8"))
    else:
        write_text_atomic(os.path.join(out, "manifest.json"), text)
    for attempt in range(5):  # a late worker (a portable runner's teardown) may still write a progress file
        try:
            delete_tree(tmp)
            break
        except OSError as err:
            if attempt == 4:
                log.warning("could not remove the job's temp folder %s (%s); the corpus is complete", tmp, err)
            time.sleep(0.5)
    log.info("corpus done in %.1f s: %s instances in %d shards; counters %s", time.time() - start,
             f"{manifest['num_instances']:,}", len(shard_infos), json.dumps(counters))
    return CorpusResult(Path(out), manifest, time.time() - start)
