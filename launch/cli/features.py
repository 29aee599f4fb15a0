"""Extract contextual features from a BERT checkpoint (the paper's feature-based approach, Table 7).

  bertpipe features --checkpoint CKPT --input texts.txt --layers last4-concat --pool mean --out feats

CKPT is a Hugging Face model directory (config.json, model.safetensors and the WordPiece vocab.txt)
or a `bertpipe pretrain` run directory. INPUT is .txt (one text per line) or .jsonl
(a "text" field per line). --pool cls|mean writes OUT.npy (float32, one row per input line, in
order); --pool none writes per-token vectors to OUT.parquet (columns row, tokens, features).
The resolved settings are written to OUT.features.yaml.

--layers (rows of the paper's Table 7):
  embeddings       the embedding layer output (layer 0)
  second-to-last   layer L-1            last        layer L
  last4-sum        sum of layers L-3..L last4-concat  concatenation of layers L-3..L (width 4H)
  all-sum          sum of layers 1..L
  N[,M...]         explicit layers (0 = embeddings, negative counts from the end), concatenated
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import time
from pathlib import Path

from launch.export_dirs import resolve_checkpoint
from launch.errors import CliError, WriteDidNotFit, disk_full_message
from launch.config import save_config
from launch.config_flags import add_config_flags, config_from_args, warn_deprecated
from launch.log import setup_logging
from pipeline.output_lock import LockUnwritable, OutputLock, OutputLocked, lock_beside

logger = logging.getLogger(__name__)


USAGE = "bertpipe features --checkpoint CKPT --input TEXTS --out OUT [--config FILE.yaml] [--KEY VALUE ...]"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from launch.finetune.finetune_config import FeaturesConfig

    parser.add_argument("--checkpoint", required=True, type=Path, help="HF model directory or bertpipe run directory")
    parser.add_argument("--input", required=True, type=Path, help=".txt (one text per line) or .jsonl (one object per line)")
    parser.add_argument("--out", required=True, type=Path,
                        help="output path without extension: OUT.npy (pooled) or OUT.parquet (--pool none)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help=argparse.SUPPRESS)  # deprecated form of --KEY VALUE
    add_config_flags(parser, FeaturesConfig)


def run(args: argparse.Namespace) -> int:
    setup_logging()
    from launch.finetune.feature_extraction import FeatureExtractor, read_texts
    from launch.finetune.finetune_config import FeaturesConfig

    warn_deprecated("features", args.overrides, FeaturesConfig)
    cfg = config_from_args(args, FeaturesConfig, legacy=args.overrides)
    if cfg.batch_size < 1 or cfg.max_seq_len < 2:
        raise CliError("--batch-size must be >= 1 and --max-seq-len >= 2")
    if cfg.first_subtoken and cfg.pool != "none":
        raise CliError("--first-subtoken applies to per-token output only; add --pool none")

    try:
        checkpoint = resolve_checkpoint(args.checkpoint)  # an HF dir, or a run's verified export
        texts = read_texts(args.input, cfg.text_field)
        extractor = FeatureExtractor(checkpoint, cfg)
    except ValueError as err:
        raise CliError(str(err)) from None
    if not texts:
        raise CliError(f"{args.input} contains no texts")

    if args.out.is_dir():  # OUT is a name stem (OUT.npy, OUT.features.yaml): `--out d1/` wrote d1.npy beside d1
        raise CliError(f"--out {args.out} is a directory; --out names the output files (OUT.npy or OUT.parquet, "
                       f"and OUT.features.yaml): pass e.g. --out {args.out / 'features'}")
    out_base = args.out.with_suffix("") if args.out.suffix in (".npy", ".parquet") else args.out
    out_base.parent.mkdir(parents=True, exist_ok=True)
    # One writer per output: two runs shared the partial file, and one renamed the other's away. OUT itself is
    # never written (a file of that name stays as it is): the lock is named from OUT's real folder and its name.
    try:
        with OutputLock(out_base, "features", lock_file=lock_beside(out_base, stem=True)):
            data_file, elapsed = _write(args, cfg, extractor, texts, out_base)
    except (OutputLocked, LockUnwritable) as err:
        raise CliError(str(err)) from None
    if extractor.truncated:
        logger.warning("%d of %d texts were longer than %d word pieces and were truncated",
                       extractor.truncated, len(texts), extractor.max_len)
    print(f"wrote {data_file}: {len(texts)} texts, layers={cfg.layers}, pool={cfg.pool}, width={extractor.width}, "
          f"{len(texts) / max(elapsed, 1e-9):.1f} texts/s")
    return 0


def _write(args: argparse.Namespace, cfg, extractor, texts: list[str], out_base: Path) -> tuple[Path, float]:
    """The features and their settings file, under the output's lock; (data file, seconds)."""
    data_file = out_base.with_name(out_base.name + _data_suffix(cfg.pool))
    sidecar = out_base.with_name(out_base.name + ".features.yaml")  # the resolved settings; proves we wrote data_file
    for path in (sidecar, data_file):
        if path.exists() and not path.is_file():  # not ours to replace (an IsADirectoryError traceback)
            raise CliError(f"{path} exists and is not a file bertpipe wrote; choose another --out")
    settings = _our_settings(sidecar, cfg) if sidecar.is_file() else None
    if sidecar.is_file() and settings is None:
        raise CliError(f"{sidecar} exists and is not a `bertpipe features` settings file; choose another --out")
    described = _data_suffix(settings.get("pool")) if settings is not None else None  # the output they license
    if data_file.exists() and described != data_file.suffix:
        raise CliError(f"{data_file} exists and `bertpipe features` did not write it (no {sidecar.name} beside it "
                       "describing it); choose another --out")
    # The features the old settings describe (ours) are removed before the new settings are written, and the
    # new ones appear whole (renamed from a partial file): an interrupted run leaves settings without data,
    # never data the settings misdescribe.
    if described:
        out_base.with_name(out_base.name + described).unlink(missing_ok=True)
    # What ran, not what was asked: the model may allow fewer positions, and `auto` picked a device.
    save_config(dataclasses.replace(cfg, max_seq_len=extractor.max_len, device=extractor.device.type), sidecar)

    from tqdm import tqdm

    from launch.finetune.feature_extraction import write_pooled, write_tokens

    partial = data_file.with_name(f".{data_file.name}.partial")
    start = time.perf_counter()
    try:
        with tqdm(total=len(texts), unit="text", desc="features", disable=None) as bar:
            write = write_tokens if cfg.pool == "none" else write_pooled
            write(extractor, texts, partial, bar.update)
        os.replace(partial, data_file)
    except OSError as err:
        message = disk_full_message(err, data_file)  # asked now, while the partial file still fills the disk
        if message is None:
            raise
        raise WriteDidNotFit(message) from None
    finally:
        partial.unlink(missing_ok=True)
    elapsed = time.perf_counter() - start
    return data_file, elapsed


def _our_settings(path: Path, cfg) -> dict | None:
    """The settings in `path` when it parses as the settings file this command writes, every setting
    resolved (then it may rewrite it and the data file it describes), else None: a YAML of the user's with
    some of the same keys, even one passed as --config, is theirs."""
    import dataclasses

    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return None
    names = {f.name for f in dataclasses.fields(cfg)}
    return data if isinstance(data, dict) and set(data) == names else None


def _data_suffix(pool: str | None) -> str | None:
    """The data file of a `pool` setting: per-token Parquet for none, else a pooled .npy (None: no setting)."""
    return None if pool is None else ".parquet" if pool == "none" else ".npy"
