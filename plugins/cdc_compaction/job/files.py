"""The job's few file operations outside Spark's readers and writers, behind one seam.

The compaction job writes its stats file, reads a commit record and lists (and cleans) the
directories it wrote.  In a classic session (spark-submit, EMR, the tests' in-process session)
that goes through Hadoop's ``FileSystem`` in the driver's JVM, so any URI Spark can write works.
Over Spark Connect the job runs in the client (the Airflow task's process) and there is no
JVM there: the same operations run client side with ``pyarrow.fs`` -- local paths (``/x``,
``file:/x``, ``file:///x``) and S3 (``s3://`` or ``s3a://``, the scheme Spark writes with).

S3 over Connect: the endpoint, region and path-style setting are taken from the server
session's ``spark.hadoop.fs.s3a.*`` conf (so the client talks to the store Spark writes to);
credentials come from the client's default AWS chain (environment, profile, instance role),
never from Spark conf.

Part of the job package: imports nothing of the Airflow side.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Protocol

from cdc_compaction.job.contract import partition_dir_value

log = logging.getLogger(__name__)


def is_data_name(name: str) -> bool:
    """A data file's name: not Spark's ``_SUCCESS``, a committer's ``_temporary``, nor a ``.crc`` checksum."""
    return not name.startswith(("_", "."))


def _is_partition_dir(name: str) -> bool:
    """A partition directory, named either way (``cdc_partition=``, or ``_cdc_partition=`` written before)."""
    return partition_dir_value(name) is not None


class JobFiles(Protocol):
    """What the job does with files besides reading and writing DataFrames."""

    def write_text(self, path: str, text: str) -> None:
        """Write (or overwrite) a small text file."""

    def read_text(self, path: str) -> str | None:
        """A small file's text, or None if it does not exist."""

    def data_files(self, path: str, rel: str) -> list[dict[str, Any]]:
        """Data files under ``path`` as ``{"name": "<rel>/<file>", "size": n}``; anything else is deleted."""

    def quiet_writes(self) -> None:
        """Ask Spark to write data files only (no ``_SUCCESS``, summaries, ``.crc``), where it can."""

    def exists(self, path: str) -> bool:
        """True if ``path`` is a file or a directory (on S3: a prefix holding at least one object)."""


def is_connect(spark: Any) -> bool:
    """True for a Spark Connect session (told by its class, without importing pyspark's Connect client)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def for_session(spark: Any) -> JobFiles:
    """The file operations that fit ``spark``: Hadoop's FileSystem in a classic session, pyarrow over Connect."""
    return ArrowFiles(spark) if is_connect(spark) else HadoopFiles(spark)


def read_version(spark: Any, schema: str, location: str, rows: int | None) -> Any:
    """A live version's Parquet directory as a DataFrame of ``schema``.

    On S3 a directory is only the prefix of its objects: an empty version that no job wrote
    (the genesis version every table starts from, and its tombstones) has none, so Spark would
    find no path where a local lake has an empty directory.  A location the plan says holds no
    rows (``rows == 0``) and that does not exist reads as no rows; any other missing version is
    Spark's error, as before (a version that holds rows must be there).
    """
    if rows == 0 and not for_session(spark).exists(location):
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).parquet(location)


def _sql_quiet_writes(spark: Any) -> None:
    # SQL confs are copied into the Hadoop configuration of every write (classic and Connect alike).
    spark.conf.set("mapreduce.fileoutputcommitter.marksuccessfuljobs", "false")
    spark.conf.set("parquet.summary.metadata.level", "NONE")


class HadoopFiles:
    """Through Hadoop's ``FileSystem`` in the driver's JVM (a classic session): any Spark-readable URI."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    def _fs(self, path: str) -> tuple[Any, Any]:
        jvm = self.spark._jvm
        p = jvm.org.apache.hadoop.fs.Path(path)
        return p.getFileSystem(self.spark._jsc.hadoopConfiguration()), p

    def write_text(self, path: str, text: str) -> None:
        fs, p = self._fs(path)
        out = fs.create(p, True)
        try:
            out.write(bytearray(text.encode("utf-8")))
        finally:
            out.close()

    def read_text(self, path: str) -> str | None:
        fs, p = self._fs(path)
        if not fs.exists(p):
            return None
        stream = fs.open(p)
        try:
            jvm = self.spark._jvm
            reader = jvm.java.io.BufferedReader(jvm.java.io.InputStreamReader(stream, "UTF-8"))
            lines = []
            while (line := reader.readLine()) is not None:
                lines.append(line)
            return "\n".join(lines)
        finally:
            stream.close()

    def exists(self, path: str) -> bool:
        fs, p = self._fs(path)
        return bool(fs.exists(p))

    def data_files(self, path: str, rel: str) -> list[dict[str, Any]]:
        fs, p = self._fs(path)
        if not fs.exists(p):
            return []
        # A checksummed file system (local files) hides its .crc files from listings: look under it
        # (py4j raises for any other file system, which lists everything already).
        with contextlib.suppress(Exception):
            fs = fs.getRawFileSystem()
        files = []
        for st in fs.listStatus(p):
            name = st.getPath().getName()
            if st.isFile() and is_data_name(name):
                files.append({"name": f"{rel}/{name}", "size": int(st.getLen())})
            elif st.isDirectory() and _is_partition_dir(name) and "/" not in rel:
                files += self.data_files(f"{path.rstrip('/')}/{name}", f"{rel}/{name}")
            else:
                log.info("removing %s from the output: not a data file", st.getPath().toString())
                fs.delete(st.getPath(), True)
        return sorted(files, key=lambda f: f["name"])

    def quiet_writes(self) -> None:
        _sql_quiet_writes(self.spark)
        try:
            jvm = self.spark._jvm
            local = jvm.org.apache.hadoop.fs.FileSystem.getLocal(self.spark._jsc.hadoopConfiguration())
            local.setWriteChecksum(False)
        except Exception:  # only an optimisation: data_files removes what is written anyway
            log.debug("could not turn off local checksum files", exc_info=True)


def _s3_options(spark: Any) -> dict[str, Any]:
    """pyarrow ``S3FileSystem`` options from the session's ``fs.s3a`` conf: endpoint, region, path style, and
    the credentials the engine set on the session (``fs.s3a.access.key``, ...; held in the server's memory).

    Without them pyarrow falls back to AWS's default chain of this process: an Airflow task whose
    credentials are in the storage connection only would write anonymously (refused by S3; an
    S3-compatible store that takes it may keep the unsigned stream's chunk framing in the object).
    """

    def conf(key: str, prefix: str = "spark.hadoop.") -> str | None:
        try:
            value = spark.conf.get(f"{prefix}fs.s3a.{key}", None)
        except Exception:  # noqa: BLE001 - a conf Spark does not know reads as unset
            return None
        return str(value) if value else None

    options: dict[str, Any] = {}
    endpoint = conf("endpoint")
    if endpoint:
        scheme, sep, rest = endpoint.partition("://")
        if sep:
            options["scheme"], endpoint = scheme, rest
        options["endpoint_override"] = endpoint
    region = conf("endpoint.region") or conf("region")
    if region:
        options["region"] = region
    if (conf("path.style.access") or "").lower() == "true":
        options["force_virtual_addressing"] = False
    access, secret = conf("access.key", prefix=""), conf("secret.key", prefix="")
    if access and secret:
        options["access_key"], options["secret_key"] = access, secret
        token = conf("session.token", prefix="")
        if token:
            options["session_token"] = token
    return options


class ArrowFiles:
    """Client side with ``pyarrow.fs`` (a Spark Connect session has no JVM in this process)."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self._s3: Any = None

    def _fs(self, path: str) -> tuple[Any, str]:
        from pyarrow import fs as pafs

        scheme, sep, rest = path.partition("://")
        if sep and scheme in ("s3", "s3a"):
            if self._s3 is None:
                self._s3 = pafs.S3FileSystem(**_s3_options(self.spark))
            return self._s3, rest
        if path.startswith("file:"):
            # file:/x, file:///x (Spark's spellings of a local path)
            rest = path[len("file:") :]
            path = "/" + rest.lstrip("/")
        elif sep:
            raise OSError(f"{path}: the Spark Connect engine reads and writes local paths and s3:// only")
        # Literal names: a partition directory's "%3A" is part of its name, not an escape.
        return pafs.LocalFileSystem(), path

    def write_text(self, path: str, text: str) -> None:
        from pyarrow import fs as pafs

        fs, p = self._fs(path)
        parent = p.rsplit("/", 1)[0]
        # Local files need their directory; on S3 it would be an empty marker object a reader's glob finds.
        if parent and isinstance(fs, pafs.LocalFileSystem):
            fs.create_dir(parent, recursive=True)
        with fs.open_output_stream(p) as out:
            out.write(text.encode("utf-8"))

    def read_text(self, path: str) -> str | None:
        from pyarrow import fs as pafs

        fs, p = self._fs(path)
        if fs.get_file_info(p).type != pafs.FileType.File:
            return None
        with fs.open_input_stream(p) as stream:
            return bytes(stream.read()).decode("utf-8")

    def exists(self, path: str) -> bool:
        from pyarrow import fs as pafs

        fs, p = self._fs(path)
        return fs.get_file_info(p).type != pafs.FileType.NotFound

    def data_files(self, path: str, rel: str) -> list[dict[str, Any]]:
        from pyarrow import fs as pafs

        fs, p = self._fs(path)
        if fs.get_file_info(p).type != pafs.FileType.Directory:
            return []
        files = []
        for info in fs.get_file_info(pafs.FileSelector(p, recursive=False)):
            name = info.base_name
            if info.type == pafs.FileType.File and is_data_name(name):
                files.append({"name": f"{rel}/{name}", "size": int(info.size or 0)})
            elif info.type == pafs.FileType.Directory and _is_partition_dir(name) and "/" not in rel:
                files += self.data_files(f"{path.rstrip('/')}/{name}", f"{rel}/{name}")
            else:
                log.info("removing %s from the output: not a data file", info.path)
                if info.type == pafs.FileType.Directory:
                    fs.delete_dir(info.path)
                else:
                    fs.delete_file(info.path)
        return sorted(files, key=lambda f: f["name"])

    def quiet_writes(self) -> None:
        # The server's local checksum files cannot be turned off from here: data_files removes them.
        _sql_quiet_writes(self.spark)
