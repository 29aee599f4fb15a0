"""Build a sharded, masked, NSP-paired Arrow corpus with Apache Beam; or `inspect DIR` one.

  bertpipe corpus --input PATH [PATH ...] (--vocab VOCAB.txt | --train-vocab-size N) --out DIR [options]
  bertpipe corpus inspect DIR

Inputs: files, directories (recursive; hidden, *.json, *.part, checksum files skipped) and globs on
any Beam filesystem; gzip/bz2 (multistream too) are read transparently. Formats: MediaWiki XML
dumps, plain-text books, one-sentence-per-line text, JSONL with a "text" field.

Runs locally on Beam's FnApiRunner by default (--direct_num_workers=N for N processes). Any other
Beam option passes through unchanged, e.g.
  --runner=FlinkRunner --flink_master=host:8081 --environment_type=LOOPBACK
  --runner=SparkRunner --spark_master_url=spark://host:7077
  --runner=DataflowRunner --project=P --region=R --temp_location=gs://B/tmp
"""

from __future__ import annotations

import argparse
import logging
import types

from launch.errors import CliError
from launch.log import setup_logging

log = logging.getLogger(__name__)


def _parse_with_beam_args(self, args=None, namespace=None):
    """parse_args that keeps unknown `--beam_option` flags for Beam instead of refusing them."""
    ns, extra = argparse.ArgumentParser.parse_known_args(self, args, namespace)
    beam_args, errors = [], []
    i = 0
    while i < len(extra):
        arg = extra[i]
        if not arg.startswith("--"):
            errors.append(arg)
        elif "-" in arg.split("=", 1)[0][2:]:
            # Beam's options use underscores; a dashed unknown flag is a typo of one of ours.
            errors.append(arg)
        else:
            beam_args.append(arg)
            # `--flag value` form: keep the value with its flag.
            if "=" not in arg and i + 1 < len(extra) and not extra[i + 1].startswith("--"):
                beam_args.append(extra[i + 1])
                i += 1
        i += 1
    if errors:
        self.error(f"unrecognized arguments: {' '.join(errors)} (Beam options are spelled --like_this)")
    ns.beam_args = beam_args
    return ns


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.parse_args = types.MethodType(_parse_with_beam_args, parser)
    parser.add_argument("action", nargs="*", metavar="inspect DIR | key=value",
                        help="`inspect DIR`: print a corpus's manifest stats and a few decoded instances; "
                        "otherwise dotted overrides of the config, e.g. seq_len=512 dupe_factor=10")
    parser.add_argument("--config", metavar="CORPUS.yaml",
                        help="a YAML file of corpus settings (the keys of the manifest's `config`); "
                        "flags and key=value overrides given on the command line win")
    parser.add_argument("--input", default=argparse.SUPPRESS, nargs="+", metavar="PATH",
                        help="input files, directories or globs (local or any Beam filesystem)")
    vocab = parser.add_mutually_exclusive_group()
    vocab.add_argument("--vocab", default=argparse.SUPPRESS, metavar="VOCAB.txt", help="a BERT WordPiece vocab.txt (cased or uncased)")
    vocab.add_argument("--train-vocab-size", default=argparse.SUPPRESS, type=int, metavar="N", help="train a WordPiece vocab of N tokens on the input")
    parser.add_argument("--out", default=argparse.SUPPRESS, metavar="DIR", help="output directory (manifest.json, vocab.txt, shards, dead_letter/)")
    parser.add_argument("--seq-len", default=argparse.SUPPRESS, type=int, help="max tokens per instance incl. [CLS]/[SEP] (default 128)")
    parser.add_argument("--dupe-factor", default=argparse.SUPPRESS, type=int, help="copies of each document with different masks (default 5)")
    parser.add_argument("--seed", default=argparse.SUPPRESS, type=int, help="global seed; output is a function of inputs and seed (default 12345)")
    parser.add_argument("--masked-lm-prob", default=argparse.SUPPRESS, type=float, help="share of tokens masked (default 0.15)")
    parser.add_argument("--max-predictions", default=argparse.SUPPRESS, type=int, help="cap on masked tokens per instance (default 20)")
    parser.add_argument("--short-seq-prob", default=argparse.SUPPRESS, type=float, help="share of documents with a shorter target length (default 0.1)")
    parser.add_argument("--whole-word-mask", default=argparse.SUPPRESS, action="store_true", help="mask whole words (all ## pieces together)")
    parser.add_argument("--lowercase", default=argparse.SUPPRESS, action=argparse.BooleanOptionalAction,
                        help="lowercase and strip accents (default: yes unless the vocab is cased)")
    parser.add_argument("--num-shards", default=argparse.SUPPRESS, type=int, help="train shards (default 0: one per --instances-per-shard)")
    parser.add_argument("--instances-per-shard", default=argparse.SUPPRESS, type=int, help="shard size when --num-shards is 0 (default 100000)")
    parser.add_argument("--heldout-fraction", default=argparse.SUPPRESS, type=float,
                        help="share of whole documents in the heldout split (default 0.02; 0 for none)")
    parser.add_argument("--docs-per-bucket", default=argparse.SUPPRESS, type=int,
                        help="NSP negatives come from a hashed bucket of about this many documents (default 1000)")
    parser.add_argument("--format", default=argparse.SUPPRESS, dest="input_format", choices=["auto", "wiki-xml", "text", "lines", "jsonl"],
                        help="input format (default: sniffed per file); lines = one sentence per line, blank line between documents")
    parser.add_argument("--shard-format", default=argparse.SUPPRESS, choices=["arrow", "parquet"], help="shard files (default arrow IPC)")
    parser.add_argument("--max-document-bytes", default=argparse.SUPPRESS, type=int,
                        help="skip (and count) documents larger than this many bytes (default 16000000)")
    parser.add_argument("--runner", default=None,
                        help="Beam runner (default FnApiRunner, local); other Beam options pass through as --name=value")
    parser.add_argument("--examples", type=int, default=3, help="decoded instances `inspect` shows (default 3)")


def _inspect(args: argparse.Namespace) -> int:
    from pipeline.inspect_corpus import summary

    if len(args.action) != 2:
        raise CliError("usage: bertpipe corpus inspect DIR")
    try:
        print(summary(args.action[1], args.examples))
    except ValueError as err:
        raise CliError(str(err)) from err
    return 0


# Command-line flag dest -> CorpusConfig field, where they differ.
_FIELD_OF_DEST = {"input": "inputs"}
_CONFIG_DESTS = ("input", "vocab", "train_vocab_size", "out", "seq_len", "dupe_factor", "seed", "masked_lm_prob",
                 "max_predictions", "short_seq_prob", "whole_word_mask", "lowercase", "num_shards",
                 "instances_per_shard", "heldout_fraction", "docs_per_bucket", "input_format", "shard_format",
                 "max_document_bytes")


def _config_of(args: argparse.Namespace):
    """CorpusConfig from defaults <- --config YAML <- key=value overrides <- explicit flags."""
    from launch.config import from_dict, load_yaml, merge, parse_overrides
    from pipeline.corpus_job import CorpusConfig

    try:
        data = load_yaml(args.config) if args.config else {}
        data = merge(data, parse_overrides(args.action))
        flags = {_FIELD_OF_DEST.get(d, d): getattr(args, d) for d in _CONFIG_DESTS if hasattr(args, d)}
        # An explicit vocab choice on the command line replaces the other one from the file.
        if "vocab" in flags:
            data.pop("train_vocab_size", None)
        if "train_vocab_size" in flags:
            data.pop("vocab", None)
        config = from_dict(CorpusConfig, merge(data, flags))
    except (OSError, ValueError) as err:
        raise CliError(str(err)) from err
    if not config.inputs:
        raise CliError("give --input PATH [PATH ...] (files, directories or globs)")
    if not config.out:
        raise CliError("give --out DIR")
    return config


def beam_args_of(args: argparse.Namespace) -> list[str]:
    """The Beam pipeline options of a parsed command line (`--runner` plus the passed-through rest)."""
    return ([f"--runner={args.runner}"] if args.runner else []) + list(args.beam_args)


def run(args: argparse.Namespace) -> int:
    setup_logging()
    # Beam announces at import that GCS support is not installed; a gs:// input says so itself.
    logging.getLogger("apache_beam.io.filesystems").setLevel(logging.ERROR)
    if args.action and args.action[0] == "inspect":
        return _inspect(args)
    bad = [a for a in args.action if "=" not in a]
    if bad:
        raise CliError(
            f"unexpected argument {bad[0]!r}: the only action is `inspect DIR`, config overrides are "
            "key=value, and Beam options take the form --name=value"
        )
    from pipeline.corpus_job import run as run_job

    config = _config_of(args)
    try:
        result = run_job(config, beam_args_of(args))
    except ValueError as err:
        raise CliError(str(err)) from err
    _print_summary(result)
    return 0


def _print_summary(result) -> None:
    m = result.manifest
    counters = m["counters"]
    rows = [("instances", m["num_instances"]), ("shards", len(m["shards"]))] + list(counters.items())
    width = max(len(k) for k, _ in rows)
    print(f"corpus written to {result.out} in {result.seconds:.1f} s")
    for key, value in rows:
        print(f"  {key:<{width}}  {value:>12,}")
    tokens = counters.get("tokens", 0)
    if result.seconds > 0 and tokens:
        print(f"  {'tokens/s':<{width}}  {tokens / result.seconds:>12,.0f}")
