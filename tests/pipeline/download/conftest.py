"""A local HTTP mirror on 127.0.0.1 serving the bundled real data in Wikimedia's and Gutenberg's layouts.

`MirrorServer` is a threaded `http.server` with Range / If-Range support that logs every request
(path, Range header) and can inject the failures the downloader must survive: a connection cut
after byte K (once), a flipped byte, a 503. The `mirror` fixture fills it with:

- `/enwiki/` index listing 20251201, 20260101 (finished) and 20260120 (still running);
- `/enwiki/20260101/`: the bundled real `pages-articles` sample split at a page boundary into two
  numbered parts (each a complete dump XML with its siteinfo, as Wikimedia's parts are), the
  original file as the recombined dump and as the multistream dump plus an index file, `enwiki-20260101-sha1sums.txt`,
  `-md5sums.txt` and `dumpstatus.json`;
- `/enwiki/20251201/`: a dump whose status lists an impossible size (for the disk-space check);
- Gutenberg: `cache/epub/feeds/pg_catalog.csv`, Persuasion as `cache/epub/105/pg105.txt` (2020s
  format, BOM, CRLF) and Northanger Abbey only as `files/121/121-0.txt` (2000s format), both the
  bundled novels wrapped in the real Gutenberg header and footer.
"""

from __future__ import annotations

import bz2
import hashlib
import json
import re
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest

from repo_paths import DATA, FIXTURES as _FIXTURES, WIKI_DUMP as WIKI_SAMPLE

FIXTURES = _FIXTURES / "download"
DATE = "20260101"
PART1 = f"enwiki-{DATE}-pages-articles1.xml-p10p12000.bz2"
PART2 = f"enwiki-{DATE}-pages-articles2.xml-p12001p30302.bz2"
MULTISTREAM = f"enwiki-{DATE}-pages-articles-multistream.xml.bz2"
MULTISTREAM_INDEX = f"enwiki-{DATE}-pages-articles-multistream-index.txt.bz2"
RECOMBINED = f"enwiki-{DATE}-pages-articles.xml.bz2"  # the same pages as the parts, in one file

BOOKS = {
    105: dict(file="persuasion.txt", title="Persuasion", author="Jane Austen", release="June 5, 2008",
              updated="March 1, 2024", credits="Produced by Sharon Partridge and Martin Ward. HTML version by Al Haines.",
              style="2020s"),
    121: dict(file="northangerabbey.txt", title="Northanger Abbey", author="Jane Austen", release="February, 1994",
              updated="November 18, 2012", credits="Produced by An Anonymous Volunteer", style="2000s"),
}


@dataclass
class RequestRecord:
    path: str
    range: str | None
    if_range: str | None
    status: int


@dataclass
class MirrorServer:
    files: dict[str, bytes] = field(default_factory=dict)
    log: list[RequestRecord] = field(default_factory=list)
    cut_after: dict[str, int] = field(default_factory=dict)  # path -> byte offset; one-shot
    corrupt_at: dict[str, int] = field(default_factory=dict)  # path -> offset of a flipped byte
    fail_status: dict[str, list[int]] = field(default_factory=dict)  # path -> statuses to answer first
    redirects: dict[str, str] = field(default_factory=dict)  # path -> where a 302 sends it
    stall_after: dict[str, int] = field(default_factory=dict)  # path -> bytes sent before the connection stalls
    html_instead: set[str] = field(default_factory=set)  # paths answered 200 with an HTML error page
    release: threading.Event = field(default_factory=threading.Event)  # ends every stall (set at teardown)
    url: str = ""

    def requests_for(self, path: str) -> list[RequestRecord]:
        return [r for r in self.log if r.path == path]

    def body(self, path: str) -> bytes:
        data = self.files[path]
        if path in self.corrupt_at:
            at = self.corrupt_at[path]
            data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]
        return data


def _handler(server: MirrorServer) -> type[BaseHTTPRequestHandler]:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # one request per connection: a cut closes the response

        def log_message(self, *args) -> None:  # keep pytest output clean; requests go to server.log
            pass

        def _record(self, path: str, status: int) -> None:
            with lock:
                server.log.append(RequestRecord(path, self.headers.get("Range"), self.headers.get("If-Range"), status))

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = urlparse(self.path).path
            with lock:
                queued = server.fail_status.get(path)
                fail = queued.pop(0) if queued else None
            if path in server.redirects:
                self._record(path, 302)
                self._send(302, b"", {"Location": server.redirects[path]})
                return
            if fail is not None:
                self._record(path, fail)
                self.send_response(fail)
                self.send_header("Retry-After", "0")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if path in server.html_instead:  # what a captive portal or a broken mirror sends
                self._record(path, 200)
                self._send(200, b"<html><body>Service unavailable</body></html>", {"Content-Type": "text/html"})
                return
            if path not in server.files:
                listing = self._listing(path)
                if listing is None:
                    self._record(path, 404)
                    self.send_error(404)
                    return
                self._record(path, 200)
                self._send(200, listing, {"Content-Type": "text/html"})
                return
            data = server.body(path)
            etag = '"%s"' % hashlib.sha1(server.files[path]).hexdigest()
            start, status = 0, 200
            range_header = self.headers.get("Range")
            if_range = self.headers.get("If-Range")
            if range_header and (if_range is None or if_range == etag):
                match = re.fullmatch(r"bytes=(\d+)-(\d*)", range_header)
                assert match, range_header
                start = int(match.group(1))
                if start >= len(data):
                    self._record(path, 416)
                    self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                    return
                end = int(match.group(2)) + 1 if match.group(2) else len(data)
                data, status = data[start:end], 206
            headers = {"ETag": etag, "Accept-Ranges": "bytes"}
            if status == 206:
                headers["Content-Range"] = f"bytes {start}-{start + len(data) - 1}/{len(server.files[path])}"
            self._record(path, status)
            with lock:
                cut = server.cut_after.pop(path, None)
            stall = server.stall_after.get(path)
            if stall is not None and start < stall:
                # Promise the full length, send bytes up to `stall`, then neither send nor close.
                self._send(status, data, headers, send_bytes=stall - start)
                server.release.wait(60)
                return
            if cut is not None and start <= cut:
                # Promise the full length, send bytes up to `cut`, drop the connection.
                self._send(status, data, headers, send_bytes=cut - start)
                return
            self._send(status, data, headers)

        def _send(self, status: int, data: bytes, headers: dict[str, str], send_bytes: int | None = None) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data if send_bytes is None else data[:send_bytes])
            self.wfile.flush()

        def _listing(self, path: str) -> bytes | None:
            if not path.endswith("/"):
                return None
            children = sorted({p[len(path):].split("/")[0] for p in server.files if p.startswith(path)})
            if not children:
                return None
            links = "".join(f'<a href="{c}/">{c}/</a>\n' for c in children)
            return f"<html><body><pre>\n{links}</pre></body></html>".encode()

    return Handler


class _QuietServer(ThreadingHTTPServer):
    """The download tests' clients drop connections on purpose (cut transfers, timeouts); socketserver
    printed each such reset with a traceback on stderr, which pytest-xdist workers do not capture."""

    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # BrokenPipeError, ConnectionResetError, ...
            super().handle_error(request, client_address)


@pytest.fixture
def http_server():
    server = MirrorServer()
    httpd = _QuietServer(("127.0.0.1", 0), _handler(server))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="mirror", daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield server
    finally:
        server.release.set()
        httpd.shutdown()
        httpd.server_close()


def _gutenberg_file(book_id: int) -> str:
    """A bundled Austen novel wrapped in the real Gutenberg header/footer (LF line endings)."""
    spec = BOOKS[book_id]
    body = (DATA / "books" / spec["file"]).read_text(encoding="utf-8")
    values = dict(spec, id=book_id, title_upper=spec["title"].upper(), id_path="/".join(str(book_id)[:-1]) + f"/{book_id}")
    header = (FIXTURES / f"gutenberg_header_{spec['style']}.txt").read_text(encoding="utf-8").format(**values)
    footer = (FIXTURES / f"gutenberg_footer_{spec['style']}.txt").read_text(encoding="utf-8").format(**values)
    if spec["style"] == "2020s":
        return header + "\n" + body + "\n\n\n" + footer
    return header + body + footer


@pytest.fixture(scope="session")
def gutenberg_file():
    """`gutenberg_file(book_id) -> str`: a bundled novel in its real Gutenberg wrapper."""
    return _gutenberg_file


def _split_dump(xml: bytes) -> tuple[bytes, bytes]:
    """The dump XML as two complete dumps (siteinfo header in both), split at a page boundary."""
    head_end = xml.index(b"</siteinfo>\n") + len(b"</siteinfo>\n")
    pages_end = xml.rindex(b"</mediawiki>")
    pages = xml[head_end:pages_end]
    middle = pages.index(b"  <page>", len(pages) // 2)
    head, tail = xml[:head_end], xml[pages_end:]
    return head + pages[:middle] + tail, head + pages[middle:] + tail


@pytest.fixture(scope="session")
def mirror_content() -> dict[str, bytes]:
    raw = WIKI_SAMPLE.read_bytes()
    part1, part2 = _split_dump(bz2.decompress(raw))
    index = b"".join(f"{600 + i * 10}:{10 + i}:Page {i}\n".encode() for i in range(20))
    dump = {PART1: bz2.compress(part1, 6), PART2: bz2.compress(part2, 6), MULTISTREAM: raw, MULTISTREAM_INDEX: bz2.compress(index),
            RECOMBINED: raw}
    files: dict[str, bytes] = {}
    base = f"/enwiki/{DATE}/"
    for name, data in dump.items():
        files[base + name] = data
    files[base + f"enwiki-{DATE}-sha1sums.txt"] = "".join(
        f"{hashlib.sha1(d).hexdigest()}  {n}\n" for n, d in sorted(dump.items())).encode()
    files[base + f"enwiki-{DATE}-md5sums.txt"] = "".join(
        f"{hashlib.md5(d).hexdigest()}  {n}\n" for n, d in sorted(dump.items())).encode()

    def job(names: list[str], status: str = "done", sizes: dict[str, int] | None = None) -> dict:
        return {"status": status, "updated": "2026-01-03 10:11:12", "files": {
            n: {"size": (sizes or {}).get(n, len(dump[n])), "url": f"{base}{n}", "md5": hashlib.md5(dump[n]).hexdigest(),
                "sha1": hashlib.sha1(dump[n]).hexdigest()} for n in names}}

    files[base + "dumpstatus.json"] = json.dumps({"jobs": {
        "articlesdump": job([PART1, PART2]),
        "articlesdumprecombine": job([RECOMBINED]),
        "articlesmultistreamdumprecombine": job([MULTISTREAM, MULTISTREAM_INDEX]),
        "metahistorybz2dump": {"status": "waiting", "updated": "2026-01-02 00:00:00", "files": {}},
    }, "version": "0.8"}).encode()
    # An in-progress newer dump (`latest` must skip it) and an older one claiming a petabyte.
    files["/enwiki/20260120/dumpstatus.json"] = json.dumps({"jobs": {
        "articlesdump": {"status": "in-progress", "updated": "2026-01-21 00:00:00", "files": {}}}, "version": "0.8"}).encode()
    huge = json.loads(files[base + "dumpstatus.json"].decode().replace(DATE, "20251201"))
    for meta in huge["jobs"]["articlesdump"]["files"].values():
        meta["size"] = 10**15
    files["/enwiki/20251201/dumpstatus.json"] = json.dumps(huge).encode()

    for book_id, spec in BOOKS.items():
        text = _gutenberg_file(book_id)
        if spec["style"] == "2020s":
            files[f"/cache/epub/{book_id}/pg{book_id}.txt"] = b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("utf-8")
        else:
            files[f"/files/{book_id}/{book_id}-0.txt"] = text.replace("\n", "\r\n").encode("utf-8")
    files["/cache/epub/feeds/pg_catalog.csv"] = (
        "Text#,Type,Issued,Title,Language,Authors,Subjects,LoCC,Bookshelves\n"
        '105,Text,2008-06-05,Persuasion,en,"Austen, Jane, 1775-1817",Domestic fiction,PR,Category: Novels\n'
        '121,Text,1994-02-01,Northanger Abbey,en,"Austen, Jane, 1775-1817",Gothic fiction,PR,Category: Novels\n'
        '9999999,Text,2020-01-01,A Missing Book,en,"Nobody",,,\n'
        '17989,Text,2006-03-05,Le comte de Monte-Cristo,fr,"Dumas, Alexandre",,,\n'
        '10000,Sound,2003-01-01,An Audio Book,en,"Someone",,,\n'
    ).encode()
    return files


@pytest.fixture
def mirror(http_server: MirrorServer, mirror_content: dict[str, bytes]) -> MirrorServer:
    http_server.files.update(mirror_content)
    return http_server


@pytest.fixture(scope="session")
def dump_names() -> dict:
    """Names of the dump files the mirror serves (tests import nothing from conftest)."""
    return {"date": DATE, "parts": [PART1, PART2], "multistream": MULTISTREAM, "index": MULTISTREAM_INDEX}
