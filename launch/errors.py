"""The one user-error type of `launch/`: raised anywhere below the CLI, printed by it without a traceback.

It lives here, not in `launch.cli`, so that the trainer, fine-tuning and export can raise it without
depending on the CLI layer.
"""

import errno
import time


# When this process imported this module (the CLI does at once): what it wrote is newer.
PROCESS_STARTED = time.time()


class CliError(Exception):
    """A user error: printed as `bertpipe <cmd>: error: <message>` with exit code 2, no traceback.

    The message says what to change.
    """


class Terminated(KeyboardInterrupt):
    """SIGTERM where a command stops as on Ctrl-C (its one line, how to go on), exiting 128 + 15."""

    exit_code = 143


def how_stopped(err: KeyboardInterrupt) -> tuple[int, str]:
    """(exit code, words) of an interrupt: 143 "stopped by SIGTERM" for `Terminated`, else 130 "interrupted"."""
    code = getattr(err, "exit_code", 130)
    return code, "stopped by SIGTERM" if code == Terminated.exit_code else "interrupted"


# The line this process prints when an interrupt stops it, `{how}` left to fill: set by the CLI's entry point
# (`bertpipe demo` runs `sweep` in-process, and the demo's words are the ones that apply). For code that must
# end the process itself where the main thread cannot (local_ray's deadline after SIGTERM).
_stopped_line = ["bertpipe: {how}"]


def set_stopped_line(template: str) -> None:
    _stopped_line[0] = template


def stopped_line(err: KeyboardInterrupt) -> str:
    return _stopped_line[0].format(how=how_stopped(err)[1])


# The packages whose `raise ValueError(...)` is a message to the user (what to change).
OUR_PACKAGES = ("launch", "pipeline", "model")


def raised_by_bertpipe(err: BaseException) -> bool:
    """Whether `err` was raised in bertpipe's own code (its innermost Python frame is in one of OUR_PACKAGES;
    a builtin called from there, `int("x")` on a flag, counts as ours). bertpipe raises ValueError for
    input the user must change; one raised inside a library (a closed file, a decoder's internals) is a bug
    or an unforeseen input, whose traceback is needed and which is no user error."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ours = tuple(os.path.join(root, package) + os.sep for package in OUR_PACKAGES)
    tb, last = err.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and os.path.abspath(last.tb_frame.f_code.co_filename).startswith(ours)


def exception_chain(err: BaseException, limit: int = 8) -> list[BaseException]:
    """`err`, then what it was raised from (or while handling), and so on: at most `limit` of them."""
    chain: list[BaseException] = []
    seen: BaseException | None = err
    while seen is not None and len(chain) < limit:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


class WriteDidNotFit(Exception):
    """A write that did not fit, already said in one line by `disk_full_message` while its evidence was at
    hand (a partial file still filling the disk, before the writer's clean-up freed it)."""


def disk_full_message(err: BaseException, path: object) -> str | None:
    """One line for a write that did not fit (a full disk, a quota, a file-size limit), naming the file or
    `path`, or None when `err` is something else.

    Writers report these in different ways: an OSError (Python), "(os error 28)" (safetensors, in Rust),
    Beam's wrapped text, or a RuntimeError from torch's C++ stream ("iostream error", "unexpected pos"),
    which never says why: for those the file system is asked for its free space, and the file written last
    is compared with this process's file-size limit (`ulimit -f`).
    """
    import os
    import re
    import shutil

    if isinstance(err, WriteDidNotFit):
        return str(err)
    chain = exception_chain(err)
    text = " ".join(str(e) for e in chain)
    codes = [e.errno for e in chain if isinstance(e, OSError)]
    codes += [int(n) for n in re.findall(r"os error (\d+)", text)]
    codes += [code for code, words in WRITE_LIMITS.items() if words in text]
    # A copy's OSError names its source first and its destination second (shutil.copyfile): the destination.
    named = next((e.filename2 or e.filename for e in chain if isinstance(e, OSError) and (e.filename2 or e.filename)),
                 None)
    where = named or path
    code = next((c for c in codes if c in WRITE_LIMITS), None)
    # An OSError that says what it is (permission, a read-only or missing path) is that, whatever the free space.
    said = isinstance(err, OSError) and err.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT,
                                                      errno.EEXIST, errno.ENOTDIR, errno.EISDIR)
    # torch's C++ stream, and numpy's short write ("N requested and M written"), say no errno.
    opaque = any(words in text for words in ("iostream error", "file write failed", "unexpected pos", "requested and"))
    again = "then run the same command again"
    at_limit = _file_at_size_limit(named or path) if code in (None, errno.EFBIG) and not said and (
        opaque or code == errno.EFBIG) else None
    if at_limit is not None:  # torch's stream and numpy say no errno, and EFBIG alone may be a FAT32 disk's 4 GiB
        file, limit = at_limit
        return (f"file too large while writing {file}: it reached this process's file-size limit of {limit} bytes "
                f"(`ulimit -f`); raise it (`ulimit -f unlimited`), {again}")
    if code is None and not said and (opaque or isinstance(err, OSError)):
        try:
            probe = where
            while probe and not os.path.exists(probe):
                probe = os.path.dirname(str(probe))
            if shutil.disk_usage(probe or ".").free < 1 << 20:
                code = errno.ENOSPC
        except OSError:
            pass
    if (code is not None or opaque and not said) and named is None and path is not None and os.path.isdir(str(path)):
        # A write's error names no file (Path.write_text, safetensors): the one written last is most likely it,
        # if this process wrote it (an export's partial folder is gone by now; what is left is the earlier one's).
        newest = _newest_file(str(path), since=PROCESS_STARTED)
        where = f"{path} (the file written last there: {newest})" if newest else path
    if code == errno.ENOSPC:
        return f"no space left on device while writing {where}; free some space, {again}"
    if code == errno.EDQUOT:
        return f"disk quota exceeded while writing {where}; free some space within your quota or write elsewhere, {again}"
    if code == errno.EFBIG:
        return (f"file too large while writing {where}: past the file system's largest file (FAT32: 4 GiB) or the "
                f"shell's `ulimit -f`; write to another file system or raise the limit, {again}")
    if opaque and not said:
        first = next((line for line in text.splitlines() if line.strip()), text)[:200]
        return (f"writing {where} failed ({first.strip()}) with space left on its disk: a quota or a file-size limit "
                f"(`ulimit -f`) may be reached; check them, {again}")
    return None


def _file_at_size_limit(path: object) -> tuple[str, int] | None:
    """(the file, the limit) when `path`, or the newest file under it written by this process, is exactly as
    large as this process's file-size limit (`ulimit -f`, RLIMIT_FSIZE's soft value): the write past it failed
    with EFBIG (SIGXFSZ, which would kill the process, is ignored by Python). None without a limit or such a file."""
    import os
    import resource

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit == resource.RLIM_INFINITY or path is None:
        return None
    if os.path.isdir(str(path)):
        file = _newest_file(str(path), since=PROCESS_STARTED, size=limit)
        return (file, limit) if file else None
    try:
        return (str(path), limit) if os.path.getsize(str(path)) == limit else None
    except OSError:
        return None


def _newest_file(folder: str, since: float, limit: int = 10_000, size: int | None = None) -> str | None:
    """The most recently modified file under `folder` (the first `limit` files looked at), if modified at or
    after `since` (a time.time()), else None; with `size`, of the files of that many bytes."""
    import os

    best, seen = (None, int(since * 1e9) - 1), 0
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            try:
                stat = os.stat(path)
            except OSError:
                continue
            mtime = stat.st_mtime_ns if size is None or stat.st_size == size else -1
            best = max(best, (path, mtime), key=lambda b: b[1])
            seen += 1
            if seen >= limit:
                return best[0]
    return best[0]


# What the C library calls each write limit, as wrapping libraries (Beam) pass it on in text.
WRITE_LIMITS = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded", errno.EFBIG: "File too large"}
