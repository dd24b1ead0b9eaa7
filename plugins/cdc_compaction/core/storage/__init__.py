"""Lake storage behind one small interface, and the factory that picks the back end.

* :mod:`~cdc_compaction.core.storage.base`: the :class:`Storage` protocol, :class:`FileInfo`
  and helpers written against the protocol (``is_data_file``, ``read_parquet``);
* :mod:`~cdc_compaction.core.storage.local`: :class:`LocalStorage`, local and mounted paths;
* :mod:`~cdc_compaction.core.storage.s3`: ``S3Storage``, imported only for ``s3://`` and
  ``s3a://`` roots (it loads boto3 and the Amazon provider).

:func:`storage_for` chooses by the storage root's URL scheme.
"""

from __future__ import annotations

from cdc_compaction.core.exceptions import StorageError
from cdc_compaction.core.storage.base import S3_SCHEMES, FileInfo, Storage, is_data_file, read_parquet
from cdc_compaction.core.storage.local import LocalStorage

__all__ = [
    "S3_SCHEMES",
    "FileInfo",
    "LocalStorage",
    "Storage",
    "is_data_file",
    "read_parquet",
    "storage_for",
]


def storage_for(root: str, aws_conn_id: str = "aws_default") -> Storage:
    """The storage implementation for a resolved storage root (S3 through Airflow connection ``aws_conn_id``)."""
    if root.startswith(S3_SCHEMES):
        from cdc_compaction.core.storage.s3 import S3Storage  # lazy: only S3 lakes load boto3 and the provider

        return S3Storage(aws_conn_id)
    if "://" in root and not root.startswith("file://"):
        raise StorageError(f"no storage implementation for {root!r} in this version")
    return LocalStorage()
