"""Small JSON-lines records that Beam workers write (the shards' infos, word counts), under exact names.

Beam's `WriteToText` finds its own files again by glob: a `[`, `*` or `?` in --out broke it, and a glob over
--out could take in another folder's files. `WriteRecordFiles` never matches a path as a pattern.
"""

from __future__ import annotations

import json
import uuid

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindows

from pipeline.named_writes import naming, write_file


class WriteRecordFiles(beam.PTransform):
    """Lines -> files of exact names in `folder`, each bundle's in a file of its own, and `NAME.files.json`
    listing the files of the bundles that succeeded (a retried bundle's first file is in no list). Read back
    with `read_record_files`."""

    def __init__(self, folder: str, name: str) -> None:
        super().__init__()
        self.folder, self.name = folder, name

    def expand(self, lines):
        files = lines | "Files" >> beam.ParDo(_LinesToFile(self.folder, self.name))
        return (lines.pipeline | "Once" >> beam.Create([None])
                | "List" >> beam.Map(_write_file_list, _file_list(self.folder, self.name), beam.pvalue.AsList(files)))


class _LinesToFile(beam.DoFn):
    def __init__(self, folder: str, name: str) -> None:
        self.folder, self.name = folder, name

    def start_bundle(self) -> None:
        self.path, self.file = None, None

    def process(self, line: str):
        if self.file is None:
            self.path = FileSystems.join(self.folder, f"{self.name}-{uuid.uuid4().hex}.jsonl")
            self.file = FileSystems.create(self.path)
        with naming(self.path):
            self.file.write(line.encode("utf-8") + b"\n")
        return ()

    def finish_bundle(self):
        if self.file is not None:
            with naming(self.path):  # a buffered write's error may come only here
                self.file.close()
            yield GlobalWindows.windowed_value(self.path)


def _file_list(folder: str, name: str) -> str:
    return FileSystems.join(folder, f"{name}.files.json")


def _write_file_list(_, path: str, files: list[str]) -> None:
    write_file(path, json.dumps(sorted(files)).encode("utf-8"))


def read_record_files(folder: str, name: str) -> list[str]:
    """The files `WriteRecordFiles(folder, name)` wrote, by their exact names."""
    with FileSystems.open(_file_list(folder, name)) as f:
        return json.loads(f.read())


def read_jsonl_records(paths: list[str]) -> list:
    """The JSON records, one a line, of `paths` in order."""
    records = []
    for path in paths:
        with FileSystems.open(path) as f:
            records += [json.loads(line) for line in f if line.strip()]
    return records
