"""Fetch the raw pre-training data: Wikipedia dumps and public-domain books, resumable and verified.

  bertpipe download wikipedia --lang en --date latest --out raw/
  bertpipe download books --source gutenberg --catalog my_books.txt --out raw/
  bertpipe corpus --input raw/ --vocab VOCAB --out corpus/

Downloads go to NAME.part and take their final name only once verified (Wikipedia: the dump's
published sha1/md5 list; Gutenberg: length and START/END markers). Rerunning the same command
resumes interrupted files with HTTP range requests and skips finished ones. What was fetched (URLs,
sizes, checksums, dates) is recorded in OUT/download.json. See docs/download.md for disk space.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from launch.config_flags import out_dir
from launch.errors import CliError, disk_full_message
from launch.log import get_logger, setup_logging

ON_INTERRUPT = "partial files (.part) are kept; run the same command again to resume them"

log = get_logger(__name__)


def _mirror(value: str) -> str:
    """An http(s) URL with a host: a local path or `file://` was fetched as a URL and retried as a network
    fault for a minute (exit 1, which schedulers retry)."""
    from urllib.parse import urlsplit

    url = urlsplit(value)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise argparse.ArgumentTypeError(f"{value!r} is not an http(s) URL with a host, e.g. https://mirror.example.org/"
                                         "gutenberg (a local copy: serve it, e.g. `python -m http.server` in its folder)")
    return value


def _common(parser: argparse.ArgumentParser, default_mirror: str) -> None:
    parser.add_argument("--out", type=out_dir, required=True, help="output directory (shared by several downloads; "
                        "pass it to `bertpipe corpus --input`)")
    parser.add_argument("--mirror", type=_mirror, default=None, help=f"base URL of the mirror, in the same layout (default: {default_mirror})")
    parser.add_argument("--jobs", type=int, default=2, help="files downloaded in parallel (default: 2; "
                        "keep it low on dumps.wikimedia.org and www.gutenberg.org; mirrors allow more)")
    parser.add_argument("--retries", type=int, default=5, help="retries per file after a network error (default: 5)")
    parser.add_argument("--backoff", type=float, default=2.0, help="first retry delay in seconds (plus up to as much random jitter), doubling per failure up to 60 (default: 2)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds without data before a connection counts as dropped (default: 60)")
    bar = parser.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None, help="show a progress bar (default: when stderr is a terminal)")
    bar.add_argument("--no-progress", dest="progress", action="store_false", help="log progress every 30 s instead of a bar")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="what", required=True, metavar="{wikipedia,books}")
    wiki = sub.add_parser(
        "wikipedia", help="a Wikipedia pages-articles dump from dumps.wikimedia.org or a mirror",
        description="Fetch a Wikipedia pages-articles dump (numbered bz2 parts, or the single multistream "
        "file), verified against the dump's published sha1 (else md5) list.",
    )
    wiki.add_argument("--lang", default="en", help="language code of the wiki: en, de, fr, zh-min-nan ... (default: en)")
    wiki.add_argument("--date", default="latest", help="dump date YYYYMMDD, or 'latest' for the newest finished dump (default)")
    wiki.add_argument("--layout", choices=("parts", "multistream"), default="parts",
                      help="parts: the numbered pages-articlesN.xml-p...bz2 files, fetched and later read in parallel "
                      "(default); multistream: the single pages-articles-multistream.xml.bz2")
    _common(wiki, "https://dumps.wikimedia.org")
    books = sub.add_parser(
        "books", help="public-domain books from a Project Gutenberg mirror, header and licence stripped",
        description="Fetch public-domain books from a Project Gutenberg mirror and write each book's text, "
        "without the Gutenberg header and licence footer, as OUT/gutenberg/<id>.txt.",
    )
    books.add_argument("--source", choices=("gutenberg",), default="gutenberg", help="book source (default: gutenberg)")
    books.add_argument("--catalog", type=Path, default=None, help="Gutenberg's pg_catalog.csv or a file with one ebook "
                       "number per line (default: the mirror's cache/epub/feeds/pg_catalog.csv)")
    books.add_argument("--ids", type=int, nargs="+", action="extend", default=None,
                       help="ebook numbers to fetch instead of a catalogue")
    books.add_argument("--language", nargs="+", action="extend", default=None,
                       help="keep catalogue books in these languages (default: en)")
    books.add_argument("--limit", type=int, default=None, help="fetch at most this many books (catalogue order)")
    _common(books, "https://www.gutenberg.org")


def run(args: argparse.Namespace) -> int:
    setup_logging()
    from pipeline.download.errors import ChecksumMismatchError, DiskFullError, DownloadError, NetworkError
    from pipeline.download.http import RetryPolicy

    if args.jobs < 1 or args.retries < 0 or args.backoff < 0 or args.timeout <= 0:
        raise CliError("--jobs must be >= 1, --retries and --backoff >= 0, --timeout > 0")
    if args.out.exists() and not args.out.is_dir():
        raise CliError(f"--out {args.out} is a file; pass a directory")
    policy = RetryPolicy(max_retries=args.retries, backoff_s=args.backoff, timeout_s=args.timeout)
    show = sys.stderr.isatty() if args.progress is None else args.progress
    try:
        if args.what == "wikipedia":
            return _wikipedia(args, policy, show)
        return _books(args, policy, show)
    except (NetworkError, DiskFullError, ChecksumMismatchError) as err:
        # Faults, not a flag to change: exit 1, which schedulers retry (the download Job fails at once on 2).
        print(f"bertpipe download: error: {err}", file=sys.stderr)
        return 1
    except (DownloadError, ValueError) as err:
        raise CliError(str(err)) from None
    except OSError as err:  # e.g. --out on a read-only or unwritable path, or a full disk
        full = disk_full_message(err, args.out)
        if full:
            print(f"bertpipe download: error: {full} (finished and partly fetched files are kept and resumed)",
                  file=sys.stderr)
            return 1
        raise CliError(f"{err}; check that --out is a writable directory and rerun (finished files are kept)") from None


def _wikipedia(args: argparse.Namespace, policy, show: bool) -> int:
    from pipeline.download.wikipedia import DEFAULT_MIRROR, download_wikipedia

    source = download_wikipedia(
        args.out, lang=args.lang, date=args.date, mirror=args.mirror or DEFAULT_MIRROR, layout=args.layout,
        jobs=args.jobs, policy=policy, show_progress=show,
    )
    print(f"{source['wiki']} {source['date']}: {len(source['files'])} file(s), {source['size'] / 2**30:.2f} GiB, "
          f"verified, in {args.out} (manifest: {args.out / 'download.json'})")
    return 0


def _books(args: argparse.Namespace, policy, show: bool) -> int:
    from pipeline.download.gutenberg import DEFAULT_MIRROR, Book, download_books, load_catalog

    mirror = args.mirror or DEFAULT_MIRROR
    args.language = args.language or ["en"]  # a default argparse's extend would add to
    if args.limit is not None and args.limit < 1:
        raise CliError("--limit must be >= 1")
    bad_ids = [i for i in args.ids or () if i < 1]
    if bad_ids:  # fetched as cache/epub/-5/pg-5.txt, a 404 after the retries
        raise CliError(f"--ids takes ebook numbers (1 or more), got {bad_ids[0]}")
    if args.ids:
        if args.catalog is not None:
            raise CliError("pass either --ids or --catalog, not both")
        books, catalog_source = [Book(i) for i in dict.fromkeys(args.ids)], "--ids"
    else:
        books, catalog_source = load_catalog(args.catalog, mirror, policy, args.language)
    if args.limit is not None:
        books = books[: args.limit]
    if not books:
        raise CliError(f"the catalogue {catalog_source} has no books in language(s) {', '.join(args.language)}; "
                       "check --catalog and --language")
    result = download_books(args.out, books, mirror=mirror, catalog_source=catalog_source, jobs=args.jobs,
                            policy=policy, show_progress=show)
    print(f"gutenberg: {len(result.written)} book(s) written, {len(result.already)} already there, "
          f"{len(result.skipped)} skipped, {len(result.failed)} failed, in {args.out / 'gutenberg'}")
    for book_id, reason in sorted(result.skipped.items()):
        print(f"  skipped #{book_id}: {reason}")
    if result.failed:
        for book_id, reason in sorted(result.failed.items()):
            print(f"  failed #{book_id}: {reason}")
        print("rerun the same command to resume the failed books")
        return 1
    return 0
