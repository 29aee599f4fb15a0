"""CoNLL-2003 English NER: `word POS chunk NER` per line, blank line between sentences, `-DOCSTART-`
lines between documents (files `train.txt`, `dev.txt`/`valid.txt`/`eng.testa`, `test.txt`/`eng.testb`: one of
each, all in one folder).
"""

from __future__ import annotations

import logging
from pathlib import Path

from launch.finetune.examples import DataError, SkipCounter, SplitFiles, TaggedExample, in_documents, text_lines

logger = logging.getLogger(__name__)

LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
FILES = {
    "train": ("train.txt", "eng.train"),
    "dev": ("dev.txt", "valid.txt", "eng.testa"),
    "test": ("test.txt", "eng.testb"),
}
FOLDER = SplitFiles("CoNLL-2003", ("conll2003", "CoNLL-2003"), FILES)


def find_file(data_dir: Path, split: str, *, required: bool) -> Path | None:
    """`split`'s file in DIR/conll2003/, DIR/CoNLL-2003/ or DIR, whichever holds the task's files (`SplitFiles`)."""
    return FOLDER.find(data_dir, split, required=required)


def read_conll(path: Path, *, skips: SkipCounter | None = None) -> list[TaggedExample]:
    """Sentences in file order; each carries its document id so document context can be rebuilt.

    A malformed line skipped (`skips.allow`) leaves out its whole sentence: without the word the rest
    would be another sentence, labelled as if it were this one."""
    skips = skips or SkipCounter()
    known = set(LABELS)
    examples: list[TaggedExample] = []
    words: list[str] = []
    tags: list[str] = []
    doc = 0
    start_line = 0
    broken = False  # the sentence being read had a malformed line
    left_out = 0

    def flush() -> None:
        nonlocal broken, left_out
        if words and not broken:
            examples.append(TaggedExample(f"{path.stem}-{start_line}", tuple(words), tuple(tags), f"doc{doc}"))
        left_out += broken
        words.clear()
        tags.clear()
        broken = False

    for line_no, line in text_lines(path):
        line = line.rstrip("\n")
        if not line.strip():
            flush()
            continue
        if line.startswith("-DOCSTART-"):
            flush()
            doc += 1
            continue
        fields = line.split()
        if len(fields) != 4:
            skips.malformed(path, line_no, f"expected 4 space-separated fields (word POS chunk NER), got {len(fields)}")
            broken = True
            continue
        if fields[3] not in known:
            raise DataError(f"{path}:{line_no}: unknown NER tag {fields[3]!r}; CoNLL-2003 tags are {list(LABELS)}")
        if not words:
            start_line = line_no
        words.append(fields[0])
        tags.append(fields[3])
    flush()
    skips.log(str(path))
    if left_out:
        logger.warning("%s: left out %d sentence(s) with a malformed line", path, left_out)
    return in_documents(examples)
