"""Engines that run Spark work: spark-submit (what the DAG uses) or one in-process session.

Both run the same job code, the job package :mod:`cdc_compaction.job`, and the same rendered
SQL, so the in-process engine (used by ``make conformance MODE=inprocess`` and the tests)
exercises exactly what a DAG run submits.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import tempfile
from collections.abc import Iterator
from typing import Any, Protocol

from cdc_compaction.core import settings
from cdc_compaction.core.credentials import mask_credentials
from cdc_compaction.core.exceptions import (
    CompactionError,
    MetastoreError,
    PermanentCompactionError,
    SparkConnectLostError,
)
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.core.settings import MetastoreEndpoint

log = logging.getLogger(__name__)

#: Spark SQL substitutes ``${var}``, ``${env:HOME}``, ``${spark.x}`` in statement text, comments and
#: string literals included: registry text (a column comment) must reach the metastore verbatim.
NO_SQL_SUBSTITUTION: dict[str, str] = {"spark.sql.variable.substitute": "false"}

#: Spark settings every submission gets: UTC everywhere, no UI port to collide on.
BASE_SPARK_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.sources.partitionOverwriteMode": "static",
    "spark.sql.parquet.compression.codec": "snappy",
    **NO_SQL_SUBSTITUTION,
}


def job_package_dir() -> str:
    """Where task runs build the job package: ``$CDC_JOB_PACKAGE_DIR`` or ``.run/job-package`` of the project."""
    return os.environ.get("CDC_JOB_PACKAGE_DIR") or str(settings.PROJECT_ROOT / ".run" / "job-package")


def job_package() -> str:
    """The job package zip for ``spark-submit --py-files``, built if this source's zip is not there yet.

    Called when a task runs, never while the DAG file is parsed (it reads the job's sources).
    """
    from cdc_compaction.job import bundle

    path = bundle.build(job_package_dir())
    log.info("job package: %s", path)
    return str(path)


def mask_submit_logs(hook: Any) -> Any:
    """``hook`` (a SparkSubmitHook) logging its command and output with every credential masked.

    The provider masks only values whose key says ``secret`` or ``password``: a session token,
    an access or account key would be logged as written. The registry refuses such keys, but a
    Spark connection's extras or a cluster default can still bring one; every place the hook logs
    the command or its output goes through its ``_mask_cmd``.
    """
    from airflow.providers.apache.spark.hooks.spark_submit import _mask_sensitive_values

    def mask_cmd(connection_cmd: str | list[str]) -> str:
        parts = [connection_cmd] if isinstance(connection_cmd, str) else connection_cmd
        return mask_credentials(_mask_sensitive_values(" ".join(parts)))

    hook._mask_cmd = mask_cmd
    return hook


GLUE_CLIENT_FACTORY = "com.amazonaws.glue.catalog.metastore.AWSGlueDataCatalogHiveClientFactory"


def compaction_conf(cfg: TableConfig) -> dict[str, str]:
    """Spark conf of the compaction job: defaults, the registry's Hadoop settings, then its Spark conf."""
    hadoop = {f"spark.hadoop.{k}": v for k, v in cfg.spark.hadoop_conf.items()}
    # Last wins: a registry spark.conf cannot turn Spark SQL variable substitution back on.
    return {**BASE_SPARK_CONF, "spark.ui.enabled": "false", **hadoop, **cfg.spark.conf, **NO_SQL_SUBSTITUTION}


def emr_job_package_uri(application: str) -> str:
    """The job package's S3 URI when ``spark.emr.py_files`` is not set: this source's zip beside ``application``.

    The name carries the hash of this deployment's job source (``cdc-compaction job-package``
    prints it), so a step never runs another version of the job than the Airflow side expects.
    """
    from cdc_compaction.job import bundle

    return f"{posixpath.dirname(application)}/{bundle.file_name(bundle.build_bytes())}"


def check_emr_job_package(uri: str) -> None:
    """Warn when ``spark.emr.py_files`` names a zip other than this deployment's job package."""
    from cdc_compaction.job import bundle

    expected = bundle.file_name(bundle.build_bytes())
    if posixpath.basename(uri) != expected:
        log.warning(
            "spark.emr.py_files is %s, but this deployment's job package is %s: the cluster may run another "
            "version of the job (cdc-compaction job-package builds it; upload it and point py_files at it)",
            uri,
            expected,
        )


def emr_steps(cfg: TableConfig, plan_arg: str, py_files: str | None = None) -> list[dict[str, Any]]:
    """The EMR step that runs the compaction: ``spark-submit`` through ``command-runner.jar``.

    ``--py-files`` is ``py_files``, else ``spark.emr.py_files``, else :func:`emr_job_package_uri`
    (which reads the job's sources: the DAG passes a placeholder instead, filled when the task runs).
    """
    emr = cfg.spark.emr
    if emr is None:
        raise CompactionError(f"{cfg.qualified_name}: spark.engine is emr but spark.emr is not set")
    py_files = py_files or emr.py_files or emr_job_package_uri(emr.application)
    args = ["spark-submit", "--deploy-mode", emr.deploy_mode, "--name", f"cdc-compact-{cfg.qualified_name}"]
    for k, v in compaction_conf(cfg).items():
        args += ["--conf", f"{k}={v}"]
    if cfg.spark.jars:
        args += ["--jars", ",".join(cfg.spark.jars)]
    if cfg.spark.driver_memory:
        args += ["--driver-memory", cfg.spark.driver_memory]
    if cfg.spark.executor_memory:
        args += ["--executor-memory", cfg.spark.executor_memory]
    return [
        {
            "Name": f"cdc-compact-{cfg.qualified_name}",
            "ActionOnFailure": emr.action_on_failure,
            "HadoopJarStep": {
                "Jar": "command-runner.jar",
                "Args": [*args, "--py-files", py_files, emr.application, "--plan", plan_arg],
            },
        }
    ]


def spark_hadoop_version() -> str | None:
    """The Hadoop version the installed pyspark ships (hadoop-aws must be exactly this version).

    ``None`` without pyspark: ``registry validate`` runs wherever the registry is edited, which
    needs neither Spark nor Java (it only lists pyspark's jar directory, it never starts a JVM).
    """
    import re

    try:
        import pyspark
    except ImportError:
        return None

    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    for name in sorted(os.listdir(jars)) if os.path.isdir(jars) else []:
        m = re.match(r"^hadoop-client-api-(\d+\.\d+\.\d+)\.jar$", name)
        if m:
            return m.group(1)
    return None


def check_jars(cfg: TableConfig, hadoop_version: str | None) -> list[str]:
    """Problems with the registry's extra jars for this Spark (empty when they fit)."""
    import re

    problems = []
    for jar in cfg.spark.jars:
        m = re.search(r"hadoop-aws-(\d+\.\d+\.\d+)\.jar$", jar)
        if m and hadoop_version and m.group(1) != hadoop_version:
            problems.append(
                f"{cfg.qualified_name}: spark.jars has {jar}, but this Spark ships Hadoop {hadoop_version}; "
                f"use hadoop-aws-{hadoop_version}.jar (hadoop-aws must match hadoop-client-api exactly)"
            )
    return problems


#: Hadoop's S3A file system: what ``s3a://`` paths (and ``s3://`` ones, off EMR) are read and written with.
S3A_FILE_SYSTEM = "org.apache.hadoop.fs.s3a.S3AFileSystem"
#: The ``jars.lock`` group holding hadoop-aws and the AWS SDK v2 bundle (``make jars`` fetches it).
S3A_JAR_GROUP = "s3a"


def on_s3(cfg: TableConfig) -> bool:
    """True if ``cfg``'s lake (its storage root) is on S3, so Spark must read and write it through S3A."""
    from cdc_compaction.core.storage import S3_SCHEMES

    return cfg.storage_root.startswith(S3_SCHEMES)


def s3a_jars() -> list[str]:
    """hadoop-aws and the AWS SDK bundle from the checked jar cache (``make jars``), never downloaded here."""
    from cdc_compaction.core import jarcache

    return jarcache.group_jars(S3A_JAR_GROUP)


def s3a_local_classpath() -> dict[str, str]:
    """The S3A jars on the driver's own classpath, for a ``local[*]`` JVM (the session, the Connect server).

    Not ``spark.jars``: that ships each jar to the executors, and a local executor copies the
    686 MB SDK bundle into its work directory once per application.  In local mode the driver's
    JVM is the executor, so its classpath is enough.
    """
    return {"spark.driver.extraClassPath": os.pathsep.join(s3a_jars())}


def s3a_conf(cfg: TableConfig) -> tuple[dict[str, str], dict[str, str]]:
    """(Hadoop settings, credentials) that let Spark reach ``cfg``'s S3 lake through S3A; empty off S3.

    Everything comes from the Airflow connection ``storage_conn_id`` (``aws_default``), the one
    the commit protocol's ``S3Hook`` uses, so Spark and the commit protocol talk to the same
    store (:func:`s3a_connection_conf`).  The registry's ``spark.hadoop_conf`` is applied after
    these and wins.
    """
    if not on_s3(cfg):
        return {}, {}
    return s3a_connection_conf(
        cfg.storage_conn_id, f"{cfg.qualified_name}: the lake {cfg.storage_root} is on S3, but the Airflow connection"
    )


def s3a_connection_conf(conn_id: str, who: str = "the Airflow connection") -> tuple[dict[str, str], dict[str, str]]:
    """(Hadoop settings, credentials) of S3A for the Airflow connection ``conn_id``.

    Its ``endpoint_url`` (an S3-compatible store, reached path-style), its region, and the
    credentials it resolves (the connection's, else boto's chain: environment, profile, instance
    role).  The credentials are returned apart as ``AWS_*`` variables, never in the Hadoop
    settings: each JVM takes them its own way (a process environment, the JVM's in-memory
    configuration), so they never land on a command line, in a file or in a log.  Spark's engines
    (:func:`s3a_conf`) and the local Thrift metastore that records ``s3a://`` locations
    (``devtools.local_services``) both take them from here.  ``who`` begins the refusal's message.
    """
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    hook = S3Hook(aws_conn_id=conn_id)
    try:
        endpoint = hook.conn_config.endpoint_url
        region = hook.conn_region_name
        creds = hook.get_credentials()
    except Exception as exc:
        raise CompactionError(
            f"{who} {conn_id!r} (registry storage_conn_id) gives no S3 settings ({mask_credentials(str(exc))}); "
            "define it with credentials, region_name and, for an S3-compatible store, endpoint_url in its extras"
        ) from exc
    hadoop = {"fs.s3a.impl": S3A_FILE_SYSTEM, "fs.s3.impl": S3A_FILE_SYSTEM}
    if endpoint:
        hadoop["fs.s3a.endpoint"] = str(endpoint)
        # S3-compatible stores (MinIO, moto, Ceph) serve buckets as paths of one host, not as host names.
        hadoop["fs.s3a.path.style.access"] = "true"
        if str(endpoint).startswith("http://"):
            hadoop["fs.s3a.connection.ssl.enabled"] = "false"
    if region:
        hadoop["fs.s3a.endpoint.region"] = str(region)
    env: dict[str, str] = {}
    if creds.access_key and creds.secret_key:
        env = {"AWS_ACCESS_KEY_ID": creds.access_key, "AWS_SECRET_ACCESS_KEY": creds.secret_key}
        if creds.token:
            env["AWS_SESSION_TOKEN"] = creds.token
    return hadoop, env


#: The S3A settings that carry each credential, for a JVM that is already running (its environment is fixed).
_S3A_CREDENTIAL_KEYS = {
    "AWS_ACCESS_KEY_ID": "fs.s3a.access.key",
    "AWS_SECRET_ACCESS_KEY": "fs.s3a.secret.key",
    "AWS_SESSION_TOKEN": "fs.s3a.session.token",
}


#: The S3A settings the job's client-side file operations over Spark Connect read (job/files.py ``_s3_options``;
#: the credentials it reads as the session has them, ``fs.s3a.access.key``, ...).
_S3A_CLIENT_KEYS = ("fs.s3a.endpoint", "fs.s3a.endpoint.region", "fs.s3a.path.style.access")


def s3a_submit(cfg: TableConfig) -> tuple[dict[str, str], list[str], dict[str, str]]:
    """What a ``spark-submit`` of ``cfg``'s job adds for a lake on S3: (conf, jars, environment); empty off S3.

    The conf carries the endpoint and addressing (``spark.hadoop.fs.s3a.*``), the jars are the
    checked S3A group of the jar cache, and the credentials travel as the process's ``AWS_*``
    environment, which S3A's default chain reads (never a ``--conf``: a command line is logged and
    visible to every user of the machine).  On a cluster the executors take credentials from their
    own environment or instance role.  EMR has its own S3 connector: nothing is added there.
    """
    if cfg.spark.engine == "emr" or not on_s3(cfg):
        return {}, [], {}
    hadoop, env = s3a_conf(cfg)
    return {f"spark.hadoop.{k}": v for k, v in hadoop.items()}, s3a_jars(), env


def s3a_session_conf(cfg: TableConfig) -> dict[str, str]:
    """``s3a_conf`` as one session's Hadoop settings, credentials included (held in the JVM's memory only)."""
    hadoop, env = s3a_conf(cfg)
    if not hadoop:
        return {}
    conf = {**hadoop, **{_S3A_CREDENTIAL_KEYS[k]: v for k, v in env.items()}}
    if "AWS_SESSION_TOKEN" in env:
        conf["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
    # The registry's own Hadoop settings win (a deliberate endpoint or credentials provider).
    return {**conf, **cfg.spark.hadoop_conf}


def configure_s3a(spark: Any, cfg: TableConfig) -> None:
    """Point a classic session at ``cfg``'s S3 lake: its Hadoop configuration and its SQL conf (both are read).

    DataFrame reads and writes take a copy of the SQL conf into their Hadoop configuration; the
    job's own file operations (:class:`~cdc_compaction.job.files.HadoopFiles`) use the context's
    Hadoop configuration: both get the settings.  S3A file systems are cached per bucket: a bucket
    keeps the settings of its first use in this JVM.
    """
    conf = s3a_session_conf(cfg)
    if not conf:
        return
    hadoop = spark._jsc.hadoopConfiguration()
    for k, v in conf.items():
        hadoop.set(k, v)
        spark.conf.set(k, v)


def hive_conf(endpoint: MetastoreEndpoint, warehouse_dir: str) -> dict[str, str]:
    """Spark conf that attaches a session to the table catalog: a Thrift metastore, or Glue (on EMR)."""
    if endpoint.kind == "glue":
        # EMR's Hive client factory for the Glue Data Catalog (present on EMR clusters only).
        conf = {
            "spark.sql.catalogImplementation": "hive",
            "spark.hadoop.hive.metastore.client.factory.class": GLUE_CLIENT_FACTORY,
            "spark.sql.warehouse.dir": warehouse_dir,
        }
        if endpoint.catalog_id:
            conf["spark.hadoop.hive.metastore.glue.catalogid"] = endpoint.catalog_id
        return conf
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.hadoop.hive.metastore.uris": endpoint.uri,
        "spark.sql.warehouse.dir": warehouse_dir,
    }


class Engine(Protocol):
    """What the tasks need from Spark besides the compaction job itself."""

    def run_sql(self, cfg: TableConfig, statements: list[str]) -> None: ...


class SessionEngine:
    """Runs everything in one SparkSession of this process (metastore-backed)."""

    def __init__(self, spark: Any, cfg: TableConfig | None = None) -> None:
        self.spark = spark
        #: The table whose lake the session reads and writes: on S3, the session is pointed at it (S3A).
        self.cfg = cfg
        if cfg is not None:
            configure_s3a(spark, cfg)

    def run_sql(self, cfg: TableConfig, statements: list[str]) -> None:
        from cdc_compaction.job import run_sql  # imports pyspark: only when a session runs

        configure_s3a(self.spark, cfg)
        run_sql.run_statements(self.spark, statements)

    def compact(self, plan: dict[str, Any]) -> dict[str, Any]:
        from cdc_compaction.job import compact as job

        if self.cfg is not None:
            configure_s3a(self.spark, self.cfg)  # another table's engine may have used the session since
        # A fresh attempt directory per call, as spark-submit's ``main`` makes one per job:
        # a cleared or repeated compact never writes into a directory another attempt wrote.
        try:
            return job.run(self.spark, plan, attempt=job.new_attempt())
        except job.PermanentJobError as exc:  # a stale plan: as spark-submit's exit code tells the DAG
            raise PermanentCompactionError(str(exc)) from exc


class SparkSubmitEngine:
    """Runs SQL through ``spark-submit include/spark_jobs/run_sql.py`` and the job package (one JVM per call)."""

    def __init__(self, endpoint: MetastoreEndpoint, warehouse_dir: str) -> None:
        self.endpoint = endpoint
        self.warehouse_dir = warehouse_dir

    def run_sql(self, cfg: TableConfig, statements: list[str]) -> None:
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="cdc-ddl-", delete=False) as fh:
            json.dump(statements, fh)
            path = fh.name
        try:
            # A lake on S3: Spark qualifies a table's or partition's s3a:// location with its own file
            # system, so the DDL's driver needs S3A as the compact task's does (the same jars, settings
            # and credentials environment; the registry's hadoop_conf wins).
            s3a, jars, env = s3a_submit(cfg)
            conf = {
                **BASE_SPARK_CONF,
                "spark.ui.enabled": "false",
                **hive_conf(self.endpoint, self.warehouse_dir),
                **s3a,
                **{f"spark.hadoop.{k}": v for k, v in cfg.spark.hadoop_conf.items()},
            }
            hook = mask_submit_logs(
                SparkSubmitHook(
                    conn_id=cfg.spark.conn_id,
                    conf=conf,
                    name=f"cdc-ddl-{cfg.qualified_name}",
                    application_args=["--statements", path],
                    driver_memory=cfg.spark.driver_memory,
                    py_files=job_package(),
                    jars=",".join(jars) or None,
                )
            )
            # The credentials into the process's environment only (as the compact task's): on YARN or
            # Kubernetes the provider would make them --conf arguments, and cluster mode refuses them.
            if env and not (hook._is_yarn or hook._is_kubernetes or hook._connection.get("deploy_mode") == "cluster"):
                hook._env_vars = {**env, **(hook._env_vars or {})}
            try:
                hook.submit(application=str(settings.SPARK_JOBS_DIR / "run_sql.py"))
            except Exception as exc:
                raise MetastoreError(
                    f"DDL for {cfg.qualified_name} failed in spark-submit ({exc}); the statements are in "
                    f"the task log above. Check the metastore at {self.endpoint.uri} and the registry schema"
                ) from exc
        finally:
            os.unlink(path)


#: Spark Connect client retries of a lost server, as pyspark's exponential backoff (50 ms x 4^n):
#: 5 retries wait about 17 s in all, then the task fails and Airflow's retries take over (a
#: restarted server is reached by the next try; pyspark's own default waits up to 10 minutes).
CONNECT_CLIENT_RETRIES = 5


def connect_lost(exc: BaseException) -> bool:
    """True if ``exc`` (or what caused it) says the Spark Connect server is gone or was restarted.

    gRPC UNAVAILABLE (nobody listens, the connection broke), the client giving up its retries,
    or a server that no longer knows the session (it restarted under the task).
    """
    import grpc  # the Spark Connect client's transport (installed with pyspark-client)

    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        code = getattr(e, "code", None)
        status = code() if isinstance(e, grpc.RpcError) and callable(code) else None
        status = status or getattr(e, "_grpc_status_code", None)
        if status is not None and getattr(status, "name", "") == "UNAVAILABLE":
            return True
        name = type(e).__name__
        text = str(e)
        if name == "RetriesExceeded" or "SESSION_NOT_FOUND" in text or "SESSION_CLOSED" in text:
            return True
        e = e.__cause__ or e.__context__
    return False


#: PySpark's process-wide "this process is a Spark Connect client" mark (see ``ConnectEngine.session``).
_CONNECT_MODE_ENV = "SPARK_CONNECT_MODE_ENABLED"


class ConnectEngine:
    """Runs the job and the DDL in a long-lived Spark Connect server (registry ``spark.engine: spark_connect``).

    The job runs in this process (the Airflow task's), its DataFrames execute in the server:
    no JVM starts per run.  Every call gets a fresh server-side session (``create()``), so
    tables compacted at the same time share no temporary views or confs, and the session is
    closed at the end, failed or not.  The server's catalog (metastore, warehouse) is its own
    configuration; the registry's ``spark.conf`` and ``hadoop_conf`` are set on each session.
    """

    def __init__(self, url: str, cfg: TableConfig | None = None, client_retries: int = CONNECT_CLIENT_RETRIES) -> None:
        self.url = url
        #: The table whose spark.conf / hadoop_conf the compaction's session gets.
        self.cfg = cfg
        self.client_retries = client_retries

    @contextlib.contextmanager
    def session(self, cfg: TableConfig | None) -> Iterator[Any]:
        """A fresh server-side session, closed on the way out (failed or not).

        PySpark marks its process as a Connect client (``SPARK_CONNECT_MODE_ENABLED``, which
        ``pyspark.sql.functions`` consults) when the first remote session is created, and a
        classic session of the same process breaks from then on.  The mark is restored on the
        way out, so that a process with a classic session (the CLI, the tests) can use this
        engine in between: one at a time, never both at once.
        """
        from pyspark.sql import SparkSession
        from pyspark.sql.connect.client.retries import DefaultPolicy

        mark = os.environ.get(_CONNECT_MODE_ENV)
        try:
            try:
                spark = SparkSession.builder.remote(self.url).create()
            except Exception as exc:
                raise SparkConnectLostError(
                    f"{cfg.qualified_name if cfg else 'Spark Connect'}: cannot open a session on the Spark Connect "
                    f"server {_safe_url(self.url)} ({exc}); check that the server runs (make connect-start for the "
                    "embedded one) and the spark.conn_id connection's host and port"
                ) from exc
            try:
                spark.client.set_retry_policies([DefaultPolicy(max_retries=self.client_retries)])
                self._configure(spark, cfg)
                yield spark
            finally:
                self._close(spark)
        finally:
            if mark is None:
                os.environ.pop(_CONNECT_MODE_ENV, None)
            else:
                os.environ[_CONNECT_MODE_ENV] = mark

    @staticmethod
    def _configure(spark: Any, cfg: TableConfig | None) -> None:
        conf = {**NO_SQL_SUBSTITUTION, "spark.sql.session.timeZone": "UTC"}
        if cfg is not None:
            # A lake on S3: the session's reads and writes go through the server's S3A (its jars are the
            # server's, see SparkConnectServer) with the table's endpoint and credentials; the job's own
            # file operations, client side, read the endpoint from spark.hadoop.fs.s3a.* (job/files.py).
            s3a = s3a_session_conf(cfg)
            conf.update(s3a)
            conf.update({f"spark.hadoop.{k}": v for k, v in s3a.items() if k in _S3A_CLIENT_KEYS})
            # spark.hadoop.<k> reaches the writes' Hadoop configuration as <k> (SQL confs are copied into it).
            conf.update(dict(cfg.spark.hadoop_conf.items()))
            conf.update(cfg.spark.conf)
            conf.update(NO_SQL_SUBSTITUTION)
        for k, v in conf.items():
            try:
                spark.conf.set(k, v)
            except Exception as exc:  # a static conf: the server's, not a session's, to set
                if connect_lost(exc):
                    raise
                shown = mask_credentials(f"{k}={v}")  # a server default or extra may still carry a credential
                # Spark's message may repeat the value: masked as well.
                log.warning(
                    "Spark Connect session: %s not set (%s); set it on the server", shown, mask_credentials(str(exc))
                )

    @staticmethod
    def _close(spark: Any) -> None:
        try:
            spark.stop()  # releases the server-side session (its temp views, cached data, confs)
        except Exception:  # the server may be gone: nothing is left to release then
            log.info("closing the Spark Connect session failed (server gone?)", exc_info=True)

    def run_sql(self, cfg: TableConfig, statements: list[str]) -> None:
        from cdc_compaction.job import run_sql

        try:
            with self.session(cfg) as spark:
                run_sql.run_statements(spark, statements)
        except SparkConnectLostError:
            raise
        except Exception as exc:
            if connect_lost(exc):
                raise SparkConnectLostError(
                    f"DDL for {cfg.qualified_name}: lost the Spark Connect server {_safe_url(self.url)} ({exc}); "
                    "the task retries once it is back"
                ) from exc
            raise MetastoreError(
                f"DDL for {cfg.qualified_name} failed in Spark Connect ({exc}); the statements are in the task "
                "log above. Check the server's metastore and the registry schema"
            ) from exc

    def compact(self, plan: dict[str, Any]) -> dict[str, Any]:
        """Run the job on ``plan`` in a fresh server session, in a new attempt directory; return its stats."""
        from cdc_compaction.job import compact as job

        table = plan.get("table", "?")
        try:
            with self.session(self.cfg) as spark:
                return job.run(spark, plan, attempt=job.new_attempt())
        except SparkConnectLostError:
            raise
        except job.PermanentJobError as exc:
            raise PermanentCompactionError(str(exc)) from exc
        except Exception as exc:
            if connect_lost(exc):
                # Nothing the lost run wrote is live: its attempt directory is its own, and publish
                # only ever makes a validated attempt live. The retry writes a new attempt.
                raise SparkConnectLostError(
                    f"{table}: lost the Spark Connect server {_safe_url(self.url)} during the compaction ({exc}); "
                    "nothing was published, the task retries (a new attempt directory) once the server is back"
                ) from exc
            raise


def _safe_url(url: str) -> str:
    """The URL without its parameters (a token may be among them)."""
    return url.split(";", 1)[0]


def local_session(
    endpoint: MetastoreEndpoint, warehouse_dir: str, app_name: str = "cdc-compaction", master: str = "local[2]"
) -> Any:
    """A Hive-enabled SparkSession in this process, attached to the shared metastore.

    With the S3A jars in the jar cache (``make jars``, put on the driver's classpath) the session
    can read and write ``s3a://`` lakes: a :class:`SessionEngine` given the table points it at
    the table's store.  Without them
    it still starts, for local lakes only (jars cannot be added to a running JVM).
    """
    from pyspark.sql import SparkSession

    from cdc_compaction.core.jarcache import JarError

    builder = SparkSession.builder.master(master).appName(app_name)
    conf = {
        **BASE_SPARK_CONF,
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.driver.memory": "1g",
        **hive_conf(endpoint, warehouse_dir),
    }
    try:
        conf.update(s3a_local_classpath())
    except JarError as exc:
        log.info("local Spark session without S3A (local lakes only): %s", exc)
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.enableHiveSupport().getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
