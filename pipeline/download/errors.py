"""Download errors. Each message says what happened and what the user should do next.

The CLI prints the message in one line (no traceback), so the message is all the user sees: it names
the URL or file, and the next step (another date, rerun to resume, free disk space, delete a corrupt
partial file). Network, checksum and disk-space errors exit 1 (a fault: a retry may mend it), the rest 2.
"""

from __future__ import annotations


class DownloadError(Exception):
    """Base class: a download that could not complete; the message says what to change."""


class NotFoundError(DownloadError):
    """The mirror answered 404/410 for a URL."""

    def __init__(self, url: str, hint: str = "") -> None:
        self.url = url
        super().__init__(f"{url} answered HTTP 404 (not found)" + (f"; {hint}" if hint else ""))


class ChecksumMismatchError(DownloadError):
    """A fully downloaded file does not match its published checksum; the partial file is kept, unused."""


class DiskFullError(DownloadError):
    """Not enough free space for the download (checked up front, and on ENOSPC while writing)."""


class NetworkError(DownloadError):
    """The network kept failing after every retry; the partial file is kept for a later resume."""


class FormatError(DownloadError):
    """A downloaded file is not in the format its source promises (e.g. no Gutenberg START marker)."""


class ExistingFileError(DownloadError):
    """A file already sits where the download would go and is not what bertpipe would write there
    (bertpipe names a file only once it is verified, so this one was put there or changed by hand);
    it is left alone and the message says to move it aside."""
