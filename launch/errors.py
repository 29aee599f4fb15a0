"""The one user-error type of `launch/`: raised anywhere below the CLI, printed by it without a traceback.

It lives here, not in `launch.cli`, so that the trainer, fine-tuning and export can raise it without
depending on the CLI layer.
"""


class CliError(Exception):
    """A user error: printed as `bertpipe <cmd>: error: <message>` with exit code 2, no traceback.

    The message says what to change.
    """


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


def disk_full_message(err: BaseException, path: object) -> str | None:
    """One line for a full disk, naming the path, or None when `err` is something else.

    Writers report a full disk in different ways: an OSError with ENOSPC (Python, safetensors), a
    RuntimeError from torch's C++ stream ("basic_ios::clear: iostream error", which never says why),
    Beam's wrapped "No space left on device". For the opaque ones the file system is asked directly.
    """
    import errno
    import os
    import shutil

    chain = exception_chain(err)
    nospace = any(isinstance(e, OSError) and e.errno == errno.ENOSPC for e in chain)
    text = " ".join(str(e) for e in chain)
    nospace = nospace or "No space left on device" in text
    where = next((e.filename for e in chain if isinstance(e, OSError) and e.filename), None) or path
    # An OSError that says what it is (permission, a read-only or missing path) is that, whatever the free space.
    said = isinstance(err, OSError) and err.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT,
                                                      errno.EEXIST, errno.ENOTDIR, errno.EISDIR)
    if not nospace and not said and ("iostream error" in text or "file write failed" in text or isinstance(err, OSError)):
        try:
            probe = where
            while probe and not os.path.exists(probe):
                probe = os.path.dirname(str(probe))
            nospace = shutil.disk_usage(probe or ".").free < 1 << 20
        except OSError:
            nospace = False
    if not nospace:
        return None
    return f"no space left on device while writing {where}; free some space, then run the same command again"
