"""``job/files.py``'s client-side file operations (Spark Connect): local paths and S3 through pyarrow.fs.

The session is only asked for its conf (the ``fs.s3a`` endpoint): a plain object with a
``conf.get`` stands for it.  S3 is moto's server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdc_compaction.job.files import ArrowFiles, for_session, is_connect


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


class _Session:
    def __init__(self, values: dict[str, str] | None = None) -> None:
        self.conf = _Conf(values or {})


def _exercise(files: ArrowFiles, root: str) -> None:
    """What the job does: write and read its stats, then list its output and drop everything but data."""
    files.write_text(f"{root}/out/_cdc_stats.json", '{"rows": 3}')
    assert files.read_text(f"{root}/out/_cdc_stats.json") == '{"rows": 3}'
    assert files.read_text(f"{root}/out/missing.json") is None
    for name, body in [
        ("data/part-0.parquet", "abc"),
        ("data/.part-0.parquet.crc", "x"),
        ("data/_SUCCESS", ""),
        ("data/_cdc_partition=a%3Ab/part-1.parquet", "abcd"),
        ("data/_cdc_partition=a%3Ab/_SUCCESS", ""),
        ("data/cdc_partition=c/part-2.parquet", "ab"),  # the name since issue 37 (no leading _)
    ]:
        files.write_text(f"{root}/out/{name}", body)
    got = files.data_files(f"{root}/out/data", "data")
    assert got == [
        {"name": "data/_cdc_partition=a%3Ab/part-1.parquet", "size": 4},
        {"name": "data/cdc_partition=c/part-2.parquet", "size": 2},
        {"name": "data/part-0.parquet", "size": 3},
    ]
    # What is not data was removed: a second listing finds the same, and nothing else is left.
    assert files.data_files(f"{root}/out/data", "data") == got
    assert files.data_files(f"{root}/out/nothing", "data") == []


@pytest.mark.parametrize("scheme", ["", "file:", "file://"])
def test_local_paths_in_every_spelling_spark_uses(tmp_path: Path, scheme: str) -> None:
    _exercise(ArrowFiles(_Session()), f"{scheme}{tmp_path}")
    left = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert left == [
        "_cdc_stats.json",
        "data/_cdc_partition=a%3Ab/part-1.parquet",
        "data/cdc_partition=c/part-2.parquet",
        "data/part-0.parquet",
    ]


@pytest.mark.s3
def test_s3a_paths_reach_the_store_the_session_names(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="lake-files")
    session = _Session(
        {
            "spark.hadoop.fs.s3a.endpoint": moto_endpoint,
            "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
            "spark.hadoop.fs.s3a.path.style.access": "true",
        }
    )
    _exercise(ArrowFiles(session), "s3a://lake-files/t")
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="lake-files")["Contents"])
    # pyarrow keeps a deleted file's "directory" alive with an empty marker key (<dir>/): a known
    # limit on S3 (Spark's S3A writes no .crc, and _SUCCESS is turned off, so nothing is deleted there).
    assert [k for k in keys if not k.endswith("/")] == [
        "t/out/_cdc_stats.json",
        "t/out/data/_cdc_partition=a%3Ab/part-1.parquet",
        "t/out/data/cdc_partition=c/part-2.parquet",
        "t/out/data/part-0.parquet",
    ]


def test_a_classic_session_keeps_hadoops_file_system() -> None:
    assert not is_connect(_Session())
    assert type(for_session(_Session())).__name__ == "HadoopFiles"
