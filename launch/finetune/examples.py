"""Example types shared by every task, and strict delimited-file reading with file:line errors.

A reader turns one split file into a list of examples; it never drops a line silently. A malformed
line raises `DataError` naming `file:line`, unless the caller asked to skip malformed lines, in which
case the skip is counted and logged with the first few locations.
"""

from __future__ import annotations

import csv
import logging
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator, Sequence

logger = logging.getLogger(__name__)

# GLUE's TSVs hold fields longer than csv's default limit (131072) in a few rows of QQP/MNLI.
csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


class DataError(ValueError):
    """Bad downstream input (missing split, malformed line, unknown label): the message says what to fix."""


@dataclass(frozen=True)
class TextExample:
    """One sentence or sentence pair with a class label (str), a regression target (float) or None (test)."""

    guid: str
    text_a: str
    text_b: str | None = None
    label: str | float | None = None


@dataclass(frozen=True)
class TaggedExample:
    """One sentence as words with one tag per word (None on test data); `doc_id` groups a document's sentences.

    `doc` (the words of every sentence of the document, in file order; one tuple shared by them all) and
    `doc_pos` (this sentence's place in it) give `--doc-context` its real neighbours even when the sentence
    sits in a subset (`--max-train-samples`), where the list's neighbours are not the file's.
    """

    guid: str
    words: tuple[str, ...]
    tags: tuple[str, ...] | None = None
    doc_id: str = ""
    doc: tuple[tuple[str, ...], ...] = field(default=(), compare=False, repr=False)
    doc_pos: int = -1


def in_documents(examples: Sequence[TaggedExample]) -> list[TaggedExample]:
    """The examples (in file order) with `doc` and `doc_pos` set: a document is a run of one non-empty doc_id."""
    out: list[TaggedExample] = []
    start = 0
    for end in range(1, len(examples) + 1):
        if end < len(examples) and examples[end].doc_id == examples[start].doc_id:
            continue
        run = examples[start:end]
        if run[0].doc_id:
            doc = tuple(ex.words for ex in run)
            run = [replace(ex, doc=doc, doc_pos=pos) for pos, ex in enumerate(run)]
        out.extend(run)
        start = end
    return out


@dataclass(frozen=True)
class ChoiceExample:
    """A multiple-choice item: a context, the shared start of each ending, the endings, the gold index."""

    guid: str
    context: str
    start: str
    endings: tuple[str, ...]
    label: int | None = None


@dataclass(frozen=True)
class QAExample:
    """A SQuAD question over a context; `answers` are `{text, answer_start}` dicts (all of them, for scoring)."""

    guid: str
    question: str
    context: str
    answers: tuple[dict, ...] = ()
    title: str = ""


@dataclass
class SkipCounter:
    """Counts lines skipped as malformed (when the user allowed it), keeping a few locations to report.

    One counter may serve several files (a task's train, dev and test): `count` is the total, and each
    `log` reports only the skips since the previous one, so a file is never charged with another's lines.
    """

    allow: bool = False
    count: int = 0
    where: list[str] = field(default_factory=list)  # a few locations among the skips not yet logged
    logged: int = 0  # skips already reported by `log`
    whole: dict[Path, str] = field(default_factory=dict)  # file -> who needs every line of it (see `refuse`)

    def malformed(self, path: Path, line: int, why: str) -> None:
        if not self.allow:
            # a file read whole refuses its skipped lines anyway: --skip-malformed is no way out there
            fix = f"fix the line: {self.whole[path]}" if path in self.whole else \
                "fix the line, or pass --skip-malformed to skip such lines"
            raise DataError(f"{path}:{line}: {why} ({fix})")
        self.count += 1
        if len(self.where) < 5:
            self.where.append(f"{path.name}:{line} ({why})")

    def read_whole(self, path: Path, why: str) -> None:
        """Mark `path` as needed whole (`why`: who needs it), before reading it; `refuse` it after."""
        self.whole[path] = why

    def refuse(self, path: Path, why: str) -> None:
        """Stop on the lines of `path` skipped since the last `log`, where every line is needed: a test file a
        leaderboard scores whole (one skipped line shifts every later prediction). `why` says who needs them."""
        if self.count > self.logged:
            raise DataError(f"{path}: {self.count - self.logged} malformed line(s), e.g. {self.where[0]}; {why}: fix them")

    def log(self, what: str) -> None:
        if self.count > self.logged:
            logger.warning("%s: skipped %d malformed line(s), e.g. %s", what, self.count - self.logged,
                           "; ".join(self.where))
        self.logged = self.count
        self.where = []


@dataclass(frozen=True)
class SplitFiles:
    """Where a task keeps its split files: a subfolder of DIR named for the task (`DIR/conll2003/`) when one
    holds any of them, else DIR itself; under a few accepted names per split.

    Every split comes from that one folder: a stray `DIR/dev.txt` beside `DIR/conll2003/` was read for the
    split the subfolder lacked, without a word; now a required split refuses, naming it, and an optional one
    (test) is warned of. Two files for one split (`dev.txt` and `valid.txt`) are refused: one would be read
    and the other ignored. DIR's other files (another task's `train.csv`, a `training_args.json`) do not
    count once the subfolder holds the task's.
    """

    what: str  # the task, as messages name it: "CoNLL-2003"
    subfolders: tuple[str, ...]  # DIR/<name>/ as the task's downloads name it
    names: dict[str, tuple[str, ...]]  # split -> the file names accepted for it
    pattern: str = ""  # e.g. "{split}*.json": one such file stands for the split when none of its names is there

    def find(self, data_dir: Path, split: str, *, required: bool) -> Path | None:
        folder = self.folder(data_dir)
        found = self._files(folder, split)
        if len(found) > 1:
            raise DataError(f"{folder} holds {_listed(p.name for p in found)} for the {self.what} {split} split; "
                            "keep one of them there")
        if found:
            return found[0]
        beside = [data_dir / n for n in self.names[split] if folder != data_dir and (data_dir / n).is_file()]
        if beside:
            unread = (f"{beside[0]} is not read for the {self.what} {split} split: the task's files are read from "
                      f"{folder}, every split from one folder")
            if required:
                raise DataError(f"{unread}, which lacks it; move the file into {folder}")
            logger.warning("%s; move it there to use it", unread)
        if required:
            names = f"{list(self.names[split])}" + (f" (or one {self.pattern.format(split=split)})" if self.pattern else "")
            raise DataError(f"missing the {self.what} {split} split: none of {names} in {folder}")
        return None

    def folder(self, data_dir: Path) -> Path:
        """The task subfolder of DIR that holds any of the task's files, else DIR."""
        holding: list[Path] = []
        for folder in (data_dir / s for s in self.subfolders):
            if folder.is_dir() and not any(_same(folder, h) for h in holding) and any(
                    self._files(folder, split) for split in self.names):  # SWAG/ is swag/ on macOS
                holding.append(folder)
        if len(holding) > 1:
            raise DataError(f"{holding[0]} and {holding[1]} both hold {self.what} files; keep one of the two folders")
        return holding[0] if holding else data_dir

    def _files(self, folder: Path, split: str) -> list[Path]:
        for name in self.names[split]:  # a FIFO dev.txt was "missing the dev split"; a FIFO test.txt, ignored
            refuse_non_file(folder / name, f"the {self.what} {split} split")
        named = [folder / n for n in self.names[split] if (folder / n).is_file()]
        if named or not self.pattern:
            return named
        return sorted(p for p in folder.glob(self.pattern.format(split=split)) if p.is_file())


def _same(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:
        return False


def _listed(items) -> str:
    """`a and b`, `a, b and c`."""
    items = list(items)
    return " and ".join(items) if len(items) < 3 else f"{', '.join(items[:-1])} and {items[-1]}"


# A larger score overflows float32 once squared (the MSE loss): the loss became inf, and the message blamed the
# learning rate.
MAX_SCORE = 1e15


class ScoreTooLarge(ValueError):
    """A finite score too large to train on (its message is a predicate: "is too large ...")."""


def finite_score(raw) -> float:
    """A regression target: a number, and finite (one NaN or inf makes the loss NaN and every correlation NaN);
    not JSON's true/false, which float() reads as 1.0 and 0.0."""
    if isinstance(raw, bool):
        raise ValueError(f"{raw!r} is a yes/no value, not a score")
    try:
        value = float(raw)
    except OverflowError:  # a JSON integer of hundreds of digits
        raise ScoreTooLarge(f"is too large for a score (above {MAX_SCORE:g}); scale the scores down") from None
    if not math.isfinite(value):
        raise ValueError(f"{raw!r} is not finite")
    if abs(value) > MAX_SCORE:
        raise ScoreTooLarge(f"is too large for a score (above {MAX_SCORE:g}); scale the scores down")
    return value


def bad_score(what: str, raw, err: ValueError) -> str:
    """Why `raw` (from `finite_score`'s `err`) is no score, as a malformed line's reason; a long value cut short."""
    shown = repr(raw)
    shown = shown if len(shown) <= 40 else f"{shown[:20]}... ({len(shown)} characters)"
    return f"{what} {shown} {err}" if isinstance(err, ScoreTooLarge) else f"{what} {shown} is not a finite number"


def json_int(text: str) -> int:
    """A JSON integer, for json's `parse_int`: one too long for Python to convert is named for what it is (Python's
    own message named no file, and told to raise the interpreter's limit)."""
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise ValueError(f"holds a number of {digits} digits, too long to be any value; fix it")
    return int(text)


MAX_INT_DIGITS = getattr(sys, "get_int_max_str_digits", lambda: 4300)() or 4300  # 0: no limit; keep Python's default


def refuse_non_file(path: Path, what: str) -> None:
    """Refuse `path` when something other than a file is there: taken for missing, or (optional) silently ignored."""
    if path.exists() and not path.is_file():
        kind = "a folder" if path.is_dir() else "a named pipe" if path.is_fifo() else "not a regular file"
        kind = kind if kind.startswith("not") else f"{kind}, not a file"
        raise DataError(f"{path} ({what}) is {kind}; put the data file itself there")


def require_file(path: Path, what: str) -> Path:
    refuse_non_file(path, what)
    if not path.is_file():
        raise DataError(f"{what}: expected the file {path}, which does not exist")
    return path


def unreadable(path: Path, err: OSError) -> DataError:
    """An input file that cannot be opened or read (permissions, an I/O error): what to change, no traceback."""
    return DataError(f"cannot read {path}: {err.strerror or err}; make it readable")


def read_delimited(
    path: Path, delimiter: str, *, header: bool, quoting: int = csv.QUOTE_NONE
) -> tuple[list[str] | None, Iterator[tuple[int, list[str]]]]:
    """(header fields or None, iterator of (1-based line number, fields)) for a TSV/CSV file.

    GLUE's TSVs are read unquoted (quotes are text there, as in the GLUE reference code); CSVs
    (SWAG, user data) are read with standard quoting. Blank lines are skipped. A record's line is
    the one it starts on; records over several lines (a quoted line break, or an unclosed quote that
    swallows the lines after it) are counted and reported when the file is done.
    """
    try:
        f = open(path, encoding="utf-8-sig", newline="")
    except OSError as err:
        raise unreadable(path, err) from None
    reader = csv.reader(f, delimiter=delimiter, quoting=quoting)
    head: list[str] | None = None
    if header:
        try:
            head = next(_utf8(reader, path, f))
        except StopIteration:
            f.close()
            raise DataError(f"{path}: the file is empty; expected a header line") from None

    def rows() -> Iterator[tuple[int, list[str]]]:
        spans: list[tuple[int, int]] = []
        with f:
            start = reader.line_num + 1
            for fields in _utf8(reader, path, f):
                if reader.line_num > start:
                    spans.append((start, reader.line_num))
                if fields and not (len(fields) == 1 and not fields[0].strip()):
                    yield start, fields
                start = reader.line_num + 1
        if spans:
            logger.warning("%s: %d record(s) run over several lines (a quoted line break, or an unclosed quote that "
                           "joins the lines after it), e.g. lines %d-%d", path, len(spans), *spans[0])

    return head, rows()


def _utf8(reader, path: Path, f) -> Iterator[list[str]]:
    """The reader's records; a byte that is not UTF-8, or a NUL (valid UTF-8 that no text holds: UTF-16
    without its byte-order mark, or a binary file), stops the run naming the file and line."""
    try:
        for fields in reader:
            if any("\0" in field for field in fields):
                f.close()
                raise nul_byte(path, reader.line_num)
            yield fields
    except UnicodeDecodeError as err:
        f.close()
        raise not_utf8(path, err, reader.line_num) from None
    except OSError as err:  # EIO mid-file
        f.close()
        raise unreadable(path, err) from None


def text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, line) of a text file; a byte that is not UTF-8 stops the run naming the file."""
    line_no = 0
    try:
        with open(path, encoding="utf-8-sig") as f:  # -sig: a byte-order mark is not part of the first line
            for line_no, line in enumerate(f, 1):
                if "\0" in line:
                    raise nul_byte(path, line_no)
                yield line_no, line
    except UnicodeDecodeError as err:
        raise not_utf8(path, err, line_no) from None
    except OSError as err:
        raise unreadable(path, err) from None


def nul_byte(path: Path, line: int) -> DataError:
    return DataError(f"{path}: a NUL byte on line {line}, which text does not hold (UTF-16, or not a text file?); "
                     f"save it as UTF-8 text")


def not_utf8(path: Path, err: UnicodeDecodeError, after_line: int) -> DataError:
    # Text is decoded in blocks, so the bad byte lies somewhere after the last line read: found again in the
    # bytes, line by line (b"\n" is never inside a UTF-8 character).
    offset = 0
    try:
        with open(path, "rb") as f:
            for line_no, line in enumerate(f, 1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as bad:
                    return DataError(f"{path}: not UTF-8 text (line {line_no}, byte {offset + bad.start}: "
                                     f"{bad.reason}); save it as UTF-8")
                offset += len(line)
    except OSError:
        pass
    return DataError(f"{path}: not UTF-8 text ({err.reason}, after line {after_line}); save it as UTF-8")


def column_index(header: Sequence[str], name: str, path: Path) -> int:
    """`name`'s place in the header: there once (twice, the first was read and the other ignored, without a word)."""
    times = list(header).count(name)
    if times > 1:
        raise DataError(f"{path}: the header names the column {name!r} {times} times; rename or remove all but one")
    try:
        return list(header).index(name)
    except ValueError:
        raise DataError(f"{path}: no column named {name!r} in the header ({', '.join(header)})") from None
