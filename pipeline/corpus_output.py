"""The corpus job's output directory: what an earlier run left there, and what bertpipe may delete.

One set of rules for a local `--out` and a remote one (gs://, s3://, hdfs://). Object stores have no
directories: a "folder" is a key prefix, `FileSystems.delete` of a prefix without a trailing `/` finds
no object, and a listing is by prefix. So everything here lists objects under `OUT/` and deletes
the objects themselves: a rerun with fewer shards must not leave the earlier shards (or the earlier
run's word counts and shard list in the temp folder) to be read as part of the new corpus.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from pipeline.manifest import FORMAT
from pipeline.named_writes import naming, write_file

log = logging.getLogger(__name__)

TMP = ".bertpipe-tmp"  # the job's temp folder in OUT; its presence marks an unfinished corpus of ours
# In TMP, written before anything else in OUT: an object store has no empty folders, and the job's first
# files (dead letters, shards) are not in TMP, so without it a stopped job's files were refused as the user's.
JOB_MARKER = "corpus_job.json"
# In TMP: the unfinished job was built with `--vocab OUT/vocab.txt`, the user's file (its manifest, which
# says so for a finished corpus, is not written yet).
USERS_VOCAB = "vocab_is_users"
DEAD_LETTER = "dead_letter"
# Top-level names in OUT that a corpus writes (besides its shards).
OWN_NAMES = ("manifest.json", TMP, DEAD_LETTER, "vocab.txt")
# The names a corpus gives its shards (`pipeline.shards.shard_name`), and its dead letters and Beam's temp
# folder for them inside dead_letter/: other files there are the user's, and stay.
SHARD_NAME = re.compile(r"(?:train|heldout)-\d{5,}-of-\d{5,}\.(?:arrow|parquet)")  # {5,}: 100,000 shards and more
DEAD_LETTER_NAME = re.compile(r"dead_letter-\d{5,}-of-\d{5,}\.jsonl|beam-temp-dead_letter-\w+")


def is_remote(path: str) -> bool:
    return "://" in path


def _entries(out: str) -> dict[str, list[str]]:
    """Top-level name in `out` -> the files under it (a local folder is one entry, deleted as a whole)."""
    if not is_remote(out):
        if not os.path.isdir(out):
            return {}
        return {name: [os.path.join(out, name)] for name in os.listdir(out)}
    prefix = out.rstrip("/") + "/"
    found: dict[str, list[str]] = {}
    for meta in FileSystems.match([prefix + "**"])[0].metadata_list:
        if meta.path.startswith(prefix):
            found.setdefault(meta.path[len(prefix):].split("/", 1)[0], []).append(meta.path)
    return found


def delete_tree(path: str) -> None:
    """Remove a file or folder of ours, local or remote (on an object store: every object under it)."""
    if not is_remote(path):
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)
        return
    objects = [m.path for m in FileSystems.match([path.rstrip("/") + "/**"])[0].metadata_list]
    objects += [path] if FileSystems.exists(path) else []
    if objects:
        FileSystems.delete(objects)


def same_file(a: str, b: str) -> bool:
    if is_remote(a) or is_remote(b):
        return a.rstrip("/") == b.rstrip("/")
    try:
        return os.path.samefile(a, b)
    except OSError:  # b is gone
        return False


def previous_manifest(path: str) -> tuple[dict, str | None]:
    """(An earlier corpus's manifest in --out, or {}; why it cannot be read, when it is there but damaged)."""
    try:
        if not FileSystems.exists(path):
            return {}, None
        manifest = json.loads(_read_bytes(path).decode("utf-8"))
    except (OSError, ValueError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return {}, f"{type(err).__name__}: {err}"
    return (manifest if isinstance(manifest, dict) else {}), None


def _vocab_is_users(manifest: dict, own_vocab: str) -> bool:
    """Whether the earlier corpus (`manifest`) was built with `--vocab OUT/vocab.txt`, a file it did not
    write. Recorded since `vocab_is_users`; before, only the --vocab path as typed, which a relative path
    run from another directory no longer names (the user's file was then deleted with the old corpus)."""
    if "vocab_is_users" in manifest:
        return manifest["vocab_is_users"] is True
    config = manifest.get("config")
    source = config.get("vocab") if isinstance(config, dict) else None
    return isinstance(source, str) and same_file(own_vocab, source)


def _read_bytes(path: str) -> bytes:
    with FileSystems.open(path) as f:
        return f.read()


def clear_previous_output(out: str, vocab_source: str | None, vocab_text: str | None) -> bool:
    """Remove an earlier corpus's files from `out` (a rerun with fewer shards must not leave stale ones),
    but only where bertpipe provably wrote them: `out` holds our manifest or our unfinished-job folder.
    Anything else under a name the corpus writes (a vocab.txt of the user's) is refused, not overwritten.
    Returns whether `OUT/vocab.txt` is the user's (`--vocab OUT/vocab.txt`, a file no corpus of ours
    wrote), for the new manifest to record."""
    entries = _entries(out)
    names = [n for n in entries if n.endswith((".arrow", ".parquet")) and "-of-" in n or n in OWN_NAMES]
    own_vocab = FileSystems.join(out, "vocab.txt")
    earlier, damage = previous_manifest(FileSystems.join(out, "manifest.json"))
    # Our temp folder (a folder: a file of that name is no job's) or our manifest. An empty folder counts too:
    # a job stopped while it clears or starts leaves one, and the name is this job's alone.
    unfinished = TMP in entries and (is_remote(out) or os.path.isdir(os.path.join(out, TMP)))
    ours = unfinished or earlier.get("format") == FORMAT
    vocab_was_users = _vocab_is_users(earlier, own_vocab) or (
        TMP in entries and FileSystems.exists(FileSystems.join(out, TMP, USERS_VOCAB)))
    users_vocab = False
    if vocab_source and "vocab.txt" in names and same_file(own_vocab, vocab_source):
        # `--vocab OUT/vocab.txt`: kept as it is, so it must already be what the corpus would write.
        if _read_bytes(own_vocab) != vocab_text.encode("utf-8"):
            raise ValueError(f"--vocab {vocab_source} is --out's own vocab.txt, and the corpus would rewrite it "
                             "(it has a byte-order mark or CRLF line ends): pass a copy outside --out")
        names.remove("vocab.txt")
        # The user's, unless the earlier corpus of ours wrote these very bytes (a trained vocab reused).
        written_by_us = (ours and not vocab_was_users
                         and earlier.get("vocab_sha256") == hashlib.sha256(vocab_text.encode("utf-8")).hexdigest())
        users_vocab = not written_by_us
    elif "vocab.txt" in names and vocab_was_users:
        # The earlier corpus was built with `--vocab OUT/vocab.txt`: the user's file, never ours to delete.
        raise ValueError(f"--out {out} holds the vocab.txt its earlier corpus was built with (--vocab {own_vocab}), "
                         f"which bertpipe did not write: pass --vocab {own_vocab} to build with it again, "
                         "or choose another --out")
    if not names:
        return users_vocab
    if not ours and damage:  # ours or not, nobody can tell: deleting it is the user's call
        raise ValueError(f"--out {out} holds a manifest.json that cannot be read ({damage}), so bertpipe cannot tell "
                         f"its files from yours: if it is a corpus bertpipe wrote, delete {out} and run the same "
                         "command again; else choose another --out")
    if not ours:
        raise ValueError(f"--out {out} holds {', '.join(sorted(names)[:3])}{' ...' if len(names) > 3 else ''}, "
                         "which `bertpipe corpus` did not write (no corpus manifest.json of ours): choose another --out")
    # Our shards: those the earlier manifest lists, or any under a shard's name while an unfinished job of
    # ours (TMP) may have written it. A shard-like file beside them is the user's: refused, not deleted.
    listed = {s.get("path") for s in earlier.get("shards", []) if isinstance(s, dict)}
    strays = [n for n in names if n not in OWN_NAMES and not (n in listed or unfinished and SHARD_NAME.fullmatch(n))]
    if DEAD_LETTER in names and not is_remote(out) and not os.path.isdir(os.path.join(out, DEAD_LETTER)):
        strays.append(DEAD_LETTER)  # a file: ours is a folder
    if strays:
        raise ValueError(f"--out {out} holds {', '.join(sorted(strays)[:3])}{' ...' if len(strays) > 3 else ''} "
                         "beside an earlier corpus, which bertpipe did not write: move it out, or choose another --out")
    # What proves the folder ours goes last (the manifest, then the unfinished-job folder): a run killed while
    # it deletes leaves OUT still ours to its rerun, not a few bare shards the rerun must refuse as a user's.
    for name in sorted(names, key=lambda n: (n == TMP, n == "manifest.json")):
        if name == DEAD_LETTER:
            _delete_dead_letters(out, entries[name])
        elif is_remote(out):
            FileSystems.delete(entries[name])
        else:
            delete_tree(os.path.join(out, name))
    return users_vocab


def mark_unfinished(out: str, users_vocab: bool) -> None:
    """Make `out` and the job's temp folder with its marker in it, before the job writes anything else there:
    a rerun after this job fails, is stopped or killed (or fills the disk) then clears what it left as ours.
    With `users_vocab`, also record that `OUT/vocab.txt` is the user's: with no manifest yet to say so, that
    rerun must not take it for the vocabulary of a corpus of ours and delete it."""
    tmp = FileSystems.join(out, TMP)
    if not FileSystems.exists(tmp):
        FileSystems.mkdirs(tmp)  # and `out`; a no-op on an object store
    if users_vocab:  # first: a job killed between the two must not leave OUT ours with the vocab not the user's
        write_file(FileSystems.join(tmp, USERS_VOCAB), b"")
    write_file(FileSystems.join(tmp, JOB_MARKER), json.dumps({"format": FORMAT, "finished": False}).encode("utf-8"))


def _delete_dead_letters(out: str, objects: list[str]) -> None:
    """The earlier run's dead letters (and a killed run's Beam temp folder) in dead_letter/; a file of the
    user's there stays, and so does the folder then."""
    if is_remote(out):
        prefix = FileSystems.join(out, DEAD_LETTER).rstrip("/") + "/"
        ours = [o for o in objects if DEAD_LETTER_NAME.fullmatch(o[len(prefix):].split("/", 1)[0])]
        if ours:
            FileSystems.delete(ours)
        return
    folder = os.path.join(out, DEAD_LETTER)
    for name in os.listdir(folder):
        if DEAD_LETTER_NAME.fullmatch(name):
            delete_tree(os.path.join(folder, name))
    if not os.listdir(folder):
        os.rmdir(folder)


def _in(path: str, out: str) -> bool:
    """Whether `path` is `out` or lies under it."""
    if is_remote(out):
        return path.rstrip("/") == out.rstrip("/") or path.startswith(out.rstrip("/") + "/")
    return not is_remote(path) and os.path.join(os.path.abspath(path), "").startswith(os.path.join(os.path.abspath(out), ""))


def refuse_inputs_in_out(inputs: list[str], out: str) -> None:
    """An `--input` named inside `--out` (a file, a folder, a glob's fixed part): its text would be left out
    without a word, or the corpus read back as text. `--out` inside an `--input` folder is fine (`outside`)."""
    for given in inputs:
        if _in(given.split("*")[0].split("?")[0].split("[")[0], out):
            raise ValueError(f"--input {given} lies inside --out {out}, which holds the corpus's own files: move "
                             "the input out of it, or choose another --out")


def outside(files: list[str], out: str) -> list[str]:
    """`files` minus those under `out`: `--out` inside an `--input` directory must not feed a
    previous run's vocab.txt, shards and dead letters back in as text. What is left out is said."""
    kept, left = [], []
    for f in files:
        (left if _in(f, out) else kept).append(f)
    if not kept:
        raise ValueError(f"every input file is inside --out {out}; write the corpus somewhere else")
    if left:
        log.info("not reading %d file(s) inside --out %s (the corpus's own): %s", len(left), out,
                 ", ".join(left[:3]) + (" ..." if len(left) > 3 else ""))
    return kept


class WriteDeadLetters(beam.PTransform):
    """`Skip`s -> `OUT/dead_letter/dead_letter-00000-of-00001.jsonl`, one JSON object per line, sorted.

    The same bytes for the same input on any runner and number of workers: Beam's `WriteToText` split the
    records among files, and ordered them, by its bundles. All of them pass through one worker (a side
    input): a corpus's skipped records are a small share of its input."""

    def __init__(self, out: str) -> None:
        super().__init__()
        self.path = FileSystems.join(out, DEAD_LETTER, "dead_letter-00000-of-00001.jsonl")

    def expand(self, skips):
        lines = skips | "Json" >> beam.Map(lambda s: json.dumps(dataclasses.asdict(s), ensure_ascii=False))
        return (skips.pipeline | "Once" >> beam.Create([None])
                | "Write" >> beam.Map(_write_sorted_lines, self.path, beam.pvalue.AsList(lines)))


def _write_sorted_lines(_, path: str, lines: list[str]) -> str:
    with naming(path), FileSystems.create(path) as f:
        for line in sorted(lines):
            f.write(line.encode("utf-8") + b"\n")
    return path
