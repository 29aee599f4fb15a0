"""The user's own data: `classify`, `regress` and `tag` from CSV, TSV or JSONL files.

DIR holds `train.<ext>` and `dev.<ext>` (or `validation.<ext>`), optionally `test.<ext>`, with ext one
of csv / tsv / jsonl. Columns are named by the user (`--text-column`, `--text-pair-column`,
`--label-column`). For `tag`, a JSONL row holds lists (words and tags); a CSV/TSV row holds
space-separated words and tags of equal count. CSV is read with standard quoting; TSV, as GLUE's,
without (a quote is text there, so one stray quote cannot swallow the lines after it).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from launch.finetune.examples import (
    DataError,
    SkipCounter,
    TaggedExample,
    TextExample,
    bad_score,
    column_index,
    finite_score,
    json_int,
    read_delimited,
    refuse_non_file,
    text_lines,
)

EXTENSIONS = ("csv", "tsv", "jsonl")
SPLIT_NAMES = {"train": ("train",), "dev": ("dev", "validation", "valid"), "test": ("test",)}


@dataclass(frozen=True)
class Columns:
    text: str = "text"
    text_pair: str | None = None
    label: str = "label"


def find_split_file(data_dir: Path, split: str, *, required: bool) -> Path | None:
    for name in (f"{stem}.{ext}" for stem in SPLIT_NAMES[split] for ext in EXTENSIONS):
        refuse_non_file(data_dir / name, f"the {split} split")  # else taken for missing, or (test) ignored
    found = [data_dir / f"{stem}.{ext}" for stem in SPLIT_NAMES[split] for ext in EXTENSIONS
             if (data_dir / f"{stem}.{ext}").is_file()]
    if len(found) > 1:  # one would be read and the other silently ignored
        raise DataError(f"{data_dir} holds {' and '.join(p.name for p in found)} for the {split} split; "
                        "keep one of them there")
    if found:
        return found[0]
    if required:
        names = ", ".join(f"{s}.{{{','.join(EXTENSIONS)}}}" for s in SPLIT_NAMES[split])
        raise DataError(f"missing the {split} split: {data_dir} holds none of {names}")
    return None


def _records(path: Path, wanted: list[str], skips: SkipCounter) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, {column: value}) for each row, with every wanted column present (else malformed)."""
    if path.suffix == ".jsonl":
        yield from _jsonl_records(path, wanted, skips)
        return
    tsv = path.suffix == ".tsv"
    header, rows = read_delimited(path, "\t" if tsv else ",", header=True, quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL)
    assert header is not None
    index = {c: column_index(header, c, path) for c in wanted}
    for line_no, fields in rows:
        if len(fields) != len(header):
            skips.malformed(path, line_no, f"expected {len(header)} fields, got {len(fields)}")
            continue
        yield line_no, {c: fields[i] for c, i in index.items()}


def _jsonl_records(path: Path, wanted: list[str], skips: SkipCounter) -> Iterator[tuple[int, dict[str, Any]]]:
    for line_no, line in text_lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line, parse_constant=_refuse_constant, parse_int=json_int, object_pairs_hook=_one_each)
        except json.JSONDecodeError as err:
            skips.malformed(path, line_no, f"not valid JSON ({err.msg})")
            continue
        except ValueError as err:  # NaN, Infinity (became the class "nan"), a key twice, a number too long
            skips.malformed(path, line_no, str(err))
            continue
        except RecursionError:  # thousands of nested [ or {
            skips.malformed(path, line_no, "JSON nested too deeply")
            continue
        if not isinstance(row, dict):
            skips.malformed(path, line_no, "expected a JSON object per line")
            continue
        missing = [c for c in wanted if c not in row]
        if missing:
            skips.malformed(path, line_no, f"missing key(s) {missing}")
            continue
        # null, objects: not text (str() would turn null into the text "None")
        bad = [c for c in wanted if row[c] is None or isinstance(row[c], dict)]
        if bad:
            skips.malformed(path, line_no, f"key(s) {bad} hold {json.dumps(row[bad[0]])}, not text")
            continue
        yield line_no, row


def _one_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each there once: json kept the last of a repeated key, without a word."""
    row = dict(pairs)
    if len(row) < len(pairs):
        twice = next(k for i, (k, _) in enumerate(pairs) if any(k == other for other, _ in pairs[:i]))
        raise ValueError(f"the key {twice!r} is given more than once; keep one")
    return row


def _refuse_constant(name: str) -> None:
    """Python's json writes a missing value (a float NaN) as `NaN`, which is not JSON, and reads it back."""
    raise ValueError(f"holds {name}, which is not JSON (a missing value written by Python's json?)")


def read_text_split(
    path: Path, cols: Columns, *, labelled: bool, regression: bool, skips: SkipCounter
) -> list[tuple[int, TextExample]]:
    """(line, example) pairs; labels are strings (classification) or floats (regression), None if unlabelled."""
    wanted = [cols.text] + ([cols.text_pair] if cols.text_pair else []) + ([cols.label] if labelled else [])
    out: list[tuple[int, TextExample]] = []
    for line, row in _records(path, wanted, skips):
        lists = [c for c in wanted if isinstance(row[c], list)]
        if lists:
            skips.malformed(path, line, f"key(s) {lists} hold a list, not text")
            continue
        if _yes_no(path, line, row, wanted[:2 if cols.text_pair else 1], skips):  # a label true is a class "true"
            continue
        label: str | float | None = None
        if labelled:
            raw = row[cols.label]
            if regression:
                try:
                    label = finite_score(raw)
                except (TypeError, ValueError) as err:
                    skips.malformed(path, line, f"{bad_score('label', raw, err)} (regress needs numeric labels)")
                    continue
            else:
                label = _label_text(raw)
                if not label:
                    skips.malformed(path, line, "empty label")
                    continue
                if "\n" in label or "\r" in label:
                    skips.malformed(path, line, f"label {label[:40]!r}... spans lines (a quote left open above?)")
                    continue
                if "\t" in label:  # it would split its row of the predictions' TSV into more columns
                    skips.malformed(path, line, f"label {label[:40]!r} holds a tab; labels are names without tabs")
                    continue
        if not str(row[cols.text]).strip():
            skips.malformed(path, line, f"empty text in column {cols.text!r}")
            continue
        text_b = str(row[cols.text_pair]) if cols.text_pair else None
        if text_b is not None and not text_b.strip():
            skips.malformed(path, line, f"empty text in column {cols.text_pair!r}")
            continue
        out.append((line, TextExample(f"{path.stem}-{line}", str(row[cols.text]), text_b, label)))
    return out


def _yes_no(path: Path, line: int, row: dict[str, Any], keys: list[str], skips: SkipCounter) -> bool:
    """Whether a JSON true/false stands in `keys` (counted as malformed): str() made it the text or tag "True"."""
    bools = [c for c in keys if isinstance(row[c], bool)]
    if bools:
        skips.malformed(path, line, f"key(s) {bools} hold {json.dumps(row[bools[0]])}, not text")
    return bool(bools)


def _label_text(raw: Any) -> str:
    """A class label as text. JSON's 1 and 1.0 are one number (pandas writes integer columns with a
    missing value as floats): both are "1", as CSV's 1 is."""
    if isinstance(raw, float) and raw.is_integer():
        return str(int(raw))
    if isinstance(raw, bool):  # JSON's true: "true", as a CSV would spell it, not Python's "True"
        return "true" if raw else "false"
    return str(raw).strip()


def check_labels(examples: list[tuple[int, TextExample]], labels: tuple[str, ...], path: Path) -> None:
    known = set(labels)
    for line, ex in examples:
        if ex.label not in known:
            raise DataError(f"{path}:{line}: unknown label {ex.label!r}; the training data's labels are {list(labels)}")


def _as_list(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else str(value).split()


def read_tag_split(path: Path, cols: Columns, *, labelled: bool, skips: SkipCounter) -> list[tuple[int, TaggedExample]]:
    wanted = [cols.text] + ([cols.label] if labelled else [])
    out: list[tuple[int, TaggedExample]] = []
    for line, row in _records(path, wanted, skips):
        if _yes_no(path, line, row, wanted, skips):
            continue
        words = _as_list(row[cols.text])
        tags = _as_list(row[cols.label]) if labelled else None
        if not words:
            skips.malformed(path, line, "no words")
            continue
        odd = [c for c in wanted if isinstance(row[c], list)
               and any(isinstance(v, bool) or not isinstance(v, (str, int, float)) for v in row[c])]
        if odd:  # str() would make a word or a tag "None", "True" or "['Paris']"
            skips.malformed(path, line, f"key(s) {odd} hold a list with null, true/false, a list or an object in it")
            continue
        if any(not w.strip() or any(c.isspace() for c in w) for w in words):
            # An empty word (or one with a space in it) tokenizes to nothing, and breaks the "word gold
            # predicted" lines of predictions/*.txt that conlleval reads.
            skips.malformed(path, line, "a word in it is empty or holds whitespace")
            continue
        if tags is not None and any(not t.strip() or any(c.isspace() for c in t) for t in tags):
            skips.malformed(path, line, "a tag in it is empty or holds whitespace")  # as a word's: it splits the line
            continue
        if tags is not None and len(tags) != len(words):
            skips.malformed(path, line, f"{len(words)} words but {len(tags)} tags")
            continue
        out.append((line, TaggedExample(f"{path.stem}-{line}", tuple(words), tuple(tags) if tags else None)))
    return out


def check_tags(examples: list[tuple[int, TaggedExample]], labels: tuple[str, ...], path: Path) -> None:
    known = set(labels)
    for line, ex in examples:
        for tag in ex.tags or ():
            if tag not in known:
                raise DataError(f"{path}:{line}: unknown tag {tag!r}; the training data's tags are {list(labels)}")
