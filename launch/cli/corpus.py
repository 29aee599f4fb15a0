"""Build a sharded, masked, NSP-paired Arrow corpus with Apache Beam; or `inspect DIR` one.

  bertpipe corpus --input PATH [PATH ...] (--vocab VOCAB.txt | --train-vocab-size N) --out DIR [--KEY VALUE ...]
  bertpipe corpus inspect DIR [--verify]

Inputs: files, directories (recursive; hidden, *.json, *.part, checksum files skipped) and globs on
any Beam filesystem (a directory a glob matches is read recursively too); gzip/bz2/xz (multistream
too) are read transparently. Formats: MediaWiki XML dumps, plain-text books, one-sentence-per-line
text, JSONL with a "text" field, WikiExtractor output.

Runs locally on Beam's FnApiRunner by default (--direct_num_workers=N for N processes). Any other
Beam option passes through unchanged, e.g.
  --runner=FlinkRunner --flink_master=host:8081 --environment_type=LOOPBACK
  --runner=SparkRunner --spark_master_url=spark://host:7077
  --runner=DataflowRunner --project=P --region=R --temp_location=gs://B/tmp
"""

from __future__ import annotations

import argparse
import difflib
import functools
import logging
import types

from launch.config import merge, parse_overrides
from launch.config_flags import add_config_flags, config_from_args, flag_of, given_flags, warn_deprecated
from launch.errors import CliError, Terminated
from launch.log import setup_logging

log = logging.getLogger(__name__)


def _parse_with_beam_args(self, args=None, namespace=None):
    """parse_args that keeps unknown `--beam_option` flags for Beam instead of refusing them."""
    ns, extra = argparse.ArgumentParser.parse_known_args(self, args, namespace)
    ours = {o for action in self._actions for o in action.option_strings}
    beam_args, errors = [], []
    i = 0
    while i < len(extra):
        arg = extra[i]
        name = arg.split("=", 1)[0]
        if not arg.startswith("--"):
            errors.append(arg)
        elif "-" in name[2:]:
            # Beam's options use underscores; a dashed unknown flag is a typo of one of ours.
            errors.append(arg)
        elif name.replace("_", "-") in ours:  # --seq_len=64: Beam would drop it with a warning, and 128 be used
            self.error(f"{name} is spelled {name.replace('_', '-')} (config keys become dashed flags)")
        elif name[2:] not in _beam_option_names() and (close := difflib.get_close_matches(name, ours, n=1, cutoff=0.8)):
            # --seqlen=64: not Beam's either, which would drop it with a warning, and the default be used
            self.error(f"unrecognized argument {arg}: did you mean {close[0]}?")
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


@functools.cache
def _beam_option_names() -> frozenset[str]:
    """What Beam's Python SDK knows (`--flink_master`, `--project`, ...); a runner may take more."""
    from apache_beam.options.pipeline_options import PipelineOptions

    return frozenset(PipelineOptions([]).get_all_options())


# Past this share of the text in sentences too long for --seq-len, the summary warns.
LONG_SENTENCE_WARN_FRACTION = 0.25  # prose: 3.6% of the bundled text at seq 64, 14% in Austen's opening pages
# Config fields whose flags keep the names users know.
FLAG_NAMES = {"inputs": "--input", "input_format": "--format"}
ON_INTERRUPT = "the partial output in --out has no manifest.json; run the same command again to rebuild it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.parse_args = types.MethodType(_parse_with_beam_args, parser)
    parser.add_argument("action", nargs="*", metavar="inspect DIR",
                        help="`inspect DIR`: print a corpus's manifest stats and a few decoded instances "
                        "(`key=value` overrides are the deprecated form of --key value)")
    from pipeline.corpus_job import CorpusConfig

    add_config_flags(parser, CorpusConfig, flag_names=FLAG_NAMES,
                     required=("inputs", "out"),
                     config_help="a YAML file of corpus settings (the keys of the manifest's `config`); flags given here win")
    parser.add_argument("--runner", default=None,
                        help="Beam runner (default FnApiRunner, local); other Beam options pass through as --name=value")
    parser.add_argument("--examples", type=int, default=3, help="decoded instances `inspect` shows (default: 3)")
    parser.add_argument("--verify", action="store_true",
                        help="`inspect`: check every shard against its sha256 in manifest.json (default: off)")


def _inspect(args: argparse.Namespace) -> int:
    from pipeline.inspect_corpus import summary

    if len(args.action) != 2:
        raise CliError("usage: bertpipe corpus inspect DIR")
    # `inspect DIR --seq-len 64` would show DIR as it was built, whatever the flag says.
    build = ([FLAG_NAMES.get(k, flag_of(k)) for k in given_flags(args)]
             + (["--config"] if args.config else []) + (["--runner"] if args.runner else [])
             + [a.split("=", 1)[0] for a in args.beam_args if a.startswith("--")])
    if build:
        raise CliError(f"corpus inspect reads a built corpus as it is and takes only --examples and --verify: drop "
                       f"{', '.join(build)} (build flags, for `bertpipe corpus --input ... --out ...`)")
    if args.examples < 0:
        raise CliError(f"--examples {args.examples}: give 0 or more decoded instances to show")
    try:
        print(summary(args.action[1], args.examples, verify=args.verify))
    except ValueError as err:
        raise CliError(str(err)) from err
    return 0


def _config_of(args: argparse.Namespace):
    """CorpusConfig from defaults <- --config YAML <- deprecated key=value overrides <- flags."""
    from pipeline.corpus_job import CorpusConfig

    # An explicit vocab choice on the command line (a flag, or a deprecated `key=value`) replaces the other one
    # from the --config file, which CorpusConfig would refuse as two; both given here is a mistake, not an override:
    # the second was silently dropped (a corpus built on --vocab where --train-vocab-size was asked for too).
    try:
        given = merge(parse_overrides(args.action), given_flags(args))
    except ValueError:  # a malformed override: config_from_args names it
        given = given_flags(args)
    chosen = [key for key in ("vocab", "train_vocab_size") if given.get(key) is not None]
    if len(chosen) == 2:
        raise CliError(f"--vocab {given['vocab']} and --train-vocab-size {given['train_vocab_size']} are both given; "
                       "give one: --vocab for a BERT vocab.txt, --train-vocab-size to train one on the input")
    fixed = {"train_vocab_size": None} if chosen == ["vocab"] else {"vocab": None} if chosen else {}
    warn_deprecated("corpus", args.action, CorpusConfig, FLAG_NAMES)
    config = config_from_args(args, CorpusConfig, legacy=args.action, fixed=fixed, flag_names=FLAG_NAMES)
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
    if args.action and args.action[0] == "inspect":
        return _inspect(args)
    bad = [a for a in args.action if "=" not in a]
    if bad:
        bare = [a for a in args.beam_args if "=" not in a]  # `--seqlen 64`: the value ends up here
        raise CliError(
            f"unexpected argument {bad[0]!r}: the only action is `inspect DIR`"
            + (f"; {bare[0]} is not a flag of bertpipe corpus (`--help` lists them), and a Beam option takes "
               f"its value as {bare[0]}={bad[0]}" if bare else ", and Beam options take the form --name=value")
        )
    from pipeline.corpus_job import run as run_job

    config = _config_of(args)
    from pipeline.output_lock import OutputLock

    try:
        with OutputLock(config.out, "corpus"):  # one writer per --out: a second job is refused, not merged
            result = run_job(config, beam_args_of(args))
    except ValueError as err:
        raise CliError(str(err)) from err
    except RuntimeError as err:
        # Beam re-raises a Ctrl-C inside a DoFn as RuntimeError("KeyboardInterrupt [while running ...]"), and
        # SIGTERM's `Terminated` (set by launch.cli) as RuntimeError("launch.errors.Terminated [while ...]").
        if f"{Terminated.__module__}.{Terminated.__name__}" in str(err):
            raise Terminated from None
        if "KeyboardInterrupt" in str(err):
            raise KeyboardInterrupt from None
        raise
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
    beyond = counters.get("tokens_beyond_seq_len", 0)
    if tokens and beyond > LONG_SENTENCE_WARN_FRACTION * tokens:
        log.warning("%.0f%% of the text is left out (tokens_beyond_seq_len): it lies past the room of a --seq-len "
                    "%s sequence in sentences longer than that; text without sentence ends (one long line, no full "
                    "stops) loses most of itself: split such input into sentences, or give one per line (--format lines)",
                    100 * beyond / tokens, m.get("seq_len", "?"))
