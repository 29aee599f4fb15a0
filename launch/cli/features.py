"""Extract contextual features from a BERT checkpoint (the paper's feature-based approach, Table 7).

  bertpipe features --checkpoint CKPT --input texts.txt --layers last4-concat --pool mean --out feats

CKPT is a Hugging Face model directory (config.json + model.safetensors + vocab.txt or
tokenizer.json) or a `bertpipe pretrain` run directory. INPUT is .txt (one text per line) or .jsonl
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
import time
from pathlib import Path

from launch.errors import CliError
from launch.config import load_config, save_config
from launch.log import setup_logging

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, type=Path, help="HF model directory or bertpipe run directory")
    parser.add_argument("--input", required=True, type=Path, help=".txt (one text per line) or .jsonl (one object per line)")
    parser.add_argument("--out", required=True, type=Path,
                        help="output path without extension: OUT.npy (pooled) or OUT.parquet (--pool none)")
    parser.add_argument("--layers", help="embeddings|last|second-to-last|last4-concat|last4-sum|all-sum|N[,M...] "
                        "(default last; write negative numbers as --layers=-2,-1)")
    parser.add_argument("--pool", choices=("none", "cls", "mean"), help="cls/mean: one vector per text; none: per token (default mean)")
    parser.add_argument("--first-subtoken", action="store_true", default=None,
                        help="with --pool none: keep only the first word piece of each word (drops [CLS]/[SEP])")
    parser.add_argument("--batch-size", type=int, help="texts per forward pass (default 32)")
    parser.add_argument("--max-seq-len", type=int, help="truncate texts to this many word pieces (default 512)")
    parser.add_argument("--text-field", help="JSONL key holding the text (default text)")
    parser.add_argument("--device", help="auto (default), cpu, cuda, cuda:N")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), help="compute dtype (default fp32)")
    parser.add_argument("--config", help="YAML file of FeaturesConfig fields (flags override it)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field, e.g. --set batch_size=64 (repeatable)")


def _resolve_checkpoint(path: Path) -> Path:
    """An HF directory as is; a `bertpipe pretrain` run through its (cached) export."""
    if not path.exists():
        raise CliError(f"--checkpoint {path} does not exist")
    if (path / "config.json").is_file():
        return path  # HF directory: no need to import the export machinery (and DeepSpeed)
    from launch.pretrain.hf_export import resolve_checkpoint

    try:
        return Path(resolve_checkpoint(path))
    except ValueError as err:
        raise CliError(str(err)) from None


def run(args: argparse.Namespace) -> int:
    setup_logging()
    from launch.finetune.feature_extraction import FeatureExtractor, FeaturesConfig, read_texts, write_pooled, write_tokens

    flags = {
        "layers": args.layers, "pool": args.pool, "first_subtoken": args.first_subtoken,
        "batch_size": args.batch_size, "max_seq_len": args.max_seq_len, "text_field": args.text_field,
        "device": args.device, "dtype": args.dtype,
    }
    try:
        cfg = load_config(FeaturesConfig, args.config, args.overrides)
        cfg = dataclasses.replace(cfg, **{k: v for k, v in flags.items() if v is not None})  # flags win
    except ValueError as err:
        raise CliError(str(err)) from None
    if cfg.batch_size < 1 or cfg.max_seq_len < 2:
        raise CliError("--batch-size must be >= 1 and --max-seq-len >= 2")
    if cfg.first_subtoken and cfg.pool != "none":
        raise CliError("--first-subtoken applies to per-token output only; add --pool none")

    checkpoint = _resolve_checkpoint(args.checkpoint)
    try:
        texts = read_texts(args.input, cfg.text_field)
        extractor = FeatureExtractor(checkpoint, cfg)
    except ValueError as err:
        raise CliError(str(err)) from None
    if not texts:
        raise CliError(f"{args.input} contains no texts")

    out_base = args.out.with_suffix("") if args.out.suffix in (".npy", ".parquet") else args.out
    out_base.parent.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out_base.with_name(out_base.name + ".features.yaml"))

    from tqdm import tqdm

    start = time.perf_counter()
    with tqdm(total=len(texts), unit="text", desc="features", disable=None) as bar:
        if cfg.pool == "none":
            out = write_tokens(extractor, texts, out_base.with_name(out_base.name + ".parquet"), bar.update)
        else:
            out = write_pooled(extractor, texts, out_base.with_name(out_base.name + ".npy"), bar.update)
    elapsed = time.perf_counter() - start
    if extractor.truncated:
        logger.warning("%d of %d texts were longer than %d word pieces and were truncated",
                       extractor.truncated, len(texts), extractor.max_len)
    print(f"wrote {out}: {len(texts)} texts, layers={cfg.layers}, pool={cfg.pool}, width={extractor.width}, "
          f"{len(texts) / max(elapsed, 1e-9):.1f} texts/s")
    return 0
