"""``cdc-compaction doctor``: is everything a table's run needs there, and does it answer?

Each check prints ``OK`` or ``FAIL`` with what it found and, for a FAIL, what to fix:

* ``registry``: the table's registry file validates (and its database's defaults file);
* ``metastore``: the catalog (Thrift metastore or Glue) answers a read of the table;
* ``storage``: a probe object under the table's ``_cdc/`` area is written, read back and deleted
  (through the storage layer: local directories and S3 alike);
* ``spark``: the master is reachable (``local[*]`` always is; ``spark://`` and ``k8s://`` a TCP
  connect; ``engine: emr`` the cluster is described and not ending; ``engine: spark_connect`` the
  Connect server accepts a TCP connection);
* ``smtp``: when alerts are configured, the SMTP connection answers a connect and EHLO (no mail sent);
* ``landed``: the Parquet footers of the pending (not yet compacted) files fit the registry,
  with the same check ``plan`` makes (:func:`cdc_compaction.core.inputs.check_file`).

Checks only read, except the storage probe, which deletes what it wrote.  The DAG's
optional ``doctor`` task (registry ``doctor: true``, :func:`preflight`) runs the cheap ones
before ``ensure_tables`` and stops the run before any step touches the table (README, "Doctor").
"""

from __future__ import annotations

import contextlib
import logging
import socket
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc_compaction.core.docs import doc_ref
from cdc_compaction.core.inputs import is_unreadable
from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.core.settings import MetastoreEndpoint
from cdc_compaction.core.sidechannel import count_failure

log = logging.getLogger(__name__)
#: The doctor task's SMTP checks that failed, by table (alerts are a side channel: counted, never fatal).
SMTP_FAILURES: dict[str, int] = {}

#: EMR cluster states in which a step can still run.
EMR_USABLE = {"STARTING", "BOOTSTRAPPING", "RUNNING", "WAITING"}
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Check:
    """One check's verdict about one subject (a table, or the registry)."""

    subject: str
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        head = f"{'OK  ' if self.ok else 'FAIL'} {self.subject}: {self.name}: {self.detail}"
        return head if self.ok or not self.fix else f"{head}\n       fix: {self.fix}"


def fix_for(exc: BaseException, fix: str, conn_id: str | None = None) -> str:
    """The fix of what actually failed: ``fix`` is for the service not answering, not for a missing
    module or an Airflow connection nobody defined (those cannot be fixed by starting anything)."""
    if isinstance(exc, ImportError):
        missing = (exc.name or str(exc)).split(".")[0]  # the package to install, not its submodule
        return (
            f"the Python module {missing!r} is missing where doctor runs: run it with the project's environment "
            "(make install; .venv/bin/cdc-compaction doctor) or the Airflow workers' one, which has it"
        )
    if type(exc).__name__ == "AirflowNotFoundException" and conn_id:
        return (
            f"define the Airflow connection {conn_id!r} (airflow connections add {conn_id} ..., the UI's Admin > "
            f"Connections, or the environment variable AIRFLOW_CONN_{conn_id.upper()}), or name an existing one "
            "in the registry entry"
        )
    return fix


def _guard(cfg: TableConfig, name: str, fix: str, probe: Callable[[], str], conn_id: str | None = None) -> Check:
    """Run ``probe`` (its return value is the OK detail); any error is a FAIL with the fix for its cause."""
    try:
        return Check(cfg.qualified_name, name, True, probe())
    except Exception as exc:  # every failure of a probe is the finding itself
        log.debug("%s: %s check failed", cfg.qualified_name, name, exc_info=True)
        return Check(cfg.qualified_name, name, False, f"{type(exc).__name__}: {exc}", fix_for(exc, fix, conn_id))


def check_registry(directory: Path, tables: Iterable[str] = ()) -> tuple[list[Check], list[TableConfig]]:
    """The registry's verdict on every file (or the named tables); the valid tables' configs."""
    from cdc_compaction.core.registry import load_database_defaults, load_registry

    wanted = set(tables)
    checks: list[Check] = []
    for db, d in sorted(load_database_defaults(directory).items()):
        if d.error is not None and (not wanted or any(t.split(".", 1)[0] == db for t in wanted)):
            checks.append(
                Check(
                    f"database {db}",
                    "registry",
                    False,
                    f"{d.path}: " + "; ".join(d.error.lines()),
                    f"fix {d.path.name} (it holds the defaults of every table of {db})",
                )
            )
    cfgs: list[TableConfig] = []
    seen: set[str] = set()
    for e in load_registry(directory):
        name = e.config.qualified_name if e.config is not None else e.path.name.rsplit(".", 1)[0]
        if wanted and name not in wanted:
            continue
        seen.add(name)
        if e.config is None:
            problems = e.error.lines() if e.error is not None else ["(unknown error)"]
            fix = f"fix {e.path} (cdc-compaction registry validate shows every problem)"
            checks.append(Check(name, "registry", False, f"{e.path.name}: " + "; ".join(problems), fix))
        else:
            checks.append(Check(name, "registry", True, f"{e.path.name} is valid (DAG {e.dag_id})"))
            cfgs.append(e.config)
    for name in sorted(wanted - seen):
        fix = f"add {directory / (name + '.yaml')} (cdc-compaction registry discover writes one)"
        checks.append(Check(name, "registry", False, f"no registry file for {name} in {directory}", fix))
    return checks, cfgs


def check_metastore(cfg: TableConfig, endpoint: MetastoreEndpoint) -> Check:
    from cdc_compaction.core.sql import table_names
    from cdc_compaction.integrations.metastore import connect

    def probe() -> str:
        base = table_names(cfg)["base_table"]
        with connect(endpoint, timeout_s=TIMEOUT_S) as ms:
            exists = ms.get_table(cfg.database, base) is not None
        return f"{endpoint.uri} answers; {cfg.database}.{base} " + ("exists" if exists else "is not created yet")

    if endpoint.kind == "glue":
        fix = (
            f"check the AWS connection {endpoint.aws_conn_id!r} (credentials, region) and its Glue permissions "
            "(glue:GetTable, CreateTable, UpdateTable, *Partition*)"
        )
    else:
        fix = (
            f"start the metastore at {endpoint.uri} (locally: make metastore-start), or point the "
            "'metastore_default' connection ($CDC_METASTORE_URI outside Airflow) at the running one"
        )
    return _guard(cfg, "metastore", fix, probe)


def check_storage(cfg: TableConfig) -> Check:
    lake = Lake(cfg)
    st, control = lake.storage, lake.layout.control
    path = st.join(control, f"doctor-probe-{uuid.uuid4().hex}.txt")

    def probe() -> str:
        text = f"cdc_compaction doctor probe of {cfg.qualified_name}"
        created = _missing_dirs(lake.layout.root, control)
        st.makedirs(control)
        try:
            st.write_text(path, text)
            try:
                back = st.read_text(path)
            finally:
                st.delete(path)
        finally:
            # Leave the lake as it was: the directories made for the probe go too (deepest first).
            for d in reversed(created):
                with contextlib.suppress(OSError):
                    d.rmdir()
        if back != text:
            raise OSError(f"read back {back!r} instead of what was written")
        if st.exists(path):
            raise OSError("the probe is still there after its delete")
        return f"wrote, read and deleted a probe under {control}"

    if control.startswith(("s3://", "s3a://")):
        fix = (
            f"give the connection {cfg.storage_conn_id!r} s3:PutObject, GetObject, DeleteObject and ListBucket on "
            f"{lake.layout.root}, and check the bucket exists"
        )
    else:
        fix = f"make {lake.layout.root} a directory the Airflow workers and Spark can write (owner, permissions, mount)"
    return _guard(cfg, "storage", fix, probe)


def _missing_dirs(root: str, control: str) -> list[Path]:
    """The local directories down to ``control`` that do not exist yet, outermost first (none on S3).

    The probe makes them and removes them again, so a table whose root does not exist yet (its first
    run creates it) is left as it was.  A control area outside the table's root is refused.
    """
    if root.startswith(("s3://", "s3a://")):
        return []
    top, leaf = Path(root).resolve(), Path(control).resolve()
    if not leaf.is_relative_to(top):
        raise OSError(f"the control area {leaf} is not under the table's storage root {top}: no probe is written")
    missing = []
    d = leaf
    while not d.exists():
        missing.append(d)
        d = d.parent
    return list(reversed(missing))


def _connection(conn_id: str) -> Any:
    from airflow.sdk import BaseHook

    return BaseHook.get_connection(conn_id)


def _tcp(host: str, port: int) -> None:
    with socket.create_connection((host, port), timeout=TIMEOUT_S):
        pass


def check_spark(cfg: TableConfig) -> Check:
    if cfg.spark.engine == "emr":
        emr = cfg.spark.emr
        assert emr is not None  # the registry requires it for engine: emr

        def describe() -> str:
            from airflow.providers.amazon.aws.hooks.emr import EmrHook

            cluster = EmrHook(aws_conn_id=emr.aws_conn_id).conn.describe_cluster(ClusterId=emr.job_flow_id)["Cluster"]
            state = cluster["Status"]["State"]
            if state not in EMR_USABLE:
                raise ConnectionError(f"EMR cluster {emr.job_flow_id} is {state}")
            return f"EMR cluster {emr.job_flow_id} ({cluster.get('Name', '')}) is {state}"

        fix = (
            f"start an EMR cluster and put its id in spark.emr.job_flow_id, or check the connection "
            f"{emr.aws_conn_id!r} (elasticmapreduce:DescribeCluster)"
        )
        return _guard(cfg, "spark", fix, describe, emr.aws_conn_id)

    if cfg.spark.engine == "spark_connect":

        def server() -> str:
            from urllib.parse import urlparse

            from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

            url = SparkConnectHook(conn_id=cfg.spark.conn_id).get_connection_url()
            where = urlparse(url.replace("sc://", "http://", 1))
            try:
                _tcp(where.hostname or "", where.port or 15002)
            except OSError as exc:
                raise ConnectionError(
                    f"Spark Connect server {where.netloc} does not accept connections: {exc}"
                ) from exc
            return f"Spark Connect server {where.netloc} accepts connections"

        fix = (
            f"start the Spark Connect server (make connect-start for the local one), or fix the host/port of the "
            f"Airflow connection {cfg.spark.conn_id!r} (conn type spark_connect, e.g. sc://HOST:15002)"
        )
        return _guard(cfg, "spark", fix, server, cfg.spark.conn_id)

    def master() -> str:
        conn = _connection(cfg.spark.conn_id)
        host = (conn.host or "").strip()
        url = f"{host}:{conn.port}" if conn.port else host
        if not url or url.startswith("local"):
            return f"master {url or 'local'} (in the worker's process)"
        if url.startswith(("spark://", "k8s://")):
            rest = url.split("://", 1)[1]
            rest = rest.split("://", 1)[-1]  # k8s://https://host:port
            hostname, _, port = rest.rstrip("/").partition(":")
            default = 7077 if url.startswith("spark://") else 443
            try:
                _tcp(hostname, int(port.split("/")[0] or default))
            except OSError as exc:
                raise ConnectionError(f"master {url} does not accept connections: {exc}") from exc
            return f"master {url} accepts connections"
        return f"master {url}: not checked from here (yarn and others are reached through the worker's config)"

    fix = (
        f"start the Spark master, or fix the host/port of the Airflow connection {cfg.spark.conn_id!r} "
        "(spark://HOST:7077, local[*], yarn, k8s://https://HOST:PORT)"
    )
    return _guard(cfg, "spark", fix, master, cfg.spark.conn_id)


def check_smtp(cfg: TableConfig) -> Check:
    if not cfg.alerts.emails:
        return Check(cfg.qualified_name, "smtp", True, "no alerts.emails: nothing to send, not checked")

    def ehlo() -> str:
        from airflow.providers.smtp.hooks.smtp import SmtpHook

        conn = _connection(cfg.alerts.smtp_conn_id)
        where = f"{conn.host}:{conn.port or 'default port'} (connection {cfg.alerts.smtp_conn_id!r})"
        try:
            # The provider's hook: the connection is made exactly as an alert's (SSL, STARTTLS, login).
            with SmtpHook(smtp_conn_id=cfg.alerts.smtp_conn_id) as hook:
                code, _ = hook._smtp_client.ehlo()
        except Exception as exc:
            raise ConnectionError(f"SMTP server {where}: {type(exc).__name__}: {exc}") from exc
        if not 200 <= code < 300:
            raise ConnectionError(f"SMTP server {where} answered EHLO with {code}")
        return f"SMTP server {where} answers EHLO ({code}); no mail sent"

    fix = (
        f"start the SMTP server or fix the Airflow connection {cfg.alerts.smtp_conn_id!r} (host, port, SSL/TLS, "
        "login); until then alerts are logged and counted, not delivered"
    )
    return _guard(cfg, "smtp", fix, ehlo, cfg.alerts.smtp_conn_id)


def check_landed(cfg: TableConfig, endpoint: MetastoreEndpoint) -> Check:
    """The pending files' footers against the registry: what ``plan`` would refuse, found before it runs."""
    from datetime import UTC, datetime

    from cdc_compaction.pipeline.pending import in_place, pending_files
    from cdc_compaction.pipeline.runtime import Runtime

    lake = Lake(cfg)
    try:
        committed = in_place(lake, lake.latest_commit())
        rt = Runtime(cfg=cfg, lake=lake, metastore=endpoint, engine=None)  # type: ignore[arg-type]
        pending = pending_files(rt, datetime.now(UTC), committed)
    except Exception as exc:  # noqa: BLE001 - the finding itself
        fix = f"check the landing area {lake.layout.incremental} is readable (see the storage check)"
        return Check(cfg.qualified_name, "landed", False, f"{type(exc).__name__}: {exc}", fix)
    refused = pending.held_back
    if refused:
        detail = "; ".join(f"{r['path']}: {r['reason']}" for r in refused[:5])
        more = f" (and {len(refused) - 5} more)" if len(refused) > 5 else ""
        return Check(
            cfg.qualified_name,
            "landed",
            False,
            f"{len(refused)} landed files would be refused: {detail}{more}",
            _landed_fix([r["reason"] for r in refused]),
        )
    detail = f"{len(pending.files)} pending files of complete increments fit the registry"
    if pending.waiting:
        detail += f"; {len(pending.waiting)} increments still landing fit it so far"
    return Check(cfg.qualified_name, "landed", True, detail)


def _landed_fix(reasons: list[str]) -> str:
    """What to do about refused landed files: a file that is no Parquet at all is re-landed or set aside
    (the registry is not at fault); one whose columns do not fit may also mean the source changed."""
    fixes = []
    if not all(is_unreadable(r) for r in reasons):
        fixes.append(
            "land corrected files in their place, or change the registry's columns if the source changed "
            f"({doc_ref('data', 'changing-a-schema')}); with on_bad_file: quarantine the run sets them aside"
        )
    if any(is_unreadable(r) for r in reasons):
        fixes.append(
            "a file that is empty or not Parquet cannot be read whatever the table's settings: re-land it as a "
            f"Parquet file ({doc_ref('data', 're-landing-increments')}), or delete it, or set on_bad_file: "
            f"quarantine so that the next run sets it aside ({doc_ref('data', 'bad-input-and-the-quarantine')})"
        )
    return "; ".join(fixes)


def preflight(cfg: TableConfig, endpoint: MetastoreEndpoint) -> dict[str, str]:
    """The DAG's ``doctor`` task: metastore and storage must answer, or the run stops before its first step.

    SMTP is checked too but never decides (alerts are a side channel): a FAIL is logged and
    counted. Spark and the landed files are left to ``compact`` and ``plan``, which check them anyway.
    """
    from cdc_compaction.core.exceptions import CompactionError

    deciding = [check_metastore(cfg, endpoint), check_storage(cfg)]
    smtp = check_smtp(cfg)
    if not smtp.ok:
        log.warning("%s; alerts are not delivered until this is fixed, the run goes on", smtp.line())
        count_failure(
            SMTP_FAILURES, cfg.qualified_name, "cdc_compaction.doctor_smtp_failed", {"table": cfg.qualified_name}
        )
    failed = [c for c in deciding if not c.ok]
    if failed:
        raise CompactionError(
            f"{cfg.qualified_name}: the doctor task found what the run needs broken, so no step ran: "
            + " | ".join(c.line().replace("\n       fix:", "; fix:") for c in failed)
        )
    return {c.name: c.detail for c in [*deciding, smtp]}


def check_table(cfg: TableConfig, endpoint: MetastoreEndpoint, *, cheap: bool = False) -> list[Check]:
    """Every check of one valid table; ``cheap``: only metastore, storage and SMTP (the DAG's doctor task)."""
    checks = [check_metastore(cfg, endpoint), check_storage(cfg), check_smtp(cfg)]
    if not cheap:
        checks += [check_spark(cfg), check_landed(cfg, endpoint)]
    return checks


class _FindingsAtDebug(logging.Filter):
    """What the probed libraries log about the very failures the checks report (thrift's "Could not
    connect", tracebacks) is debug detail: the check's FAIL line says it once, with its fix.

    A handler has passed a record by its level before its filters run, so the record cannot be
    lowered to DEBUG there: it is let through only when the root logger is at DEBUG
    (``CDC_LOG_LEVEL=DEBUG``), where it would be shown anyway.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            return True
        return record.levelno < logging.WARNING


@contextlib.contextmanager
def findings_at_debug() -> Iterator[None]:
    handlers = list(logging.getLogger().handlers)
    quiet = _FindingsAtDebug()
    for h in handlers:
        h.addFilter(quiet)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(quiet)


def run(directory: Path, tables: Iterable[str], endpoint: MetastoreEndpoint) -> list[Check]:
    """The doctor's whole verdict: the registry, then every check of every (named) valid table.

    The checks' own lines are the report: what the probed services' clients log meanwhile is
    kept for ``CDC_LOG_LEVEL=DEBUG`` (:class:`_FindingsAtDebug`).
    """
    with findings_at_debug():
        checks, cfgs = check_registry(directory, tables)
        for cfg in cfgs:
            checks += check_table(cfg, endpoint)
    return checks
