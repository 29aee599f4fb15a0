"""A Beam file system with an object store's semantics over a local folder, for tests of remote
`--input` / `--out` paths (gs://, s3:// cannot be reached from CI).

What makes an object store differ from a disk, kept here as GCS and S3 behave in Beam 2.77: there are
no directories (mkdirs does nothing, `exists` is true only for an object), listing is by key prefix,
and `delete` of a prefix removes nothing unless it ends in `/` (gcsfilesystem.py's delete). Registered
with Beam by subclassing `FileSystem` (Beam finds file systems among its subclasses, by scheme):
`objstore://KEY` is the file `ROOT/KEY`; `optstore://` also refuses to start without pipeline options,
as Beam's HDFS and S3 file systems do.
"""

from __future__ import annotations

import os

from apache_beam.io.filesystem import FileMetadata, FileSystem

ROOT = {"path": ""}  # set by the test (a tmp folder) before use


class ObjectStore(FileSystem):
    PREFIX = "objstore://"

    @classmethod
    def scheme(cls):
        return cls.PREFIX[:-3]

    def _local(self, path: str) -> str:
        return os.path.join(ROOT["path"], path[len(self.PREFIX):])

    def join(self, base, *parts):
        return "/".join([base.rstrip("/")] + [p.strip("/") for p in parts])

    def split(self, path):
        head, _, tail = path.rpartition("/")
        return head, tail

    def has_dirs(self):
        return False

    def mkdirs(self, path):
        pass

    def _list(self, prefix):
        for root, _, names in os.walk(ROOT["path"]):
            for name in names:
                key = os.path.relpath(os.path.join(root, name), ROOT["path"]).replace(os.sep, "/")
                if (self.PREFIX + key).startswith(prefix):
                    yield FileMetadata(self.PREFIX + key, os.path.getsize(os.path.join(root, name)))

    def exists(self, path):
        return os.path.isfile(self._local(path))

    def metadata(self, path):
        return FileMetadata(path, os.path.getsize(self._local(path)))

    def size(self, path):
        return os.path.getsize(self._local(path))

    def create(self, path, mime_type=None, compression_type=None):
        os.makedirs(os.path.dirname(self._local(path)), exist_ok=True)
        return open(self._local(path), "wb")

    def open(self, path, mime_type=None, compression_type=None):
        return open(self._local(path), "rb")

    def delete(self, paths):
        for path in paths:
            targets = list(self._list(path)) if path.endswith("/") else self.match([path])[0].metadata_list
            for meta in targets:
                os.remove(self._local(meta.path))

    def copy(self, source_file_names, destination_file_names):
        for src, dst in zip(source_file_names, destination_file_names):
            with self.open(src) as a, self.create(dst) as b:
                b.write(a.read())

    def rename(self, source_file_names, destination_file_names):
        for src, dst in zip(source_file_names, destination_file_names):
            os.makedirs(os.path.dirname(self._local(dst)), exist_ok=True)
            os.replace(self._local(src), self._local(dst))

    def last_updated(self, path):
        return os.path.getmtime(self._local(path))

    def checksum(self, path):
        return str(self.size(path))

    def report_lineage(self, *args, **kwargs):
        pass


class OptionsStore(ObjectStore):
    PREFIX = "optstore://"

    def __init__(self, pipeline_options):
        super().__init__(pipeline_options)
        if pipeline_options is None:
            raise ValueError("pipeline_options is not set")
