"""Getting the raw data: Wikipedia dumps and Project Gutenberg books, resumable and checksum-verified.

- `http`: the resumable, retrying, verifying downloader (`fetch`), on urllib3 (its `Retry` for retries).
- `checksums`: published sha1/md5 lists and streaming file hashes.
- `wikipedia`: the Wikimedia dump layout (`download_wikipedia`).
- `gutenberg`, `gutenberg_text`: a Gutenberg mirror's layout and catalogue, header/footer stripping.
- `manifest`: `DIR/download.json`, merged by every download into the same directory.

Output directories hold only verified files under their final names (dump parts as the dump names
them, books as `gutenberg/<id>.txt`), plus `download.json` and in-progress `*.part` files, all of
which `bertpipe corpus --input DIR` skips or reads as intended.
"""

from pipeline.download.errors import (
    ChecksumMismatchError,
    DiskFullError,
    DownloadError,
    FormatError,
    NetworkError,
    NotFoundError,
)
from pipeline.download.http import RetryPolicy, fetch

__all__ = [
    "ChecksumMismatchError",
    "DiskFullError",
    "DownloadError",
    "FormatError",
    "NetworkError",
    "NotFoundError",
    "RetryPolicy",
    "fetch",
]
