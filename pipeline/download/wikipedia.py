"""Wikimedia dump layout: find a dump's `pages-articles` files, fetch them in parallel, verify, record.

A dump lives at `{mirror}/{wiki}/{YYYYMMDD}/` (e.g. `https://dumps.wikimedia.org/enwiki/20260101/`)
with `dumpstatus.json` (every job's status and its files' sizes, sha1 and md5) and the published
checksum lists `{wiki}-{date}-sha1sums.txt` / `-md5sums.txt`. Two layouts of the same articles:

- `parts` (default): the `articlesdump` job's numbered files
  `enwiki-DATE-pages-articles1.xml-p1p41242.bz2`, ... : downloaded in parallel here and read in
  parallel by the corpus job (one Beam read per file).
- `multistream`: the single `enwiki-DATE-pages-articles-multistream.xml.bz2` (job
  `articlesmultistreamdumprecombine`; small wikis have it in `articlesmultistreamdump`). The index
  file is not fetched: the corpus job streams the XML and has no use for it.

Files are written under the output directory with the names the dump gives them; nothing else is
left there that the corpus reader would take for text (checksums go into `download.json`).
"""

from __future__ import annotations

import json
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pipeline.download.checksums import parse_checksum_list
from pipeline.download.errors import DownloadError, ExistingFileError, NotFoundError
from pipeline.download.http import ByteProgress, FetchResult, RetryPolicy, ensure_free_space, fetch, get_bytes, part_path
from pipeline.download.manifest import read_manifest, update_manifest, utc_now
from pipeline.download.retry import Cancel

logger = logging.getLogger(__name__)

DEFAULT_MIRROR = "https://dumps.wikimedia.org"
Layout = Literal["parts", "multistream"]
# Jobs holding each layout, in order of preference.
LAYOUT_JOBS: dict[str, tuple[str, ...]] = {
    "parts": ("articlesdump",),
    "multistream": ("articlesmultistreamdumprecombine", "articlesmultistreamdump"),
}
# How many dated directories `--date latest` looks back through for a finished dump.
LATEST_LOOKBACK = 4


@dataclass(frozen=True)
class DumpFile:
    name: str
    url: str
    size: int | None
    sha1: str | None
    md5: str | None
    verify_with: str  # "sha1" or "md5": the published checksum list's algorithm when there is one

    @property
    def checksum(self) -> dict[str, str]:
        return {self.verify_with: self.sha1 if self.verify_with == "sha1" else self.md5}


def wiki_name(lang: str) -> str:
    """`en` -> `enwiki`; `zh-min-nan` -> `zh_min_nanwiki` (Wikimedia's database names)."""
    if not re.fullmatch(r"[a-z][a-z0-9-]{0,30}", lang):
        raise ValueError(f"--lang {lang!r} is not a Wikipedia language code like 'en', 'de' or 'zh-min-nan'")
    return lang.replace("-", "_") + "wiki"


def _file_pattern(wiki: str, date: str, layout: Layout) -> re.Pattern[str]:
    stem = "pages-articles" if layout == "parts" else "pages-articles-multistream"
    return re.compile(rf"{re.escape(wiki)}-{date}-{stem}(\d+)?\.xml(-p\d+p\d+)?\.bz2")


def _part_order(name: str) -> tuple[int, str]:
    match = re.search(r"\.xml-p(\d+)p\d+", name)
    return (int(match.group(1)) if match else 0, name)


def list_dump_dates(mirror: str, wiki: str, policy: RetryPolicy) -> list[str]:
    """Dated directories in the mirror's `{wiki}/` index page, newest first."""
    url = f"{mirror}/{wiki}/"
    html = get_bytes(url, policy, not_found_hint=f"is --lang right, and does the mirror carry {wiki}?").decode("utf-8", "replace")
    return sorted(set(re.findall(r'href="(\d{8})/?"', html)), reverse=True)


def dump_status(mirror: str, wiki: str, date: str, policy: RetryPolicy) -> dict[str, Any] | None:
    """The dump's `dumpstatus.json`, or None when the mirror does not carry one."""
    url = f"{mirror}/{wiki}/{date}/dumpstatus.json"
    try:
        raw = get_bytes(url, policy)
    except NotFoundError:
        return None
    try:
        status = json.loads(raw)
    except ValueError as err:
        raise DownloadError(f"{url} is not valid JSON ({err}); try another --mirror") from None
    if not isinstance(status, dict) or not isinstance(status.get("jobs"), dict):
        raise DownloadError(f"{url} has no 'jobs' mapping; try another --mirror")
    problem = _status_shape_problem(status["jobs"])
    if problem:
        raise DownloadError(f"{url}: {problem}; try another --mirror")
    return status


def _status_shape_problem(jobs: dict[str, Any]) -> str | None:
    """What in the jobs we read is not of the shape the dumps publish (a mirror's broken copy), or None.
    The dump's other jobs (history, stubs, ...) are not ours to judge."""
    ours = [job for layout_jobs in LAYOUT_JOBS.values() for job in layout_jobs if job in jobs]
    for job, info in ((job, jobs[job]) for job in dict.fromkeys(ours)):
        if not isinstance(info, dict):
            return f"jobs.{job} is not an object"
        files = info.get("files", {})
        if not isinstance(files, dict):
            return f"jobs.{job}.files is not an object"
        for name, meta in files.items():
            if not isinstance(meta, dict):
                return f"jobs.{job}.files.{name} is not an object"
            size = meta.get("size")
            if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
                return f"jobs.{job}.files.{name}.size is {size!r}, not a byte count"
            for key in ("sha1", "md5"):
                if meta.get(key) is not None and not isinstance(meta[key], str):
                    return f"jobs.{job}.files.{name}.{key} is {meta[key]!r}, not a hex digest"
    return None


def _job_for(status: dict[str, Any], layout: Layout) -> tuple[str, dict[str, Any]] | None:
    for job in LAYOUT_JOBS[layout]:
        info = status["jobs"].get(job)
        if info and info.get("status") == "done" and info.get("files"):
            return job, info
    return None


def resolve_date(mirror: str, wiki: str, date: str, layout: Layout, policy: RetryPolicy) -> tuple[str, dict[str, Any] | None]:
    """(date, dumpstatus) for `date`, or for the newest finished dump when `date` is `latest`."""
    if date != "latest":
        if not re.fullmatch(r"\d{8}", date):
            raise ValueError(f"--date {date!r} is not YYYYMMDD or 'latest'")
        return date, dump_status(mirror, wiki, date, policy)
    dates = list_dump_dates(mirror, wiki, policy)
    for candidate in dates[:LATEST_LOOKBACK]:
        status = dump_status(mirror, wiki, candidate, policy)
        if status is not None and _job_for(status, layout) is not None:
            return candidate, status
        logger.info("%s %s: pages-articles not finished yet; looking at the previous dump", wiki, candidate)
    raise DownloadError(
        f"no finished {wiki} pages-articles dump among the newest {LATEST_LOOKBACK} at {mirror}/{wiki}/ "
        f"({', '.join(dates[:LATEST_LOOKBACK]) or 'none listed'}); pass --date YYYYMMDD of one that is done"
    )


def _checksum_list(mirror: str, wiki: str, date: str, policy: RetryPolicy) -> tuple[str, str, dict[str, str]] | None:
    """(algorithm, url, {name: digest}) from the dump's published sha1 list, else its md5 list."""
    for algorithm in ("sha1", "md5"):
        url = f"{mirror}/{wiki}/{date}/{wiki}-{date}-{algorithm}sums.txt"
        try:
            text = get_bytes(url, policy).decode("utf-8")
        except NotFoundError:
            continue
        try:
            return algorithm, url, parse_checksum_list(text, algorithm)
        except ValueError as err:
            raise DownloadError(f"{url}: {err}; try another --mirror") from None
    return None


def plan_dump(mirror: str, lang: str, date: str, layout: Layout, policy: RetryPolicy) -> tuple[str, str, str, list[DumpFile], dict[str, Any]]:
    """Resolve what to fetch: (wiki, date, checksum list url, files, provenance for the manifest)."""
    mirror = mirror.rstrip("/")
    wiki = wiki_name(lang)
    date, status = resolve_date(mirror, wiki, date, layout, policy)
    sums = _checksum_list(mirror, wiki, date, policy)
    if status is None and sums is None:
        raise NotFoundError(
            f"{mirror}/{wiki}/{date}/",
            f"the mirror has no {wiki} dump dated {date} (no dumpstatus.json and no checksum list). Dumps are "
            f"kept for a few months only: see the dates listed at {mirror}/{wiki}/ or pass --date latest",
        )
    pattern = _file_pattern(wiki, date, layout)
    provenance: dict[str, Any] = {}
    if status is not None:
        found = _job_for(status, layout)
        if found is None:
            states = {job: status["jobs"].get(job, {}).get("status", "absent") for job in LAYOUT_JOBS[layout]}
            raise DownloadError(
                f"the {wiki} {date} dump's {layout} files are not ready ({', '.join(f'{j}: {s}' for j, s in states.items())}); "
                "pass an earlier --date, or --date latest for the newest finished dump"
            )
        job, info = found
        provenance = {"job": job, "job_updated": info.get("updated"), "dumpstatus_version": status.get("version")}
        listed = {name: meta for name, meta in info["files"].items() if pattern.fullmatch(name)}
    else:
        logger.warning("%s/%s/%s has no dumpstatus.json; taking the file list from the checksum list", mirror, wiki, date)
        listed = {name: {} for name in sums[2] if pattern.fullmatch(name)}
    # The numbered parts and the recombined single file hold the same pages: never fetch both.
    numbered = {n: m for n, m in listed.items() if pattern.fullmatch(n).group(1)}
    single = {n: m for n, m in listed.items() if n not in numbered}
    listed = (numbered or single) if layout == "parts" else (single or numbered)
    if not listed:
        raise DownloadError(f"the {wiki} {date} dump lists no {layout} pages-articles files; try --layout "
                            f"{'multistream' if layout == 'parts' else 'parts'}")
    algorithm, sums_url, digests = sums if sums is not None else ("", "", {})
    files = []
    for name in sorted(listed, key=_part_order):
        meta = listed[name]
        sha1, md5 = meta.get("sha1"), meta.get("md5")
        if algorithm == "sha1":
            sha1 = digests.get(name, sha1)
        elif algorithm == "md5":
            md5 = digests.get(name, md5)
        if not sha1 and not md5:
            raise DownloadError(f"no published checksum for {name} at {mirror}/{wiki}/{date}/; cannot verify it, try another --mirror")
        verify_with = algorithm if digests.get(name) else ("sha1" if sha1 else "md5")
        files.append(DumpFile(name, f"{mirror}/{wiki}/{date}/{name}", meta.get("size"), sha1, md5, verify_with))
    provenance["checksum_list"] = sums_url or f"{mirror}/{wiki}/{date}/dumpstatus.json"
    return wiki, date, sums_url, files, provenance


def download_wikipedia(
    out: Path,
    *,
    lang: str = "en",
    date: str = "latest",
    mirror: str = DEFAULT_MIRROR,
    layout: Layout = "parts",
    jobs: int = 2,
    policy: RetryPolicy = RetryPolicy(),
    show_progress: bool = False,
) -> dict[str, Any]:
    """Fetch, verify and record one dump's pages-articles files into `out`; returns the source entry."""
    mirror = mirror.rstrip("/")
    wiki, date, _, files, provenance = plan_dump(mirror, lang, date, layout, policy)
    _warn_about_other_copies(out, wiki, date, layout)
    known = [f.size for f in files if f.size is not None]
    total = sum(known) if len(known) == len(files) else None
    if total is not None:
        remaining = sum(f.size - _on_disk(out, f) for f in files)
        ensure_free_space(out, remaining, f"the {wiki} {date} dump ({len(files)} files, {total / 2**30:.2f} GiB)")
    logger.info(
        "%s %s (%s): %d file(s)%s from %s", wiki, date, layout, len(files),
        f", {total / 2**30:.2f} GiB" if total is not None else "", mirror,
    )
    progress = ByteProgress(total, enabled=show_progress, desc=f"{wiki}-{date}")
    try:
        results = _fetch_all(files, out, jobs, policy, progress)
    finally:
        progress.close()
    fetched_at = utc_now()
    source_key = f"wikipedia/{wiki}-{date}/{layout}"
    manifest_files = {}
    for f, result in zip(files, results):
        entry = {"source": source_key, "url": f.url, "size": result.size, **result.digests, "fetched_at": fetched_at}
        manifest_files[f.name] = entry
    source = {
        "kind": "wikipedia", "lang": lang, "wiki": wiki, "date": date, "mirror": mirror, "layout": layout,
        **provenance, "files": [f.name for f in files], "size": sum(r.size for r in results), "fetched_at": fetched_at,
    }
    update_manifest(out, source_key, source, manifest_files)
    logger.info("%s %s: %d file(s) verified in %s", wiki, date, len(files), out)
    return source


def _warn_about_other_copies(out: Path, wiki: str, date: str, layout: str) -> None:
    """Another date or layout of the same wiki in `out` would be read twice by the corpus stage."""
    for key, other in read_manifest(out)["sources"].items():
        if other.get("kind") != "wikipedia" or other.get("wiki") != wiki:
            continue
        if (other.get("date"), other.get("layout")) == (date, layout):
            continue
        present = [name for name in other.get("files", []) if (out / name).exists()]
        if present:
            logger.warning(
                "%s already holds %s (%s layout, %d file(s)): `bertpipe corpus --input %s` would read the same "
                "articles twice; delete those files (listed in download.json under %s) or use another --out",
                out, key, other.get("layout"), len(present), out, key,
            )


def _on_disk(out: Path, f: DumpFile) -> int:
    dest = out / f.name
    if dest.exists():
        return dest.stat().st_size
    part = part_path(dest)
    return min(part.stat().st_size, f.size or 0) if part.exists() else 0


def _fetch_all(files: list[DumpFile], out: Path, jobs: int, policy: RetryPolicy, progress: ByteProgress) -> list[FetchResult]:
    """Fetch every file, `jobs` at a time. One failure does not stop the others (their bytes are
    kept for the rerun); the first error is raised once all have finished, naming the rest."""

    cancel = Cancel()  # set: every worker stops, a stalled read at once

    def one(f: DumpFile) -> FetchResult:
        # One published digest is enough to verify; hashing a 20 GB dump twice is not free.
        try:
            return fetch(f.url, out / f.name, expected_size=f.size, checksums=f.checksum, policy=policy,
                         progress=progress, cancel=cancel, extra_digests=())
        except ExistingFileError as err:
            # Said now, not only once the other parts (hours of them) have finished downloading.
            logger.error("%s", err)
            raise

    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="download") as pool:
        futures = [pool.submit(one, f) for f in files]
        errors, results = [], []
        try:
            for f, future in zip(files, futures):
                try:
                    results.append(future.result())
                except DownloadError as err:
                    errors.append((f.name, err))
        except BaseException:
            # Ctrl-C (or a fatal error): stop the other transfers now instead of finishing
            # multi-GB files; their .part files stay for the rerun.
            cancel.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    if errors:
        first = errors[0][1]
        if len(errors) > 1:
            others = "; ".join(f"{name}: {err}" for name, err in errors[1:])
            first.args = (f"{first} (and {len(errors) - 1} more failed: {others})",)
        raise first
    return results
