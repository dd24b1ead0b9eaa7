"""S3Storage against a local moto S3 server, through S3Hook and an Airflow connection.

The connection ``aws_default`` comes from ``AIRFLOW_CONN_AWS_DEFAULT`` (JSON, dummy keys,
the moto endpoint in its extras), exactly as a deployment provides it to the DAG.  The
conditional-write races, pagination past 1000 keys, batched deletes, copy verification
and an archive crash between copy and delete are checked on the real HTTP API.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import race

from cdc_compaction.core.exceptions import PreconditionFailedError, StorageError
from cdc_compaction.core.storage import FileInfo, storage_for
from cdc_compaction.core.storage.s3 import RETRY_CONFIG, S3Storage

pytestmark = pytest.mark.s3


@pytest.fixture
def s3(aws_default: str) -> S3Storage:
    """An S3Storage on ``aws_default`` (moto), defined only through the environment, as in a deployment."""
    return S3Storage()


@pytest.fixture
def root(s3: S3Storage) -> str:
    """A fresh bucket per test, and a lake root inside it."""
    bucket = f"lake-{uuid.uuid4().hex[:16]}"
    s3.client.create_bucket(Bucket=bucket)
    return f"s3://{bucket}/lake"


def put(s3: S3Storage, path: str, data: bytes) -> str:
    """Write raw bytes (test set-up), bypassing the code under test; returns the ETag."""
    bucket, key = S3Storage._split(path)
    return str(s3.client.put_object(Bucket=bucket, Key=key, Body=data)["ETag"])


def get(s3: S3Storage, path: str) -> bytes:
    bucket, key = S3Storage._split(path)
    return bytes(s3.client.get_object(Bucket=bucket, Key=key)["Body"].read())


def keys_under(s3: S3Storage, path: str) -> list[str]:
    bucket, prefix = s3._prefix(path)
    return sorted(o["Key"][len(prefix) :] for o in s3._iter_objects(bucket, prefix))


def count_calls(s3: S3Storage, operation: str) -> list[dict[str, Any]]:
    """Record the parameters of every ``operation`` request the storage's client sends."""
    seen: list[dict[str, Any]] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        seen.append(params)

    s3.client.meta.events.register(f"provide-client-params.s3.{operation}", record)
    return seen


# ------------------------------------------------------------------------ client / wiring
def test_client_is_built_by_s3hook_from_the_airflow_connection(s3: S3Storage, moto_endpoint: str) -> None:
    client = s3.client
    assert client.meta.endpoint_url == moto_endpoint
    assert client.meta.region_name == "us-east-1"
    assert client.meta.config.retries["mode"] == RETRY_CONFIG["mode"]
    assert client.meta.config.retries["total_max_attempts"] == RETRY_CONFIG["total_max_attempts"]
    assert s3.client is client  # created once


def test_storage_for_an_s3_root_is_s3_storage() -> None:
    st = storage_for("s3://bucket/lake/t")
    assert isinstance(st, S3Storage)
    assert st.aws_conn_id == "aws_default"


def test_join_and_makedirs(s3: S3Storage, root: str) -> None:
    d = s3.join(root, "a", "b")
    assert d == f"{root}/a/b"
    s3.makedirs(d)  # a no-op: prefixes exist through their keys
    assert s3.exists(d) is False
    assert keys_under(s3, root) == []


@pytest.mark.parametrize("path", ["gs://bucket/x", "/local/path", "s3:///no-bucket"])
def test_non_s3_paths_are_refused_with_the_path_in_the_message(s3: S3Storage, path: str) -> None:
    with pytest.raises(StorageError, match="s3://bucket"):
        s3.read_text(path)


# ----------------------------------------------------------------- read / write / size
def test_write_text_read_text_size_and_exists(s3: S3Storage, root: str) -> None:
    path = s3.join(root, "state", "pointer.json")
    s3.write_text(path, '{"seq": 1}')
    assert s3.read_text(path) == '{"seq": 1}'
    big = "x" * 300_000 + "é-end"
    s3.write_text(path, big)  # replaces
    assert s3.read_text(path) == big
    assert s3.size(path) == len(big.encode("utf-8"))
    assert s3.exists(path) is True
    assert s3.exists(s3.join(root, "state")) is True  # a prefix with keys under it is a directory
    assert s3.exists(s3.join(root, "state") + "/") is True
    assert s3.exists(s3.join(root, "stat")) is False  # a key prefix, not a path component


def test_upload_streams_a_local_file_into_one_object(s3: S3Storage, root: str, tmp_path: Path) -> None:
    """Past boto3's multipart threshold (8 MB) too: one object, whole, with the local file's bytes."""
    data = os.urandom(9 * 2**20) + b"end"
    local = tmp_path / "index.parquet"
    local.write_bytes(data)
    path = s3.join(root, "v1", "index-ab12", "part-00000.parquet")
    s3.upload(str(local), path)
    with s3.open_read(path) as fh:
        assert fh.read() == data
    assert [e.name for e in s3.list_dir(s3.join(root, "v1", "index-ab12"))] == ["part-00000.parquet"]
    with pytest.raises(StorageError, match=r"cannot write s3://no-such-bucket-here/x"):
        s3.upload(str(local), "s3://no-such-bucket-here/x")


def test_other_services_and_pyiceberg_get_the_connections_settings(s3: S3Storage, moto_endpoint: str) -> None:
    """The Iceberg catalog on Glue and its FileIO take what the connection says: endpoint, region, credentials."""
    glue = s3.aws_client("glue")
    glue.create_database(DatabaseInput={"Name": "from_the_connection"})
    assert glue.meta.endpoint_url == moto_endpoint and glue.meta.region_name == "us-east-1"
    assert s3.pyiceberg_properties() == {
        "s3.access-key-id": "testing-access-key",
        "s3.secret-access-key": "testing-secret-key",
        "s3.region": "us-east-1",
        "s3.endpoint": moto_endpoint,
    }


def test_missing_objects_raise_storage_error_naming_the_path(s3: S3Storage, root: str) -> None:
    missing = s3.join(root, "missing.json")
    with pytest.raises(StorageError, match=r"cannot read .*missing\.json.*check that the object exists"):
        s3.read_text(missing)
    with pytest.raises(StorageError, match=r"cannot stat .*missing\.json"):
        s3.size(missing)
    assert s3.exists(missing) is False


def test_a_missing_bucket_says_to_create_it(s3: S3Storage) -> None:
    with pytest.raises(StorageError, match=r"s3://no-such-bucket-here/x\.json.*create the bucket"):
        s3.write_text("s3://no-such-bucket-here/x.json", "{}")


# ------------------------------------------------------------------------ create_exclusive
def test_create_exclusive_creates_once_then_refuses(s3: S3Storage, root: str) -> None:
    path = s3.join(root, "commits", "00000001.json")
    s3.create_exclusive(path, "first")
    with pytest.raises(PreconditionFailedError, match=r"00000001\.json exists already"):
        s3.create_exclusive(path, "second")
    assert s3.read_text(path) == "first"
    assert keys_under(s3, root) == ["commits/00000001.json"]


def test_concurrent_create_exclusive_has_exactly_one_winner(s3: S3Storage, root: str) -> None:
    path = s3.join(root, "commits", "00000002.json")
    n = 8
    won, lost, other = race(n, lambda i: s3.create_exclusive(path, f"writer-{i}-" + "z" * 50_000))
    assert other == []
    assert len(won) == 1
    assert sorted(won + lost) == list(range(n))
    assert s3.read_text(path) == f"writer-{won[0]}-" + "z" * 50_000
    assert keys_under(s3, root) == ["commits/00000002.json"]


def force_one_retry_after_success(
    s3: S3Storage, operation: str, meanwhile: Callable[[], None] | None = None
) -> list[int]:
    """Make botocore retry the first successful ``operation``, as if its response had been lost.

    ``meanwhile`` runs between the landed first attempt and the retry (a competitor).
    """
    forced: list[int] = []

    def needs_retry(response: Any, attempts: int, **_: Any) -> int | None:
        if not forced and response is not None and response[0].status_code == 200:
            forced.append(attempts)
            if meanwhile is not None:
                meanwhile()
            return 0  # retry at once
        return None

    s3.client.meta.events.register(f"needs-retry.s3.{operation}", needs_retry)
    return forced


def test_create_exclusive_whose_first_attempt_landed_before_a_retry_is_a_success(s3: S3Storage, root: str) -> None:
    path = s3.join(root, "commits", "00000003.json")
    forced = force_one_retry_after_success(s3, "PutObject")
    s3.create_exclusive(path, "mine")  # the retry meets our own object: not a lost race
    assert forced == [1]
    assert s3.read_text(path) == "mine"


def test_a_retried_write_that_meets_a_competitors_object_still_loses(s3: S3Storage, root: str) -> None:
    path = s3.join(root, "_pointer.json")
    s3.write_text(path, "v1")
    _, token = s3.read_versioned(path)
    forced = force_one_retry_after_success(s3, "PutObject", meanwhile=lambda: put(s3, path, b"theirs"))
    with pytest.raises(PreconditionFailedError, match="changed since it was read"):
        s3.write_if_match(path, "mine", token)
    assert forced == [1]
    assert get(s3, path) == b"theirs"


# --------------------------------------------------------------- read_versioned / CAS
def test_read_versioned_and_write_if_match(s3: S3Storage, root: str) -> None:
    path = s3.join(root, "_pointer.json")
    assert s3.read_versioned(path) == (None, None)
    s3.write_if_match(path, "v1", None)  # None: create only if absent
    with pytest.raises(PreconditionFailedError, match="changed since it was read"):
        s3.write_if_match(path, "other", None)

    text, token = s3.read_versioned(path)
    assert text == "v1"
    assert token is not None and token.startswith('"')
    s3.write_if_match(path, "v2", token)
    assert s3.read_text(path) == "v2"
    with pytest.raises(PreconditionFailedError, match=r"_pointer\.json changed since it was read"):
        s3.write_if_match(path, "v3", token)  # stale token
    assert s3.read_text(path) == "v2"
    _, token2 = s3.read_versioned(path)
    assert token2 != token


def test_write_if_match_on_an_object_deleted_since_it_was_read_loses(s3: S3Storage, root: str) -> None:
    path = s3.join(root, "_pointer.json")
    s3.write_text(path, "v1")
    _, token = s3.read_versioned(path)
    s3.delete(path)
    with pytest.raises(PreconditionFailedError):
        s3.write_if_match(path, "v2", token)
    assert s3.exists(path) is False


def test_concurrent_write_if_match_has_exactly_one_winner_per_round(s3: S3Storage, root: str) -> None:
    path = s3.join(root, "_pointer.json")
    s3.write_text(path, json.dumps({"seq": 0}))
    for round_no in range(1, 6):
        text, token = s3.read_versioned(path)  # both writers read the same ETag
        assert json.loads(text or "")["seq"] == round_no - 1
        won, lost, other = race(
            2, lambda i, token=token, r=round_no: s3.write_if_match(path, json.dumps({"seq": r, "by": i}), token)
        )
        assert other == []
        assert len(won) == 1 and len(lost) == 1
        assert json.loads(s3.read_text(path)) == {"seq": round_no, "by": won[0]}


# ---------------------------------------------------------------------------- list_dir
def test_list_dir_returns_immediate_children_sorted(s3: S3Storage, root: str) -> None:
    d = s3.join(root, "incremental", "increment_2026112200")
    put(s3, f"{d}/part-00001.parquet", b"12345")
    put(s3, f"{d}/part-00000.parquet", b"123")
    put(s3, f"{d}/_SUCCESS", b"")
    put(s3, f"{d}/sub/inner.bin", b"not listed: one level only")
    put(s3, f"{d}/sub/deeper/x.bin", b"nor this")
    put(s3, f"{d}x/sibling.bin", b"a sibling prefix, not a child")

    listing = s3.list_dir(d)
    assert listing == s3.list_dir(d + "/")
    assert [f.name for f in listing] == ["_SUCCESS", "part-00000.parquet", "part-00001.parquet", "sub"]
    assert all(isinstance(f, FileInfo) for f in listing)
    by_name = {f.name: f for f in listing}
    assert by_name["part-00000.parquet"].size == 3
    assert by_name["part-00001.parquet"].size == 5
    assert by_name["part-00001.parquet"].path == f"{d}/part-00001.parquet"
    assert by_name["part-00001.parquet"].is_dir is False
    assert by_name["part-00001.parquet"].mtime > 1_600_000_000
    assert by_name["sub"].is_dir is True
    assert by_name["sub"].size == 0
    assert by_name["sub"].path == f"{d}/sub"
    assert s3.list_dir(s3.join(root, "never-created")) == []


def test_list_dir_and_delete_tree_beyond_1000_keys(s3: S3Storage, root: str) -> None:
    d = s3.join(root, "v00000001")
    n = 1005
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda i: put(s3, f"{d}/part-{i:05d}.parquet", b"x" * (i % 7)), range(n)))
    put(s3, f"{d}/nested/a.bin", b"a")
    put(s3, s3.join(root, "v000000010", "keep.bin"), b"a sibling whose name starts the same")

    lists = count_calls(s3, "ListObjectsV2")
    listing = s3.list_dir(d)
    assert len(lists) >= 2  # more than one page: pagination is exercised
    assert len(listing) == n + 1
    assert [f.name for f in listing if f.is_dir] == ["nested"]
    assert {f.size for f in listing if f.name == "part-01004.parquet"} == {1004 % 7}

    deletes = count_calls(s3, "DeleteObjects")
    s3.delete_tree(d)
    assert [len(p["Delete"]["Objects"]) for p in deletes] == [1000, 6]
    assert s3.list_dir(d) == []
    assert s3.exists(d) is False
    assert keys_under(s3, root) == ["v000000010/keep.bin"]


# ------------------------------------------------------------------------------ deletes
def test_delete_is_idempotent(s3: S3Storage, root: str) -> None:
    path = s3.join(root, "plan.json")
    s3.write_text(path, "{}")
    s3.delete(path)
    assert s3.exists(path) is False
    s3.delete(path)  # nothing to do, no error
    s3.delete(s3.join(root, "never", "existed.json"))


def test_delete_tree_ignores_missing_and_refuses_a_whole_bucket(s3: S3Storage, root: str) -> None:
    s3.delete_tree(s3.join(root, "nothing-here"))
    bucket_root = root.rsplit("/", 1)[0]
    with pytest.raises(StorageError, match="refusing to delete the whole bucket"):
        s3.delete_tree(bucket_root)


def test_delete_tree_reports_the_keys_s3_could_not_delete(s3: S3Storage, root: str) -> None:
    d = s3.join(root, "v00000002")
    for i in range(3):
        put(s3, f"{d}/part-{i}.parquet", b"x")
    _, prefix = s3._prefix(d)

    def refuse_one(parsed: dict[str, Any], **_: Any) -> None:
        parsed["Errors"] = [{"Key": f"{prefix}part-1.parquet", "Code": "AccessDenied", "Message": "denied"}]

    s3.client.meta.events.register("after-call.s3.DeleteObjects", refuse_one)
    with pytest.raises(StorageError, match=r"cannot delete 1 of 3 objects under .*part-1\.parquet \(AccessDenied\)"):
        s3.delete_tree(d)


def test_remove_dir_if_empty(s3: S3Storage, root: str) -> None:
    full = s3.join(root, "increment_2026112200")
    put(s3, f"{full}/part-00000.parquet", b"keep me")
    assert s3.remove_dir_if_empty(full) is False
    assert get(s3, f"{full}/part-00000.parquet") == b"keep me"

    s3.delete(f"{full}/part-00000.parquet")
    assert s3.remove_dir_if_empty(full) is True

    marked = s3.join(root, "increment_2026112201")
    put(s3, marked + "/", b"")  # a console-made "folder" marker only
    assert s3.remove_dir_if_empty(marked) is True
    assert keys_under(s3, root) == []


# -------------------------------------------------------------------------------- copy
def test_copy_is_server_side_identical_and_verified(s3: S3Storage, root: str) -> None:
    data = bytes(range(256)) * 6000
    src = s3.join(root, "incremental", "increment_2026112200", "part-00000.parquet")
    dst = s3.join(root, "archive", "c00000001", "increment_2026112200", "part-00000.parquet")
    etag = put(s3, src, data)
    copies = count_calls(s3, "CopyObject")

    s3.copy(src, dst)

    assert len(copies) == 1
    assert get(s3, dst) == data
    assert get(s3, src) == data
    assert s3.size(dst) == len(data)
    bucket, key = S3Storage._split(dst)
    assert s3.client.head_object(Bucket=bucket, Key=key)["ETag"] == etag  # single-part: the content's MD5


def test_copy_of_a_missing_source_raises_and_leaves_nothing(s3: S3Storage, root: str) -> None:
    dst = s3.join(root, "archive", "dst.bin")
    with pytest.raises(StorageError, match=r"cannot copy .*nope\.bin.*the source does not exist"):
        s3.copy(s3.join(root, "nope.bin"), dst)
    assert keys_under(s3, root) == []


@pytest.mark.parametrize(("tampered", "problem"), [(b"DIFFERENT-CONTENT", "ETag"), (b"shorter", "bytes, the source")])
def test_copy_verification_catches_a_mismatch_and_removes_the_bad_copy(
    s3: S3Storage, root: str, tampered: bytes, problem: str
) -> None:
    src = s3.join(root, "incremental", "part-00000.parquet")
    dst = s3.join(root, "archive", "part-00000.parquet")
    put(s3, src, b"original-content!")  # same length as the first tampered payload

    def overwrite_copy(**_: Any) -> None:
        put(s3, dst, tampered)  # another writer (or a broken store) changed the copy

    s3.client.meta.events.register("after-call.s3.CopyObject", overwrite_copy)
    with pytest.raises(StorageError, match=rf"failed verification: .*{problem}.*source kept"):
        s3.copy(src, dst)
    assert s3.exists(dst) is False  # a re-run cannot mistake it for a finished copy
    assert get(s3, src) == b"original-content!"


def test_copy_of_a_multipart_source_compares_size_only(s3: S3Storage, root: str) -> None:
    src = s3.join(root, "big.parquet")
    dst = s3.join(root, "archive", "big.parquet")
    bucket, key = S3Storage._split(src)
    c = s3.client
    upload = c.create_multipart_upload(Bucket=bucket, Key=key)
    parts = []
    for number, body in enumerate([b"a" * 5 * 1024 * 1024, b"tail"], 1):
        r = c.upload_part(Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=number, Body=body)
        parts.append({"ETag": r["ETag"], "PartNumber": number})
    c.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload["UploadId"], MultipartUpload={"Parts": parts})

    s3.copy(src, dst)

    assert s3.size(dst) == 5 * 1024 * 1024 + 4
    assert s3.read_versioned(src)[1] != s3.read_versioned(dst)[1]  # "...-2" vs a plain MD5: not comparable


# ------------------------------------------------------------- archive crash recovery
class InjectedCrashError(Exception):
    pass


def archive_files(s3: S3Storage, files: list[tuple[str, str, int]], crash_after_copy: bool = False) -> int:
    """pipeline.archive.archive_commit's per-file steps: copy unless already archived, verify the size, delete."""
    moved = 0
    for src, dst, size in files:
        if s3.exists(src):
            if not (s3.exists(dst) and s3.size(dst) == size):
                s3.copy(src, dst)
                if crash_after_copy:
                    raise InjectedCrashError(src)
            assert s3.size(dst) == size
            s3.delete(src)
            moved += 1
        else:
            assert s3.exists(dst) and s3.size(dst) == size
    return moved


def test_archive_crash_between_copy_and_delete_converges_on_rerun(s3: S3Storage, root: str) -> None:
    files = []
    for i in range(3):
        src = s3.join(root, "incremental", "increment_2026112200", f"part-{i:05d}.parquet")
        dst = s3.join(root, "archive", "c00000001", "increment_2026112200", f"part-{i:05d}.parquet")
        data = f"rows of file {i}".encode() * (i + 1)
        put(s3, src, data)
        files.append((src, dst, len(data)))

    with pytest.raises(InjectedCrashError):
        archive_files(s3, files, crash_after_copy=True)
    # The first file is copied but its source not deleted: in both places.
    assert s3.exists(files[0][0]) and s3.exists(files[0][1])

    copies = count_calls(s3, "CopyObject")
    assert archive_files(s3, files) == 3
    assert len(copies) == 2  # the finished copy is recognised, not redone
    assert archive_files(s3, files) == 0  # a third run has nothing left to do

    assert keys_under(s3, s3.join(root, "incremental")) == []
    archived = keys_under(s3, s3.join(root, "archive"))
    assert archived == [f"c00000001/increment_2026112200/part-{i:05d}.parquet" for i in range(3)]
    for i, (_, dst, _) in enumerate(files):
        assert get(s3, dst) == f"rows of file {i}".encode() * (i + 1)
