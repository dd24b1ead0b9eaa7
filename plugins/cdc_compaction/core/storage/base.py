"""The storage interface every back end implements, and helpers written against it.

The transactional protocol (plans, commit records, the pointer, archiving) is
written against :class:`Storage`, so that back ends slot in without touching it:
:mod:`cdc_compaction.core.storage.local` (local and HDFS-style mounted paths) and
:mod:`cdc_compaction.core.storage.s3` (Amazon S3).  Nothing here imports a back end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol

from cdc_compaction.core.exceptions import StorageError

#: URI schemes served by S3Storage: ``s3://`` (EMR's EMRFS) and ``s3a://`` (Hadoop's S3A).
S3_SCHEMES = ("s3://", "s3a://")


def is_data_file(name: str) -> bool:
    """Spark's and Hive's rule: names starting with '_' or '.' are not data; nor are checksums."""
    return not name.startswith(("_", ".")) and not name.endswith(".crc")


def read_parquet(storage: Storage, path: str) -> Any:
    """One Parquet file, or every data file of a directory, as one Arrow table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        entries = storage.list_dir(path)
    except StorageError:
        entries = []  # a plain local file; if it is something worse, open_read below says so
    files = [e.path for e in entries if not e.is_dir and is_data_file(e.name)] if entries else [path]
    tables = []
    for f in files:
        with storage.open_read(f) as fh:
            tables.append(pq.read_table(fh))
    if not tables:
        raise StorageError(f"{path} holds no Parquet data files")
    return pa.concat_tables(tables, promote_options="default")


@dataclass(frozen=True)
class FileInfo:
    """One entry of a directory listing."""

    path: str
    name: str
    is_dir: bool
    size: int
    mtime: float
    #: What the storage says cheaply about this landing of the file besides its name and size: a token
    #: that changes whenever the file is written, copied or moved there again, even with the same bytes
    #: and mtime (local: inode, ctime and mtime; S3: ETag and LastModified).  "" where none is known.
    token: str = ""


class Storage(Protocol):
    """What the compaction protocol needs from a file system."""

    def exists(self, path: str) -> bool: ...
    def list_dir(self, path: str) -> list[FileInfo]: ...
    def read_text(self, path: str) -> str: ...
    def open_read(self, path: str) -> BinaryIO: ...
    def write_text(self, path: str, text: str) -> None: ...
    def write_bytes(self, path: str, data: bytes) -> None: ...
    def upload(self, local_path: str, path: str) -> None: ...
    def create_exclusive(self, path: str, text: str) -> None: ...
    def read_versioned(self, path: str) -> tuple[str | None, str | None]: ...
    def write_if_match(self, path: str, text: str, token: str | None) -> None: ...
    def copy(self, src: str, dst: str) -> None: ...
    def size(self, path: str) -> int: ...
    def delete(self, path: str) -> None: ...
    def delete_tree(self, path: str) -> None: ...
    def remove_dir_if_empty(self, path: str) -> bool: ...
    def join(self, *parts: str) -> str: ...
    def makedirs(self, path: str) -> None: ...
    def set_mtime(self, path: str, epoch_s: float) -> bool: ...
