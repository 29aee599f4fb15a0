"""The vocabulary, in one place: reading a `vocab.txt`, its casing, the WordPiece tokenizer, the
check against an embedding matrix, and the tokenizer files an export writes.

Every stage goes through here: the corpus job (`pipeline.tokenize`), the loader's dynamic masking,
the trainer's preflight, export (`launch.pretrain.hf_export` writes `tokenizer.json` and
`tokenizer_config.json` once, with `do_lower_case` and `model_max_length`), fine-tuning and
feature extraction (which read those files back). Two stages answering "is this vocabulary cased?"
differently was a real bug (three rules were found); there is one rule now, `vocab_is_cased`, and
a `tokenizer_config.json` saying `do_lower_case` overrides it.

Kept free of torch and Beam: the corpus job ships the vocabulary to its workers as text.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# A cased vocab (bert-base-cased: ~16% of its word pieces hold a capital) against an uncased one
# (bert-base-uncased: a handful of non-ASCII capitals such as Greek letters): 5% separates them
# with room either side, where "any capital" misreads the uncased vocab as cased.
CASED_SHARE = 0.05
TOKENIZER_CONFIG = "tokenizer_config.json"

log = logging.getLogger(__name__)


def read_vocab_tokens(vocab_text: str) -> list[str]:
    """Tokens in id order (line i is id i); trailing empty lines dropped, CRLF and a BOM tolerated.

    Files are decoded as utf-8-sig; the BOM is dropped here too for text decoded elsewhere, as
    "\ufeff[PAD]" is not [PAD] and the vocabulary would fail (or mask [PAD]) far from its file."""
    tokens = [line.rstrip("\r") for line in vocab_text.removeprefix("\ufeff").split("\n")]
    while tokens and tokens[-1] == "":
        tokens.pop()
    return tokens


def vocab_is_cased(tokens: Sequence[str]) -> bool:
    """The one casing rule: cased iff more than 5% of the non-special tokens hold a capital letter."""
    plain = [t for t in tokens if not (t.startswith("[") and t.endswith("]"))]
    upper = sum(1 for t in plain if any(c.isupper() for c in t))
    return upper > CASED_SHARE * max(1, len(plain))


def build_tokenizer(vocab: str | Sequence[str], lowercase: bool, *, specials_in_text: bool = True):
    """A fast BERT WordPiece tokenizer (HF `tokenizers`) from vocab text or tokens; no padding or
    truncation. Accents are stripped exactly for uncased vocabularies, as BERT does.

    `specials_in_text`: `[MASK]`, `[SEP]`, ... written in the text are those tokens, as transformers'
    tokenizers read them (what fine-tuning against them needs). False: plain text (`[`, `mask`, `]`), as
    google-research/bert's tokenizer reads it, which a pre-training corpus needs: a book's literal "[MASK]"
    must not become a mask with no label, nor "[SEP]" a segment boundary."""
    from tokenizers import BertWordPieceTokenizer

    tokens = read_vocab_tokens(vocab) if isinstance(vocab, str) else list(vocab)
    missing = [t for t in SPECIAL_TOKENS if t not in tokens]
    if missing:
        raise ValueError(f"the vocabulary lacks {' '.join(missing)}; a BERT vocab.txt needs {' '.join(SPECIAL_TOKENS)}")
    tok = BertWordPieceTokenizer(
        {t: i for i, t in enumerate(tokens)},
        lowercase=lowercase,
        strip_accents=lowercase,
        clean_text=True,
        handle_chinese_chars=True,
    )
    tok.no_padding()
    tok.no_truncation()
    tok._tokenizer.encode_special_tokens = not specials_in_text  # the wrapper does not expose it
    return tok


def check_embedding_rows(vocab_size: int, rows: int, *, vocab: str, model: str) -> None:
    """Refuse a vocabulary with more tokens than the model has embedding rows (ids would overflow);
    more rows than tokens is padding (alignment), which is fine."""
    if vocab_size > rows:
        raise ValueError(f"{vocab} has {vocab_size} tokens but {model} has {rows} embedding rows: the vocabulary "
                         "does not belong to this model; use the vocabulary it was trained with")


@dataclass(frozen=True)
class Vocab:
    """A vocabulary read once: its tokens, its casing and where it came from."""

    tokens: tuple[str, ...]
    lowercase: bool
    source: str  # the file, for messages

    @property
    def size(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_text(cls, vocab_text: str, source: str, lowercase: bool | None = None) -> Vocab:
        tokens = tuple(read_vocab_tokens(vocab_text))
        if not tokens:
            raise ValueError(f"vocab {source} is empty; pass a BERT vocab.txt")
        return cls(tokens, not vocab_is_cased(tokens) if lowercase is None else lowercase, source)

    @classmethod
    def read(cls, path: str | Path, lowercase: bool | None = None) -> Vocab:
        """`path` (a vocab.txt, or a model directory holding one). Casing: `lowercase` if given, else
        `do_lower_case` of a `tokenizer_config.json` beside the file, else `vocab_is_cased`."""
        path = Path(path)
        if path.is_dir():
            path = path / "vocab.txt"
        if not path.is_file():
            raise ValueError(f"{path} does not exist; a BERT model or corpus directory holds its vocab.txt")
        try:
            text = path.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as err:
            raise ValueError(f"vocab {path} is not UTF-8 text ({err}); pass a BERT vocab.txt") from None
        vocab = cls.from_text(text, str(path), lowercase)
        return vocab if lowercase is not None else replace(vocab, lowercase=model_lowercase(path.parent, vocab.tokens))

    def tokenizer(self):
        return build_tokenizer(self.tokens, self.lowercase)

    def masking(self):
        """What masking needs (`pipeline.masking.MaskingVocab`)."""
        from pipeline.masking import MaskingVocab

        return MaskingVocab.from_tokens(self.tokens)

    def check_rows(self, rows: int, model: str) -> None:
        check_embedding_rows(self.size, rows, vocab=self.source, model=model)

    def write_tokenizer_files(self, out: str | Path, model_max_length: int) -> None:
        """`tokenizer.json` and `tokenizer_config.json` for Hugging Face (written once, at export);
        `vocab.txt` is the caller's (it copies the file byte for byte)."""
        out = Path(out)
        self.tokenizer().save(str(out / "tokenizer.json"))
        config = _tokenizer_config(self.lowercase, model_max_length)
        (out / TOKENIZER_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _tokenizer_config(lowercase: object, model_max_length: object) -> dict:
    return {"tokenizer_class": "BertTokenizerFast", "do_lower_case": lowercase, "strip_accents": None,
            "model_max_length": model_max_length, "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
            "cls_token": "[CLS]", "mask_token": "[MASK]"}


def declared_lowercase(model_dir: str | Path) -> bool | None:
    """`do_lower_case` from `model_dir/tokenizer_config.json`, or None when it says nothing."""
    cfg = Path(model_dir) / TOKENIZER_CONFIG
    if not cfg.is_file():
        return None
    try:
        value = json.loads(cfg.read_text(encoding="utf-8")).get("do_lower_case")
    except (ValueError, AttributeError) as err:  # JSONDecodeError, UnicodeDecodeError, a JSON list
        raise ValueError(f"{cfg} is not a JSON object ({err}); fix or delete it") from None
    if value is not None and not isinstance(value, bool):  # "false" is a truthy string: say so, never guess
        raise ValueError(f"{cfg}: do_lower_case is {value!r}, not true or false; write it as a JSON boolean")
    return value


def model_lowercase(model_dir: str | Path, tokens: Sequence[str]) -> bool:
    """Whether text for the model in `model_dir` is lowercased: its `tokenizer_config.json`'s `do_lower_case`,
    else the vocabulary's casing (`vocab_is_cased`). A declaration the vocabulary contradicts is followed, as
    Hugging Face follows it, and named in one warning: `false` on an uncased vocabulary makes capitalised
    words [UNK] or splits them into pieces; `true` on a cased one leaves its capitalised pieces unused."""
    declared = declared_lowercase(model_dir)
    cased = vocab_is_cased(tokens)
    if declared is not None and declared == cased and not _ours(Path(model_dir) / TOKENIZER_CONFIG):
        what = ("capitalised words become [UNK] or split into pieces the model did not learn them as" if not cased
                else "the vocabulary's capitalised pieces are never used")
        log.warning("%s says do_lower_case: %s, but its vocabulary is %s: %s; fix do_lower_case if that is not meant",
                    Path(model_dir) / TOKENIZER_CONFIG, str(declared).lower(), "cased" if cased else "uncased", what)
    return not cased if declared is None else declared


def _ours(config_file: Path) -> bool:
    """A tokenizer_config.json as `write_tokenizer_files` writes it (an export, a fine-tuned model/): its casing
    is the corpus's, chosen there (`--no-lowercase` on lowercased text makes an uncased-looking vocabulary)."""
    config = json.loads(config_file.read_text(encoding="utf-8"))
    return config == _tokenizer_config(config.get("do_lower_case"), config.get("model_max_length"))
