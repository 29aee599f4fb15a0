"""Public-domain books from a Project Gutenberg mirror, stripped to the book text: `gutenberg/<id>.txt`.

Mirror layout (www.gutenberg.org and full mirrors): the catalogue at
`cache/epub/feeds/pg_catalog.csv` (columns `Text#, Type, Issued, Title, Language, Authors, ...`),
each book's UTF-8 text at `cache/epub/<id>/pg<id>.txt`, older mirrors at `files/<id>/<id>-0.txt`;
both are tried in that order. Gutenberg publishes no checksums for these files, so a book is
verified by its HTTP length (a cut-off transfer resumes with Range like any other download) and by
having both the START and END markers (a truncated file lacks END); the raw and stripped sha256
go into `download.json` so later copies can be compared.

A book in progress is in `gutenberg/.bertpipe-partial/` (the raw download, its `.part`, the stripped
text before it is published; a hidden folder, which the corpus reader does not enter, and everything in
it is bertpipe's: a killed run's leftovers there are deleted by the rerun, and the folder once the run
ends); only the stripped text is written as `gutenberg/<id>.txt`, atomically, and never over a `<id>.txt` holding
other text (a user's copy, or ours edited since: a counted skip saying to move it aside). Books that
are missing on the mirror or not in Gutenberg's format are counted skips with their reason,
recorded in `download.json`.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from pipeline.download.checksums import hash_bytes, hash_file
from pipeline.download.errors import DiskFullError, ExistingFileError, FormatError, NetworkError, NotFoundError
from pipeline.download.gutenberg_text import decode_gutenberg, strip_gutenberg
from pipeline.download.http import ByteProgress, RetryPolicy, fetch, get_bytes
from pipeline.download.manifest import MANIFEST_NAME, read_manifest, update_manifest, utc_now
from pipeline.download.publish import publish
from pipeline.download.retry import Cancel

logger = logging.getLogger(__name__)

DEFAULT_MIRROR = "https://www.gutenberg.org"
IN_PROGRESS = ".bertpipe-partial"  # under gutenberg/: the books being fetched; nothing else goes there
CATALOG_PATH = "cache/epub/feeds/pg_catalog.csv"
SOURCE_KEY = "gutenberg"


@dataclass(frozen=True)
class Book:
    id: int
    title: str = ""
    authors: str = ""
    language: str = ""


@dataclass
class BooksResult:
    written: list[int] = field(default_factory=list)
    already: list[int] = field(default_factory=list)
    skipped: dict[int, str] = field(default_factory=dict)  # id -> reason
    failed: dict[int, str] = field(default_factory=dict)  # network failures: rerun to resume


def book_urls(mirror: str, book_id: int) -> list[str]:
    mirror = mirror.rstrip("/")
    return [f"{mirror}/cache/epub/{book_id}/pg{book_id}.txt", f"{mirror}/files/{book_id}/{book_id}-0.txt"]


def parse_catalog(text: str, *, languages: Sequence[str] = ("en",), types: Sequence[str] = ("Text",)) -> list[Book]:
    """Books from Gutenberg's `pg_catalog.csv`, or from a plain list of ids (one per line, `#` comments).

    The CSV is filtered to `languages` (any of the book's `;`-separated codes; empty = all) and to
    `types` (`Text`: drops audio books, sound and still images).
    """
    lines = text.lstrip("\ufeff").splitlines()
    if lines and lines[0].startswith("Text#"):
        rows = csv.DictReader(io.StringIO("\n".join(lines)))
        books = []
        for row in rows:
            try:
                book_id = int(row["Text#"])
            except (TypeError, ValueError):
                continue
            langs = {code.strip() for code in (row.get("Language") or "").split(";")}
            if languages and not langs & set(languages):
                continue
            if types and (row.get("Type") or "") not in types:
                continue
            books.append(Book(book_id, row.get("Title") or "", row.get("Authors") or "", row.get("Language") or ""))
        return books
    books = []
    for lineno, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if not line.isdigit():
            raise ValueError(
                f"catalogue line {lineno} is {line!r}: expected Gutenberg's pg_catalog.csv (header 'Text#,Type,...') "
                "or one ebook number per line"
            )
        books.append(Book(int(line)))
    return books


def load_catalog(catalog: Path | None, mirror: str, policy: RetryPolicy, languages: Sequence[str]) -> tuple[list[Book], str]:
    """(books, where the catalogue came from): a local file, else the mirror's pg_catalog.csv."""
    if catalog is not None:
        if not catalog.is_file():
            raise ValueError(f"--catalog {catalog} {'is not a file' if catalog.exists() else 'does not exist'}; pass "
                             "Gutenberg's pg_catalog.csv or a file of ebook numbers, one per line")
        try:
            text = catalog.read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as err:
            raise ValueError(f"--catalog {catalog} is not UTF-8 text (byte {err.start}: {err.reason}); pass Gutenberg's "
                             "pg_catalog.csv or a file of ebook numbers, one per line") from None
        return parse_catalog(text, languages=languages), str(catalog)
    url = f"{mirror.rstrip('/')}/{CATALOG_PATH}"
    data = get_bytes(url, policy, not_found_hint="pass --catalog FILE (pg_catalog.csv or one ebook number per line)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(f"{url} is not UTF-8 text (byte {err.start}: {err.reason}): not Gutenberg's catalogue; check "
                         "--mirror, or pass --catalog FILE") from None
    return parse_catalog(text, languages=languages), url


def download_books(
    out: Path,
    books: Sequence[Book],
    *,
    mirror: str = DEFAULT_MIRROR,
    catalog_source: str = "",
    jobs: int = 2,
    policy: RetryPolicy = RetryPolicy(),
    show_progress: bool = False,
) -> BooksResult:
    """Fetch, strip and record `books` into `out/gutenberg/`; see the module docstring."""
    mirror = mirror.rstrip("/")
    book_dir = out / "gutenberg"
    book_dir.mkdir(parents=True, exist_ok=True)
    recorded = read_manifest(out)["files"]
    result = BooksResult()
    entries: dict[str, dict[str, Any]] = {}
    stale: list[str] = []
    progress = ByteProgress(None, enabled=show_progress, desc="gutenberg")
    cancel = Cancel()  # set: every worker stops, a stalled read at once

    def one(book: Book) -> None:
        rel = f"gutenberg/{book.id}.txt"
        dest = out / rel
        known = recorded.get(rel)
        try:
            if dest.exists() and known:
                if hash_file(dest, ["sha256"])["sha256"] == known.get("sha256"):
                    result.already.append(book.id)
                    entries[rel] = known
                    return
                stale.append(rel)  # what download.json says of it is no longer true
                raise ExistingFileError(f"{dest} has changed since bertpipe wrote it (its sha256 is not the one in "
                                        f"{MANIFEST_NAME}); move it aside and rerun to fetch ebook #{book.id} again")
            entries[rel], wrote = _fetch_book(book, dest, mirror, policy, progress, cancel)
            (result.written if wrote else result.already).append(book.id)
        except (NotFoundError, FormatError, ExistingFileError) as err:
            result.skipped[book.id] = str(err)
            logger.warning("book %d skipped: %s", book.id, err)
        except NetworkError as err:
            result.failed[book.id] = str(err)
            logger.error("book %d failed: %s", book.id, err)

    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="gutenberg") as pool:
            try:
                # list(): re-raise the first fatal error (disk full, HTTP 403 ...) from a worker here.
                list(pool.map(one, books))
            except BaseException:
                cancel.set()  # Ctrl-C or a fatal error: stop the other workers at their next chunk
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    finally:
        progress.close()
        source = {
            "kind": "gutenberg", "mirror": mirror, "catalog": catalog_source,
            "books": sorted(result.written + result.already),
            "skipped": [{"id": i, "reason": r} for i, r in sorted(result.skipped.items())],
            "failed": [{"id": i, "reason": r} for i, r in sorted(result.failed.items())],
            "fetched_at": utc_now(),
        }
        # Recorded even after a fatal error, so what did finish is in the manifest.
        update_manifest(out, SOURCE_KEY, source, entries, drop=stale)
        with contextlib.suppress(OSError):  # not empty: a book's .part kept for its resume
            (book_dir / IN_PROGRESS).rmdir()
    logger.info(
        "gutenberg: %d written, %d already there, %d skipped, %d failed, into %s",
        len(result.written), len(result.already), len(result.skipped), len(result.failed), book_dir,
    )
    return result


def _fetch_book(
    book: Book, dest: Path, mirror: str, policy: RetryPolicy, progress: ByteProgress, cancel: Cancel
) -> tuple[dict[str, Any], bool]:
    """The book's manifest entry, and whether `dest` was written (False: it already held exactly this text)."""
    legacy = dest.with_name(dest.name + ".partial")  # where versions before IN_PROGRESS fetched a book
    if legacy.exists():
        # Left by a run killed between the download and its clean-up (or someone's file of that name): said
        # before downloading, as the download could never be published over it.
        raise ExistingFileError(f"{legacy} is left from an interrupted download (or is not bertpipe's); "
                                "delete or move it and rerun to fetch the book")
    work = dest.parent / IN_PROGRESS
    raw_dest, tmp = work / dest.name, work / f"{dest.name}.partial"
    for left in (raw_dest, tmp):  # a killed run's finished download or stripped text: ours, redone
        if left.exists():
            logger.info("removing %s, left by an interrupted download", left)
            left.unlink()
    fetched = None
    for url in book_urls(mirror, book.id):
        try:
            fetched = fetch(url, raw_dest, policy=policy, progress=progress, cancel=cancel)
            break
        except NotFoundError:
            continue
    if fetched is None:
        raise NotFoundError(book_urls(mirror, book.id)[0], f"ebook #{book.id} is not on {mirror} (tried both layouts)")
    try:
        raw = raw_dest.read_bytes()
        stripped = strip_gutenberg(decode_gutenberg(raw))
    except FormatError as err:
        raw_dest.unlink(missing_ok=True)
        raise FormatError(f"ebook #{book.id} ({fetched.url}): {err}") from None
    data = stripped.text.encode("utf-8")
    # A book file we did not record (a killed run's last books, or the user's own copy): the same
    # text is kept, as ours; other text is not ours to replace.
    wrote = not dest.exists()
    if not wrote and dest.read_bytes() != data:
        raw_dest.unlink(missing_ok=True)
        raise ExistingFileError(
            f"{dest} is already there with other text than ebook #{book.id} from {mirror} (bertpipe did not write "
            "it); move it aside and rerun to fetch the book"
        )
    if wrote:
        try:
            tmp.write_bytes(data)
        except OSError as err:
            tmp.unlink(missing_ok=True)
            raw_dest.unlink(missing_ok=True)  # ours; left, the rerun's download could not take its name
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFullError(f"the disk filled up while writing {dest}; free some space and rerun the same command") from None
            raise
        try:
            publish(tmp, dest)  # fsynced, and never over a file that appeared at `dest` meanwhile
        except ExistingFileError:
            tmp.unlink(missing_ok=True)
            raw_dest.unlink(missing_ok=True)
            raise ExistingFileError(f"{dest} appeared while ebook #{book.id} was being written (bertpipe did not "
                                    "write it); move it aside and rerun to fetch the book") from None
    raw_dest.unlink(missing_ok=True)
    return {
        "source": SOURCE_KEY, "url": fetched.url, "id": book.id, "title": book.title, "authors": book.authors,
        "language": book.language, "raw_size": fetched.size, "raw_sha256": fetched.digests["sha256"],
        "size": len(data), **hash_bytes(data, ["sha256"]), "start_marker": stripped.start_marker,
        "end_marker": stripped.end_marker, "fetched_at": utc_now(),
    }, wrote

