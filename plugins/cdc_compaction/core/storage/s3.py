"""The :class:`~cdc_compaction.core.storage.base.Storage` protocol on Amazon S3 (and S3-compatible stores).

Paths are ``s3://bucket/key`` (or ``s3a://bucket/key``: the same object) strings.  S3
has no directories: a "directory" is a key prefix ending in ``/``, it exists while at
least one key lies under it, and creating one is a no-op.  The protocol's atomic primitives map onto S3 as follows:

* ``write_text``: one PutObject, which S3 makes visible atomically (old or new content).
* ``create_exclusive``: PutObject with ``If-None-Match: *`` (S3 conditional writes).
* ``read_versioned`` / ``write_if_match``: GetObject's ETag as the token, PutObject with
  ``If-Match: <etag>`` as the compare-and-swap.
* ``copy``: server-side CopyObject (managed multipart copy above 5 GiB), then the copy
  is checked against the source (size, and ETag where S3 makes it comparable).

Every call goes through the Amazon provider's ``S3Hook``: credentials, region and
endpoint come from the Airflow connection (``aws_default`` unless told otherwise),
never from code.
"""

from __future__ import annotations

import io
import logging
import posixpath
import threading
from collections.abc import Iterator
from typing import Any, BinaryIO

from boto3.exceptions import S3UploadFailedError
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from cdc_compaction.core.exceptions import PreconditionFailedError, StorageError
from cdc_compaction.core.storage.base import S3_SCHEMES, FileInfo

log = logging.getLogger(__name__)

DEFAULT_CONN_ID = "aws_default"

#: DeleteObjects accepts at most this many keys per request.
DELETE_BATCH = 1000
#: The largest object a single CopyObject can copy; larger ones need a multipart copy.
MAX_SINGLE_COPY = 5 * 1024**3

# Throttling (SlowDown, 503), 500/502/504 and connection errors are retried by botocore
# itself, with exponential backoff and jitter: the "standard" retry mode, configured on
# the client, rather than a hand-rolled loop.  A connection's extra
# ``config_kwargs: {"retries": {...}}`` overrides this default.  ``total_max_attempts``
# counts the first request too (botocore's ``max_attempts`` would count retries only).
RETRY_CONFIG: dict[str, Any] = {"mode": "standard", "total_max_attempts": 8}

_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
_CONDITION_LOST = {"PreconditionFailed", "ConditionalRequestConflict"}


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _attempts(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) or 0)


def _is_not_found(exc: ClientError) -> bool:
    return _error_code(exc) in _NOT_FOUND or _status(exc) == 404


def _is_condition_lost(exc: ClientError) -> bool:
    """412 PreconditionFailed, or 409 ConditionalRequestConflict (a concurrent conditional write)."""
    return _error_code(exc) in _CONDITION_LOST or _status(exc) == 412


def _is_multipart_etag(etag: str) -> bool:
    """A multipart upload's ETag is ``"<md5 of the part md5s>-<part count>"``, not the content's MD5."""
    return "-" in etag.strip('"')


class S3Storage:
    """Lake storage on S3 through the Amazon provider's ``S3Hook``."""

    def __init__(self, aws_conn_id: str = DEFAULT_CONN_ID) -> None:
        self.aws_conn_id = aws_conn_id
        self._client_obj: Any = None
        self._client_lock = threading.Lock()

    # ------------------------------------------------------------------------ plumbing
    @property
    def client(self) -> Any:
        """The boto3 S3 client, created once from the Airflow connection (thread-safe to share)."""
        if self._client_obj is None:
            with self._client_lock:
                if self._client_obj is None:
                    self._client_obj = self._make_client()
        return self._client_obj

    def _make_client(self) -> Any:
        # Imported here: importing the provider is slow and only S3 lakes need it.
        from airflow.providers.amazon.aws.hooks.s3 import S3Hook

        hook = S3Hook(aws_conn_id=self.aws_conn_id)
        try:
            # Our retry default first; whatever the connection's config_kwargs set wins over it.
            config = Config(retries=dict(RETRY_CONFIG)).merge(hook.config)
            return hook.get_client_type(config=config)
        except Exception as exc:  # any failure here is a connection set-up problem
            raise StorageError(
                f"cannot create an S3 client from the Airflow connection {self.aws_conn_id!r}: {exc}. "
                "Define the connection (credentials, region_name and, for S3-compatible stores, "
                "endpoint_url in its extras) and re-run"
            ) from exc

    def aws_client(self, service: str) -> Any:
        """A boto3 client of another AWS service (Glue for the Iceberg catalog) from the same Airflow connection:
        its credentials, region and endpoint (an S3-compatible store's ``endpoint_url`` serves the others too)."""
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

        try:
            hook = AwsBaseHook(aws_conn_id=self.aws_conn_id, client_type=service)
            return hook.get_client_type(config=Config(retries=dict(RETRY_CONFIG)).merge(hook.config))
        except Exception as exc:  # any failure here is a connection set-up problem
            raise StorageError(
                f"cannot create a {service} client from the Airflow connection {self.aws_conn_id!r}: {exc}. "
                "Define the connection (credentials, region_name and endpoint_url in its extras) and re-run"
            ) from exc

    def pyiceberg_properties(self) -> dict[str, str]:
        """pyiceberg's S3 FileIO properties for the same connection: credentials, region, endpoint."""
        from airflow.providers.amazon.aws.hooks.s3 import S3Hook

        try:
            hook = S3Hook(aws_conn_id=self.aws_conn_id)
            creds = hook.get_credentials()
            props = {"s3.access-key-id": creds.access_key, "s3.secret-access-key": creds.secret_key}
            if creds.token:
                props["s3.session-token"] = creds.token
            if hook.conn_region_name:
                props["s3.region"] = hook.conn_region_name
            endpoint = hook.conn_config.get_service_endpoint_url(service_name="s3")
        except Exception as exc:  # any failure here is a connection set-up problem
            raise StorageError(
                f"cannot read the credentials of the Airflow connection {self.aws_conn_id!r}: {exc}. "
                "Define the connection (credentials, region_name and endpoint_url in its extras) and re-run"
            ) from exc
        if endpoint:
            props["s3.endpoint"] = endpoint
        return props

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        """``s3://bucket/a/b`` (or ``s3a://``) -> ``("bucket", "a/b")``."""
        if not path.startswith(S3_SCHEMES):
            raise StorageError(f"{path!r} is not an s3://bucket/key path; S3Storage only handles s3:// and s3a://")
        bucket, _, key = path.split("://", 1)[1].partition("/")
        if not bucket:
            raise StorageError(f"{path!r} names no bucket; write it as s3://bucket/key")
        return bucket, key

    def _object(self, path: str) -> tuple[str, str]:
        bucket, key = self._split(path)
        key = key.rstrip("/")
        if not key:
            raise StorageError(f"{path!r} names a bucket, not an object; give the object's full s3://bucket/key")
        return bucket, key

    def _prefix(self, path: str) -> tuple[str, str]:
        """The bucket and the key prefix of everything "inside" ``path`` ("" or ending in "/")."""
        bucket, key = self._split(path)
        key = key.strip("/")
        return bucket, f"{key}/" if key else ""

    def _fail(self, action: str, path: str, exc: Exception) -> StorageError:
        """A StorageError naming the path, the S3 error and what to do about it."""
        if isinstance(exc, ClientError):
            code = _error_code(exc)
            detail = f"{code or _status(exc)}: {exc.response.get('Error', {}).get('Message', exc)}"
            if code in {"AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch"}:
                hint = f"grant the credentials of Airflow connection {self.aws_conn_id!r} access to it"
            elif code == "NoSuchBucket":
                hint = "create the bucket or correct the storage root"
            elif _is_not_found(exc):
                hint = "check that the object exists (an earlier step may not have produced it)"
            else:
                hint = f"check the S3 service and connection {self.aws_conn_id!r}, then re-run"
            if _attempts(exc):
                hint += f" (the request was already retried {_attempts(exc)} times)"
        else:
            detail = str(exc)
            hint = f"check that the endpoint of Airflow connection {self.aws_conn_id!r} is reachable, then re-run"
        return StorageError(f"cannot {action} {path}: {detail}; {hint}")

    def _landed_earlier(self, exc: ClientError, bucket: str, key: str, body: bytes) -> bool:
        """After a retried conditional PutObject lost: did our own first attempt land?

        A first attempt can succeed on the server and still be retried (its response was
        lost, or a 5xx came back after the write).  The retry then fails the precondition
        against our own object.  When the object holds exactly what we wrote, that is our
        write, not a competitor's (content carries run ids, so a stranger's identical bytes
        would also mean the same outcome).
        """
        if not _attempts(exc):
            return False
        try:
            current = self.client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except (ClientError, BotoCoreError):
            return False
        return bool(current == body)

    def _iter_objects(self, bucket: str, prefix: str) -> Iterator[dict[str, Any]]:
        """Every object under ``prefix``, across as many ListObjectsV2 pages as it takes."""
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            yield from page.get("Contents", [])

    def _head(self, path: str) -> dict[str, Any] | None:
        bucket, key = self._object(path)
        try:
            return dict(self.client.head_object(Bucket=bucket, Key=key))
        except ClientError as exc:
            if _is_not_found(exc):
                return None
            raise self._fail("stat", path, exc) from exc
        except BotoCoreError as exc:
            raise self._fail("stat", path, exc) from exc

    # ------------------------------------------------------------------------ the protocol
    def join(self, *parts: str) -> str:
        return posixpath.join(*parts)

    def makedirs(self, path: str) -> None:
        """Nothing to do: S3 "directories" are key prefixes and exist through their keys."""

    def exists(self, path: str) -> bool:
        """True for an object at ``path``, or for a "directory" with at least one key under it."""
        bucket, key = self._split(path)
        if key.strip("/") and not key.endswith("/") and self._head(path) is not None:
            return True
        bucket, prefix = self._prefix(path)
        try:
            resp = self.client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("check for", path, exc) from exc
        return int(resp.get("KeyCount", 0)) > 0

    def list_dir(self, path: str) -> list[FileInfo]:
        """Immediate children of ``path``: objects as files, common prefixes as directories."""
        bucket, prefix = self._prefix(path)
        base = path.rstrip("/")
        out: list[FileInfo] = []
        try:
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
                for obj in page.get("Contents", []):
                    name = obj["Key"][len(prefix) :]
                    if not name:
                        continue  # a zero-byte "directory marker" object named like the prefix itself
                    out.append(
                        FileInfo(
                            f"{base}/{name}",
                            name,
                            False,
                            int(obj["Size"]),
                            obj["LastModified"].timestamp(),
                            # Every PUT or copy sets LastModified anew: a re-landed object gets another token.
                            f"{str(obj.get('ETag', '')).strip(chr(34))}@{obj['LastModified'].isoformat()}",
                        )
                    )
                for cp in page.get("CommonPrefixes", []):
                    name = cp["Prefix"][len(prefix) :].rstrip("/")
                    out.append(FileInfo(f"{base}/{name}", name, True, 0, 0.0))
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("list", path, exc) from exc
        return sorted(out, key=lambda f: f.name)

    def read_text(self, path: str) -> str:
        bucket, key = self._object(path)
        try:
            return str(self.client.get_object(Bucket=bucket, Key=key)["Body"].read().decode("utf-8"))
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("read", path, exc) from exc

    def open_read(self, path: str) -> BinaryIO:
        """A seekable reader doing ranged GETs: a Parquet footer costs two small requests, not the file."""
        head = self._head(path)
        if head is None:
            raise StorageError(f"cannot read {path}: no such object; check that an earlier step produced it")
        bucket, key = self._object(path)
        raw = _RangeReader(self, path, bucket, key, int(head["ContentLength"]), str(head["ETag"]))
        return io.BufferedReader(raw, buffer_size=256 * 1024)  # type: ignore[return-value]

    def write_text(self, path: str, text: str) -> None:
        """Replace ``path``: a single PutObject, which readers see whole or not at all."""
        self.write_bytes(path, text.encode("utf-8"))

    def set_mtime(self, path: str, epoch_s: float) -> bool:
        """False: S3 sets an object's LastModified itself, when it is written (docs/formats.md says what
        that means for a Delta reader's travel by timestamp)."""
        return False

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a whole object (one PutObject: visible whole or not at all)."""
        bucket, key = self._object(path)
        try:
            self.client.put_object(Bucket=bucket, Key=key, Body=data)
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("write", path, exc) from exc

    def upload(self, local_path: str, path: str) -> None:
        """Write the local file ``local_path`` to ``path``, streamed: boto3's managed upload (multipart past its
        threshold, completed as one object: visible whole or not at all)."""
        bucket, key = self._object(path)
        try:
            self.client.upload_file(local_path, bucket, key)
        except (ClientError, BotoCoreError, S3UploadFailedError) as exc:
            raise self._fail("write", path, exc) from exc

    def create_exclusive(self, path: str, text: str) -> None:
        """Create ``path`` only if it does not exist (PutObject with ``If-None-Match: *``)."""
        bucket, key = self._object(path)
        body = text.encode("utf-8")
        try:
            self.client.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
        except ClientError as exc:
            if _is_condition_lost(exc):
                if self._landed_earlier(exc, bucket, key, body):
                    log.warning("%s: a retried create found its own first attempt in place; treated as created", path)
                    return
                raise PreconditionFailedError(
                    f"{path} exists already ({_error_code(exc)}): another writer created it first"
                ) from exc
            raise self._fail("create", path, exc) from exc
        except BotoCoreError as exc:
            raise self._fail("create", path, exc) from exc

    def read_versioned(self, path: str) -> tuple[str | None, str | None]:
        """The content of ``path`` and its ETag, from one GetObject (None, None if absent)."""
        bucket, key = self._object(path)
        try:
            resp = self.client.get_object(Bucket=bucket, Key=key)
            return resp["Body"].read().decode("utf-8"), str(resp["ETag"])
        except ClientError as exc:
            if _is_not_found(exc) and _error_code(exc) != "NoSuchBucket":
                return None, None
            raise self._fail("read", path, exc) from exc
        except BotoCoreError as exc:
            raise self._fail("read", path, exc) from exc

    def write_if_match(self, path: str, text: str, token: str | None) -> None:
        """Compare-and-swap: replace ``path`` only if its ETag is still ``token`` (None: must not exist)."""
        bucket, key = self._object(path)
        body = text.encode("utf-8")
        condition = {"IfNoneMatch": "*"} if token is None else {"IfMatch": token}
        try:
            self.client.put_object(Bucket=bucket, Key=key, Body=body, **condition)
        except ClientError as exc:
            # If-Match on a key deleted since it was read answers 404: that is a lost race too.
            lost = _is_condition_lost(exc) or (
                token is not None and _is_not_found(exc) and _error_code(exc) != "NoSuchBucket"
            )
            if lost:
                if self._landed_earlier(exc, bucket, key, body):
                    log.warning("%s: a retried replace found its own first attempt in place; treated as written", path)
                    return
                raise PreconditionFailedError(
                    f"{path} changed since it was read (expected ETag {token}, {_error_code(exc)}); "
                    "another writer replaced it: read it again and retry"
                ) from exc
            raise self._fail("write", path, exc) from exc
        except BotoCoreError as exc:
            raise self._fail("write", path, exc) from exc

    def copy(self, src: str, dst: str) -> None:
        """Server-side copy, then check the copy against the source.

        Up to 5 GiB a single CopyObject (conditional on the source's ETag), above that the
        managed multipart copy.  ``dst`` appears whole or not at all.  The check compares:

        * the size, always;
        * the ETag, when the source's is a single-part, unencrypted/SSE-S3 ETag: then it
          is the content's MD5 and CopyObject keeps it.  For a multipart source the ETag
          is a digest of its part digests ("...-N") and depends on the part layout, so a
          copy has another ETag even with identical bytes; with SSE-KMS or SSE-C, ETags
          are not MD5s at all.  In those cases only the size is compared.

        A copy that fails the check is deleted again, so that a re-run does not mistake it
        for a finished copy; the source is never touched.
        """
        sbucket, skey = self._object(src)
        dbucket, dkey = self._object(dst)
        head = self._head(src)
        if head is None:
            raise StorageError(
                f"cannot copy {src} to {dst}: the source does not exist; check whether it was archived already"
            )
        size, etag = int(head["ContentLength"]), str(head["ETag"])
        source = {"Bucket": sbucket, "Key": skey}
        try:
            if size <= MAX_SINGLE_COPY:
                self.client.copy_object(Bucket=dbucket, Key=dkey, CopySource=source, CopySourceIfMatch=etag)
            else:
                self.client.copy(source, dbucket, dkey)
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(f"copy {src} to", dst, exc) from exc
        self._verify_copy(src, dst, size, etag, head)

    def _verify_copy(self, src: str, dst: str, size: int, etag: str, src_head: dict[str, Any]) -> None:
        copied = self._head(dst)
        problem = None
        if copied is None:
            problem = "the copy is missing right after CopyObject succeeded"
        elif int(copied["ContentLength"]) != size:
            problem = f"the copy has {copied['ContentLength']} bytes, the source {size}"
        elif self._etags_comparable(etag, src_head) and copied["ETag"] != etag:
            problem = f"the copy's ETag {copied['ETag']} differs from the source's {etag}"
        if problem is None:
            return
        try:
            self.delete(dst)
        except StorageError:
            log.exception("could not delete the bad copy %s", dst)
        raise StorageError(
            f"copy of {src} to {dst} failed verification: {problem}. The copy was deleted and the source kept; "
            "re-run, and if this repeats, check for another writer to the destination"
        )

    @staticmethod
    def _etags_comparable(etag: str, head: dict[str, Any]) -> bool:
        if _is_multipart_etag(etag):
            return False
        return not (str(head.get("ServerSideEncryption", "")).startswith("aws:kms") or head.get("SSECustomerAlgorithm"))

    def size(self, path: str) -> int:
        head = self._head(path)
        if head is None:
            raise StorageError(f"cannot stat {path}: no such object; check that an earlier step produced it")
        return int(head["ContentLength"])

    def delete(self, path: str) -> None:
        """Delete one object; deleting a missing key is not an error (S3 answers 204 either way)."""
        bucket, key = self._object(path)
        try:
            self.client.delete_object(Bucket=bucket, Key=key)
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("delete", path, exc) from exc

    def delete_tree(self, path: str) -> None:
        """Delete every key under ``path``, at most 1000 keys per DeleteObjects request."""
        bucket, prefix = self._prefix(path)
        if not prefix:
            raise StorageError(f"refusing to delete the whole bucket at {path}; give a prefix inside it")
        failed: list[str] = []
        batch: list[dict[str, str]] = []
        deleted = 0
        try:
            for obj in self._iter_objects(bucket, prefix):
                batch.append({"Key": obj["Key"]})
                if len(batch) == DELETE_BATCH:
                    failed += self._delete_batch(bucket, batch)
                    deleted += len(batch)
                    batch = []
            if batch:
                failed += self._delete_batch(bucket, batch)
                deleted += len(batch)
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("delete the tree", path, exc) from exc
        if failed:
            shown = ", ".join(failed[:20]) + (f" and {len(failed) - 20} more" if len(failed) > 20 else "")
            raise StorageError(
                f"cannot delete {len(failed)} of {deleted} objects under {path}: {shown}. "
                f"Check the permissions of Airflow connection {self.aws_conn_id!r} (s3:DeleteObject) and re-run"
            )
        log.debug("deleted %d objects under %s", deleted, path)

    def _delete_batch(self, bucket: str, batch: list[dict[str, str]]) -> list[str]:
        """Delete up to 1000 keys; the keys that failed, with their error codes."""
        resp = self.client.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
        return [f"s3://{bucket}/{e.get('Key')} ({e.get('Code')})" for e in resp.get("Errors", [])]

    def remove_dir_if_empty(self, path: str) -> bool:
        """True if no key remains under ``path`` (a lone "directory marker" object is removed)."""
        bucket, prefix = self._prefix(path)
        try:
            resp = self.client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=2)
            keys = [o["Key"] for o in resp.get("Contents", [])]
            if keys == [prefix] and prefix:
                self.client.delete_object(Bucket=bucket, Key=prefix)
                return True
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("list", path, exc) from exc
        return not keys


class _RangeReader(io.RawIOBase):
    """A read-only, seekable view of one S3 object through ranged GetObject calls.

    Every range is read with ``If-Match`` on the ETag seen when it was opened: an object
    replaced while it is being read fails loudly instead of mixing two versions.
    """

    def __init__(self, storage: S3Storage, path: str, bucket: str, key: str, size: int, etag: str) -> None:
        super().__init__()
        self._s, self._path, self._bucket, self._key = storage, path, bucket, key
        self._size, self._etag, self._pos = size, etag, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self._size - self._pos)
        if n <= 0:
            return 0
        rng = f"bytes={self._pos}-{self._pos + n - 1}"
        try:
            body = self._s.client.get_object(Bucket=self._bucket, Key=self._key, Range=rng, IfMatch=self._etag)
            data = body["Body"].read()
        except (ClientError, BotoCoreError) as exc:
            raise self._s._fail("read", self._path, exc) from exc
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)
