"""Input expansion (driver side, before any work) and the `ReadDocuments` PTransform.

Files are read through Beam's `FileSystems`, so `gs://`, `s3://`, `hdfs://` inputs work wherever
the runner has the filesystem installed. Decompression is ours (see `pipeline.readers`) so that a
truncated archive is detected and counted instead of silently ending early.
"""

from __future__ import annotations

import glob
import logging
import os
import re
from typing import Iterable, Sequence

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from pipeline.manifest import FORMAT
from pipeline.readers import RawDocument, ReadStats, Skip, read_file

log = logging.getLogger(__name__)

DEAD_LETTER = "dead_letter"
# Expected filtering, counted but not dead-lettered (a dump is half redirects).
FILTERED_REASONS = frozenset({"wiki_redirect", "wiki_non_article_namespace"})
# Written next to downloaded data by `bertpipe download` and checksum tools: never corpus text.
_IGNORED_SUFFIXES = (".json", ".part", ".partial", ".sha1", ".md5", ".sha256", ".tmp")
_IGNORED_NAMES = ("sha1sums.txt", "md5sums.txt", "sha256sums.txt")
_IGNORED_NOTE = "hidden, *.json, *.part, checksum files are ignored unless named one by one"


def _ignored(path: str) -> bool:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    lower = name.lower()
    return (
        name.startswith(".")
        or lower.endswith(_IGNORED_SUFFIXES)
        or lower.endswith(_IGNORED_NAMES)
        or "multistream-index" in lower  # byte offsets of a multistream dump, not text
    )


def _in_hidden_folder(path: str, root: str) -> bool:
    """Whether `path`, below the folder `root`, lies inside a hidden folder under it."""
    return any(part.startswith(".") for part in path[len(root):].split("/")[:-1]) if path.startswith(root) else False


def expand_inputs(patterns: Sequence[str]) -> list[str]:
    """Sorted, de-duplicated files named by paths, globs and (recursively) directories.

    The ignore list (`_ignored`) applies to what directories and globs expand to; a file named
    explicitly is read whatever its name (`train.json` from `Dataset.to_json` is JSON Lines).
    Raises `ValueError` naming the first input that matches nothing or cannot be read.
    """
    files: list[str] = []
    for pattern in patterns:
        files += _expand(pattern)
    files = _unique_files(files)
    for path in files:
        if "://" not in path and not os.access(path, os.R_OK):
            raise ValueError(f"input file {path} is not readable (check its permissions)")
        try:
            path.encode("utf-8")  # the job passes file names to its workers as UTF-8 text
        except UnicodeEncodeError:
            shown = os.fsencode(path).decode("utf-8", "backslashreplace")
            raise ValueError(f"input file {shown} has a name that is not UTF-8 (Latin-1?); rename it, e.g. with "
                             "`convmv -f latin1 -t utf8`") from None
    return sorted(files)


def _expand(pattern: str) -> list[str]:
    if os.path.isdir(pattern):
        found = _walk(pattern)
        if not found:
            raise ValueError(f"input directory {pattern} holds no input files ({_IGNORED_NOTE})")
        return found
    if os.path.isfile(pattern):
        return [pattern]  # named by the user: read, whatever the ignore list says
    if os.path.exists(pattern):  # a named pipe, a socket, a device: reading it would block or never end
        raise ValueError(f"input {pattern} is not a regular file (a named pipe, socket or device); write it to a file first")
    if "://" not in pattern:
        return _expand_local_glob(pattern)
    root = pattern.rstrip("/") + "/"
    try:
        # `gs://b/wiki/` names a folder: Beam reads it as `wiki/*`, the files directly in it, none below.
        result = FileSystems.match([pattern])[0] if not pattern.endswith("/") else None
    except Exception as err:  # Beam raises BeamIOError for unknown schemes and bad patterns
        raise ValueError(f"input {pattern}: {err}") from err
    explicit = not any(c in pattern for c in "*?[")
    matched = [m.path for m in result.metadata_list if explicit or not _ignored(m.path)] if result else []
    if not matched:
        # A remote "directory": everything under it, minus what the ignore list and hidden folders hold
        # (`.bertpipe-tmp/`, `.git/`: a local walk never enters them).
        result = FileSystems.match([root + "**"])[0]
        matched = [m.path for m in result.metadata_list if not _ignored(m.path) and not _in_hidden_folder(m.path, root)]
    if not matched:
        ignored = f" it does not ignore ({_IGNORED_NOTE})" if result.metadata_list else ""
        raise ValueError(f"input {pattern} matches no file{ignored}; give existing files, directories or globs")
    return sorted(matched)


def _written_by_bertpipe(root: str, entries: set[str]) -> bool:
    """A folder bertpipe wrote (a corpus, a pre-training run, a fine-tuning output, an export): its
    vocab.txt, metrics and logs are not corpus text. Known by the marker or lock each command leaves; not
    by `download books`' folder of books still being fetched, which sits among the finished ones."""
    from pipeline.download.gutenberg import IN_PROGRESS as BOOKS_IN_PROGRESS

    if "bertpipe_export.json" in entries or any(e.startswith(".bertpipe") and e != BOOKS_IN_PROGRESS for e in entries):
        return True
    if "manifest.json" not in entries:
        return False
    try:
        with open(os.path.join(root, "manifest.json"), encoding="utf-8") as f:
            return f'"{FORMAT}"' in f.read(1 << 16)
    except (OSError, UnicodeDecodeError):
        return False


def _walk(directory: str, named: bool = True) -> list[str]:
    """The input files under `directory`: regular files only (a named pipe would block the read forever),
    symlinked folders followed once each, folders bertpipe wrote left out, each kind of skip logged.
    named: the user named `directory` (an --input), not a glob that matched it; only then may it stop the job."""
    found, seen, left_out, odd, unlisted = [], set(), [], [], []

    def cannot_list(err: OSError) -> None:
        # Passed over without a word, a folder the user cannot list (chmod 000, another user's) lost its files
        # from the corpus. The input itself is refused, as an unreadable file is; a folder below it is left out
        # with a warning, for a mount's root-only lost+found (left out quietly) must not stop the job.
        if named and os.path.normpath(err.filename or "") == os.path.normpath(directory):
            raise ValueError(f"input directory {directory} is not readable (check its permissions)") from err
        if os.path.basename(err.filename or "") != "lost+found":
            unlisted.append(err.filename)

    for root, dirs, names in os.walk(directory, onerror=cannot_list, followlinks=True):
        if _written_by_bertpipe(root, set(dirs) | set(names)):
            left_out.append(root)
            dirs[:] = []
            continue
        seen.add(os.path.realpath(root))
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and os.path.realpath(os.path.join(root, d)) not in seen)
        for name in sorted(n for n in names if not _ignored(n)):
            path = os.path.join(root, name)
            (found if os.path.isfile(path) else odd).append(path)
    if left_out:
        log.info("not reading %d folder(s) under %s that bertpipe wrote (corpora, runs, exports): %s", len(left_out),
                 directory, ", ".join(left_out[:3]) + (" ..." if len(left_out) > 3 else ""))
    if odd:
        log.warning("not reading %d entr(ies) under %s that are not regular files (named pipes, sockets, devices, "
                    "broken links): %s", len(odd), directory, ", ".join(odd[:3]) + (" ..." if len(odd) > 3 else ""))
    if unlisted == [directory]:  # a folder a glob matched
        log.warning("not reading %s: it cannot be listed (check its permissions)", directory)
    elif unlisted:
        log.warning("not reading %d folder(s) under %s that cannot be listed (check their permissions): %s",
                    len(unlisted), directory, ", ".join(unlisted[:3]) + (" ..." if len(unlisted) > 3 else ""))
    return found


def _expand_local_glob(pattern: str) -> list[str]:
    """A local glob: its files, and the files under the directories it matches (Beam's `match`
    returns files only, so `raw/*` over `raw/gutenberg/` dropped the books without a word)."""
    recursive = "**" in pattern.split(os.sep)
    if recursive:  # the walk leaves out what the ignore list names: whether it matched some is not known
        hits = found = _recursive_glob(pattern)
    else:
        hits = sorted(glob.glob(pattern))
        found = [f for hit in hits for f in (_walk(hit, named=False) if os.path.isdir(hit) else [hit] if os.path.isfile(hit) else [])
                 if not _ignored(f)]
    if not found:
        ignored = f" it does not ignore ({_IGNORED_NOTE})" if hits or recursive else ""
        raise ValueError(f"input {pattern} matches no file{ignored}; give existing files, directories or globs")
    return found


def _recursive_glob(pattern: str) -> list[str]:
    """The files of a `**` glob, and those under the folders it matches: what `_walk` finds below the
    pattern's fixed head, kept where the pattern matches the file or a folder above it. Not
    `glob.glob(recursive=True)`, which follows every symlink: two links back up the tree (`ln -s ..`,
    `ln -s .`) made it walk about 2^depth paths, and the job hung before it started."""
    parts = pattern.split(os.sep)
    fixed = next(i for i, part in enumerate(parts) if part == "**" or any(c in part for c in "*?["))
    head = os.sep.join(parts[:fixed]) or (os.sep if pattern.startswith(os.sep) else "")
    tail, rule = parts[fixed:], ""
    for k, part in enumerate(tail):
        last = k == len(tail) - 1
        if part == "**":  # any number of folders; last, anything below
            rule += ".*" if last else "(?:[^/]+/)*"
        else:
            rule += _component_regex(part) + ("" if last else "/")
    matches = re.compile(rule).fullmatch
    found = []
    for path in _walk(head or "."):
        rel = os.path.relpath(path, head or ".").split(os.sep)
        if any(matches("/".join(rel[:depth])) for depth in range(1, len(rel) + 1)):
            found.append(os.path.join(head, *rel) if head else os.path.join(*rel))
    return found


def _component_regex(part: str) -> str:
    """One path component of a glob (`*`, `?`, `[...]`, `[!...]`) as a regex that never crosses a `/`."""
    out, i = [], 0
    while i < len(part):
        c = part[i]
        close = part.find("]", i + 2) if c == "[" else -1
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif close > 0:
            body = part[i + 1 : close]
            body = "^" + body[1:] if body.startswith("!") else body
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = close
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _unique_files(files: list[str]) -> list[str]:
    """`files` without repeats: one local file reached twice (`./data/books` and `data/books/a.txt`, or
    a symlink) would otherwise be read twice and weigh double. Of its spellings the smallest is kept,
    whatever the order of the inputs: the file's name becomes its documents' ids, which seed NSP and
    masking."""
    spelling: dict[str, str] = {}
    for path in files:
        key = path if "://" in path else os.path.realpath(path)
        spelling[key] = min(spelling.get(key, path), path)
    if len(spelling) < len(files):
        log.info("dropped %d repeated input file(s): the same file was named more than once", len(files) - len(spelling))
    return list(spelling.values())


class _ReadFileFn(beam.DoFn):
    def __init__(self, fmt: str, max_document_bytes: int):
        self.fmt = fmt
        self.max_document_bytes = max_document_bytes
        self.documents = Metrics.counter("corpus", "documents_read")
        self.files = Metrics.counter("corpus", "files_read")

    def process(self, path: str) -> Iterable:
        stats = ReadStats()
        n_docs = 0
        try:
            handle = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
        except Exception as err:  # the file vanished or became unreadable after expansion
            skip = Skip(path, path, "unreadable_file", str(err)[:200])
            Metrics.counter("corpus", "skipped_unreadable_file").inc()
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, skip)
            return
        with handle:
            for record in read_file(handle, path, self.fmt, self.max_document_bytes, stats):
                if isinstance(record, RawDocument):
                    n_docs += 1
                    self.documents.inc()
                    yield record
                else:
                    Metrics.counter("corpus", f"skipped_{record.reason}").inc()
                    if record.reason not in FILTERED_REASONS:
                        yield beam.pvalue.TaggedOutput(DEAD_LETTER, record)
        for name, value in stats.counts.items():
            Metrics.counter("corpus", name).inc(value)
        self.files.inc()
        log.info("read %d documents from %s", n_docs, path)


class ReadDocuments(beam.PTransform):
    """File paths -> `RawDocument`s (main output) and `Skip`s (tagged `dead_letter`)."""

    def __init__(self, fmt: str = "auto", max_document_bytes: int = 16_000_000):
        super().__init__()
        self.fmt = fmt
        self.max_document_bytes = max_document_bytes

    def expand(self, paths):
        return (
            paths
            # Spread files over workers before the expensive read.
            | "SpreadFiles" >> beam.Reshuffle()
            | "ReadFiles" >> beam.ParDo(_ReadFileFn(self.fmt, self.max_document_bytes)).with_outputs(
                DEAD_LETTER, main="documents"
            )
        )
