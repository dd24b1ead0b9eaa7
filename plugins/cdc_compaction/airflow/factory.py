"""Build one Airflow DAG per registry table.

Nothing here touches the network, the metastore, Spark or Airflow Variables at parse
time: the heavy modules are imported inside the task callables.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import hashlib
import itertools
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.python import PythonOperator, ShortCircuitOperator
from airflow.sdk import DAG, Asset

from cdc_compaction.core import settings
from cdc_compaction.core.docs import doc_ref
from cdc_compaction.core.exceptions import CompactionError, RegistryError
from cdc_compaction.core.registry import RegistryEntry, TableConfig
from cdc_compaction.integrations.notifications import AlertChannels, CdcAlertNotifier
from cdc_compaction.job.contract import PERMANENT_EXIT_CODE, PermanentErrorRecord, permanent_error_path
from cdc_compaction.pipeline import order

log = logging.getLogger(__name__)

PLAN_XCOM = "{{ ti.xcom_pull(task_ids='plan') }}"
#: Stands in for the plan path as the last argument of the EMR step until the task runs
#: (see ``RegistryEmrAddStepsOperator``): the step itself is registry data and is not templated.
PLAN_PLACEHOLDER = "__cdc_compaction_plan_path__"
#: Stands in for the job package's S3 URI after ``--py-files`` in the EMR step until the task runs,
#: when ``spark.emr.py_files`` is not set: the URI names the zip of this deployment's job source
#: (see ``engine.emr_job_package_uri``), which must not be read while the DAG file is parsed.
PY_FILES_PLACEHOLDER = "__cdc_compaction_job_package__"


# Registry values are data, never templates. Airflow renders every ``template_fields`` attribute
# with Jinja when a task runs, so a registry value such as ``spark.conf: {x: "{{ 7*7 }}"}`` would
# become ``49``, and ``{{ conn.smtp_default.password }}`` would put a secret into a Spark conf or
# an alert address. The operators below template only what this module writes itself: the plan
# path pulled from XCom and the EMR step id. ``template_ext`` is emptied too: a templated value
# ending in ``.json`` or ``.sql`` would otherwise be read as a template file from disk.
class RegistrySparkSubmitOperator(SparkSubmitOperator):
    """spark-submit whose only templated field is ``application_args`` (``--plan`` and the plan-path XCom).

    A job that ends with an error no retry can heal (a stale plan: the job's ``PermanentJobError``)
    fails the task at once instead of going through the retries.  The job package (``--py-files``)
    is built when the task runs, not when the DAG file is parsed.
    """

    template_fields: Sequence[str] = ("application_args",)
    template_ext: Sequence[str] = ()

    def __init__(
        self, *, storage_conn_id: str = "aws_default", table: str = "", cfg: TableConfig | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.storage_conn_id = storage_conn_id
        self.table = table
        #: The registry entry: a lake on S3 gets S3A (jars, endpoint, credentials) when the task runs.
        self.cfg = cfg

    def _get_hook(self) -> Any:
        # Every path that builds the hook goes through here: execute, the provider's resumable
        # backends (YARN, Kubernetes), and whoever asks for the task's exact command line.
        from cdc_compaction.integrations.engine import job_package, mask_submit_logs, s3a_submit

        self.py_files = job_package()
        env: dict[str, str] = {}
        if self.cfg is not None:
            # Read from the storage connection when the task runs, never while the DAG file is parsed.
            conf, jars, env = s3a_submit(self.cfg)
            if conf:
                # The registry's own conf (already in self.conf) wins.
                self.conf = {**conf, **(self.conf or {})}
                self.jars = ",".join([*jars, *(j for j in (self.jars or "").split(",") if j)])
        hook = super()._get_hook()
        # The credentials go into the spark-submit process's environment, where the driver (local or
        # client mode) reads them. On YARN or Kubernetes the provider would turn environment variables
        # into --conf arguments, and standalone cluster mode refuses them: a cluster's own role is used.
        if env and not (hook._is_yarn or hook._is_kubernetes or hook._connection.get("deploy_mode") == "cluster"):
            hook._env_vars = {**env, **(hook._env_vars or {})}
        return mask_submit_logs(hook)

    def execute(self, context: Any) -> Any:
        skip_unless_compacting(plan_arg(self.application_args), self.storage_conn_id)
        try:
            return super().execute(context)
        except Exception as exc:
            sub = getattr(self._hook, "_submit_sp", None)  # the hook's spark-submit process, if it ran
            problem = permanent_job_error(
                plan_arg(self.application_args), self.storage_conn_id, getattr(sub, "returncode", None)
            )
            if problem is None:
                raise
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(problem) from exc

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The planned increments in, the new version out (:func:`.lineage.compact_lineage`)."""
        return _compact_lineage(plan_arg(self.application_args), self.storage_conn_id, self.table or self.task_id)


def _compact_lineage(plan_path: str | None, storage_conn_id: str, table: str) -> Any:
    """The compact task's OpenLineage facets (never raises), asked by the provider only when it is on."""
    from cdc_compaction.integrations.lineage import compact_lineage_of

    return compact_lineage_of(plan_path, storage_conn_id, table)


class CompactPythonOperator(PythonOperator):
    """The ``compact`` task of ``spark.engine: spark_connect``, with its OpenLineage facets (plan in, version out)."""

    def __init__(self, *, table: str, storage_conn_id: str = "aws_default", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.table = table
        self.storage_conn_id = storage_conn_id

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        plan_path = (self.op_kwargs or {}).get("plan_path")
        return _compact_lineage(str(plan_path) if plan_path else None, self.storage_conn_id, self.table)


def plan_arg(args: Sequence[Any] | None) -> str | None:
    """The plan path of the job's arguments (the value after ``--plan``)."""
    args = list(args or [])
    if "--plan" in args and args.index("--plan") + 1 < len(args):
        return str(args[args.index("--plan") + 1])
    return None


def skip_unless_compacting(plan_path: str | None, storage_conn_id: str) -> None:
    """Skip the task (AirflowSkipException) if the plan decided not to compact (``compaction.policy``).

    A plan that cannot be read here is left to the job, which does nothing on such a plan either.
    """
    if not plan_path:
        return
    from cdc_compaction.core.policy import deferred
    from cdc_compaction.core.storage import storage_for

    try:
        why = deferred(json.loads(storage_for(plan_path, storage_conn_id).read_text(plan_path)))
    except Exception:  # the job reads the plan itself and skips the same way
        log.warning("could not read the plan %s to tell whether it compacts; the job decides", plan_path, exc_info=True)
        return
    if why is not None:
        from airflow.sdk.exceptions import AirflowSkipException

        raise AirflowSkipException(why)


def skip_if_skipped(result: Any) -> Any:
    """``result`` of a step, or AirflowSkipException if the step skipped (its plan does not compact)."""
    if isinstance(result, dict) and "skipped" in result:
        from airflow.sdk.exceptions import AirflowSkipException

        raise AirflowSkipException(str(result["skipped"]))
    return result


#: The DAG run param that compacts regardless of ``compaction.policy`` (README, "Compaction policy").
COMPACT_PARAM = "compact"


def forced(params: Any) -> bool:
    """Whether the run's params ask to compact regardless of the thresholds (``compact: force``).

    Read as data (never rendered); any other value, or none, leaves the decision to the policy.
    """
    return isinstance(params, Mapping) and params.get(COMPACT_PARAM) == "force"


def permanent_job_error(plan_path: str | None, storage_conn_id: str, returncode: int | None = None) -> str | None:
    """Why the failed compaction of ``plan_path`` can never succeed, or None if a retry may heal it.

    Told by the job's exit status where it reaches Airflow (spark-submit in client mode), else
    by the error file the job wrote beside the plan (EMR steps, YARN or Kubernetes cluster mode).
    """
    recorded = None
    if plan_path:
        from cdc_compaction.core.storage import storage_for

        path = permanent_error_path(plan_path)
        try:
            storage = storage_for(path, storage_conn_id)
            if storage.exists(path):
                record = PermanentErrorRecord.from_dict(json.loads(storage.read_text(path)))
                recorded = str(record.error or "(no message)")
        except Exception:  # cannot tell: leave the failure to the retries
            log.warning("could not read %s to tell whether the compaction can succeed", path, exc_info=True)
    if recorded is not None:
        return f"the compaction job failed permanently (retrying cannot help): {recorded}"
    if returncode == PERMANENT_EXIT_CODE:
        return (
            f"the compaction job exited with {PERMANENT_EXIT_CODE}: an error retrying cannot help (see the "
            "job's log above, e.g. a stale plan); clear the run's plan task to plan again"
        )
    return None


# The EMR classes are built on first use, not at import: the amazon provider imports boto3, which
# parsing the DAG file must not load (see test_dag_file_parses_without_heavy_imports). Cached, so
# that every table's DAG shares one class.
@functools.cache
def _emr_add_steps_operator() -> type:
    from airflow.providers.amazon.aws.operators.emr import EmrAddStepsOperator

    class RegistryEmrAddStepsOperator(EmrAddStepsOperator):
        """Adds the compaction step; only ``plan_path`` is templated, and it fills the step's last argument.

        Without ``spark.emr.py_files`` the step's ``--py-files`` is filled in when the task runs, too:
        the job package of this deployment's source, beside ``spark.emr.application``.
        """

        template_fields: Sequence[str] = ("plan_path",)
        template_ext: Sequence[str] = ()

        def __init__(
            self, *, plan_path: str, storage_conn_id: str = "aws_default", table: str = "", **kwargs: Any
        ) -> None:
            super().__init__(**kwargs)
            self.plan_path = plan_path
            self.storage_conn_id = storage_conn_id
            self.table = table

        def steps_with_plan(self) -> list[dict[str, Any]]:
            """The steps as submitted: the (rendered) plan path after ``--plan``, the job package's URI
            after ``--py-files``, every other value as written."""
            from cdc_compaction.integrations.engine import check_emr_job_package, emr_job_package_uri

            steps = copy.deepcopy(self.steps)
            filled = 0
            for step in steps:
                args = step["HadoopJarStep"]["Args"]
                # By position, not by search: a registry value that happens to equal a
                # placeholder elsewhere in the step is data and stays as it is.
                if args[-2:] == ["--plan", PLAN_PLACEHOLDER] and args[-5] == "--py-files":
                    args[-1] = self.plan_path
                    if args[-4] == PY_FILES_PLACEHOLDER:
                        args[-4] = emr_job_package_uri(args[-3])
                    else:
                        check_emr_job_package(args[-4])
                    filled += 1
            if filled != 1:
                raise CompactionError(
                    f"{self.task_id}: expected one step ending in "
                    f"--py-files <zip> <application> --plan {PLAN_PLACEHOLDER}"
                )
            return steps

        def execute(self, context: Any) -> Any:
            skip_unless_compacting(self.plan_path, self.storage_conn_id)
            self.steps = self.steps_with_plan()
            return super().execute(context)

    return RegistryEmrAddStepsOperator


@functools.cache
def _emr_step_sensor() -> type:
    from airflow.providers.amazon.aws.sensors.emr import EmrStepSensor

    class RegistryEmrStepSensor(EmrStepSensor):
        """Waits for the step; only ``step_id`` and ``plan_path`` (XCom pulls written here) are templated.

        A step that failed with an error no retry can heal (the job wrote it beside the plan:
        EMR does not report the job's exit status) fails the task at once.
        """

        template_fields: Sequence[str] = ("step_id", "plan_path")
        template_ext: Sequence[str] = ()

        def __init__(
            self, *, plan_path: str, storage_conn_id: str = "aws_default", table: str = "", **kwargs: Any
        ) -> None:
            super().__init__(**kwargs)
            self.plan_path = plan_path
            self.storage_conn_id = storage_conn_id
            self.table = table

        def poke(self, context: Any) -> bool:
            try:
                return super().poke(context)
            except Exception as exc:
                problem = permanent_job_error(self.plan_path, self.storage_conn_id)
                if problem is None:
                    raise
                from airflow.sdk.exceptions import AirflowFailException

                raise AirflowFailException(problem) from exc

        def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
            """The planned increments in, the new version out (:func:`.lineage.compact_lineage`)."""
            return _compact_lineage(self.plan_path, self.storage_conn_id, self.table or self.task_id)

    return RegistryEmrStepSensor


class LineagePythonOperator(PythonOperator):
    """A step that reports OpenLineage facets of its result (``publish``: the increments into the table).

    The OpenLineage provider asks :meth:`get_openlineage_facets_on_complete` after the task
    succeeded. The facets are built here, in the task's own process right after the step, and
    only when the provider is on (a transport is configured; README, "Lineage (OpenLineage)"):
    the provider calls the method in a forked child, which should not look up connections.
    ``lineage_builder`` never raises (``cdc_compaction.integrations.lineage``), so lineage never fails the task.
    """

    def __init__(self, *, lineage_builder: Callable[[Any], Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lineage_builder = lineage_builder
        self.lineage_facets: Any = None

    def execute(self, context: Any) -> Any:
        result = super().execute(context)
        if _openlineage_enabled():
            try:
                self.lineage_facets = self.lineage_builder(result)
            except Exception:  # the builder logs and counts its own failures; this is the last guard
                log.exception("%s: the OpenLineage facets could not be built; the task goes on", self.task_id)
        return result

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        return self.lineage_facets


def _openlineage_enabled() -> bool:
    """Whether the OpenLineage provider sends events here (installed, and a transport configured)."""
    try:
        from airflow.providers.openlineage import conf

        return not conf.is_disabled()
    except Exception:  # no provider, or its settings unreadable: no lineage, the task goes on
        log.warning("cannot tell whether OpenLineage is on; no lineage facets are built", exc_info=True)
        return False


def _publish_lineage(cfg: TableConfig, result: Any) -> Any:
    """The OpenLineage facets of a ``publish`` that returned ``result`` (empty when they cannot be built)."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    from cdc_compaction.integrations.lineage import count_failure, publish_lineage

    try:
        rt = _runtime(cfg)
    except Exception:
        log.exception("%s: no runtime to build the OpenLineage facets; the run goes on", cfg.qualified_name)
        count_failure(cfg.qualified_name)
        return OperatorLineage()
    return publish_lineage(rt, result)


def base_asset(cfg: TableConfig) -> Asset:
    """The asset downstream DAGs can be scheduled on: the table's compacted base."""
    from cdc_compaction.core.sql import table_names

    return Asset(
        name=f"{cfg.database}.{table_names(cfg)['base_table']}",
        # An "x-" scheme: Airflow then skips loading every provider's URI handlers (boto3 & co.) at parse time.
        uri=f"x-hive://metastore/{cfg.database}/{table_names(cfg)['base_table']}",
        group="cdc_compaction",
        extra={"registry_table": cfg.qualified_name},
    )


def human_duration(d: timedelta) -> str:
    """``7 days``, ``1 day 12 hours``, ``90 minutes`` -> ``1 hour 30 minutes``: for people, not ``7 days, 0:00:00``."""
    seconds = int(d.total_seconds())
    if seconds <= 0:
        return "0 seconds"
    parts = []
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        n, seconds = divmod(seconds, size)
        if n:
            parts.append(f"{n} {unit}{'s' if n != 1 else ''}")
    return " ".join(parts)


def doc_md(cfg: TableConfig) -> str:
    """The DAG's documentation, generated from its registry entry."""
    from cdc_compaction.core.lake import Layout
    from cdc_compaction.core.mode import mode_of
    from cdc_compaction.core.sql import table_names

    lay = Layout.for_table(cfg)
    names = {k: f"`{cfg.database}.{v}`" for k, v in table_names(cfg).items()}
    mode = mode_of(cfg)
    roles = mode.column_roles(cfg)
    rows = [f"| `{c.name}` | `{c.type}` | {', '.join(roles.get(c.name, []))} | {c.comment} |" for c in cfg.columns]
    lines = [
        f"### CDC compaction of `{cfg.qualified_name}`",
        "",
        cfg.description,
        "",
        "| column | type | role | comment |",
        "|---|---|---|---|",
        *rows,
        "",
        *mode.doc_lines(cfg),
        f"* **Tables:** {names['base_table']}, {names['tombstones_table']} (deleted keys, kept for "
        f"{human_duration(cfg.tombstone_retention)}), {names['incremental_table']}, {names['compactor_table']}",
        f"* **Views:** {names['view_name']} (current state), {names['rejects_view']} (refused pending events)",
        f"* **Landing area:** `{lay.incremental}/{cfg.increments.prefix}<{cfg.increments.time_format}>/`",
        f"* **Base versions:** `{lay.base}`; live version named in `{lay.pointer}`",
        f"* **Archive:** `{lay.archive}`; **quarantine:** `{lay.quarantine}`",
        f"* **Tombstones kept for:** {human_duration(cfg.tombstone_retention)}; **versions kept:** {cfg.keep_versions}",
        "",
        "Every task is idempotent: after fixing a failure, clear the failed task.",
    ]
    return "\n".join(lines) + "\n"


def fail_fast(step: Callable[..., Any]) -> Callable[..., Any]:
    """Run a task callable; an error no retry can heal fails the task at once (no retries, no backoff).

    The owner is alerted now instead of after the whole retry schedule; transient errors
    (storage, metastore, Spark) still go through Airflow's retries.
    """

    @functools.wraps(step)
    def run(*args: Any, **kwargs: Any) -> Any:
        from cdc_compaction.core.exceptions import is_permanent

        try:
            return step(*args, **kwargs)
        except Exception as exc:
            if not is_permanent(exc):
                raise
            from airflow.sdk.exceptions import AirflowFailException

            from cdc_compaction.integrations.notifications import error_text

            raise AirflowFailException(error_text(exc)) from exc

    return run


def skip_if_disabled(cfg: TableConfig, step: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``step`` only for an enabled table; for ``enabled: false`` skip the task instead.

    An unscheduled, paused DAG can still be triggered by hand, by a backfill, or have a run
    queued from before the edit: each of its tasks then skips (and so do the ones downstream)
    rather than touching the table.
    """
    if cfg.enabled:
        return step

    @functools.wraps(step)
    def skip(*args: Any, **kwargs: Any) -> Any:
        from airflow.sdk.exceptions import AirflowSkipException

        raise AirflowSkipException(
            f"{cfg.qualified_name} is disabled in the registry (enabled: false); set enabled: true to compact it"
        )

    return skip


def _runtime(cfg: TableConfig) -> Any:
    """Build the task runtime from Airflow connections (called inside tasks only)."""
    from airflow.sdk import BaseHook

    from cdc_compaction.core.lake import Lake
    from cdc_compaction.core.settings import MetastoreEndpoint
    from cdc_compaction.integrations.engine import SparkSubmitEngine
    from cdc_compaction.pipeline.runtime import Runtime

    conn = BaseHook.get_connection(settings.METASTORE_CONN_ID)
    endpoint = MetastoreEndpoint.from_connection(conn)
    warehouse = (conn.extra_dejson or {}).get("warehouse_dir") or str(settings.PROJECT_ROOT / ".lake" / "warehouse")
    engine: Any = connect_engine(cfg) if cfg.spark.engine == "spark_connect" else SparkSubmitEngine(endpoint, warehouse)
    return Runtime(cfg=cfg, lake=Lake(cfg), metastore=endpoint, engine=engine)


def connect_engine(cfg: TableConfig) -> Any:
    """The Spark Connect engine of ``cfg``: the server's URL from the ``spark.conn_id`` connection (type spark_connect).

    Its DDL (ensure_tables) and its compaction run in that server, whose own configuration
    names the metastore and warehouse.
    """
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    from cdc_compaction.integrations.engine import ConnectEngine

    try:
        url = SparkConnectHook(conn_id=cfg.spark.conn_id).get_connection_url()
    except Exception as exc:
        from cdc_compaction.core.exceptions import AirflowSetupError

        raise AirflowSetupError(
            f"{cfg.qualified_name}: spark.engine is spark_connect but the Airflow connection {cfg.spark.conn_id!r} "
            f"(registry spark.conn_id) cannot be read as one ({exc}); create it with conn type spark_connect, "
            "host and port of the server (e.g. sc://127.0.0.1:15002; make connect-start runs a local one)"
        ) from exc
    return ConnectEngine(url, cfg)


def connect_compact_step(cfg: TableConfig) -> Callable[..., Any]:
    """The compact task's callable for ``spark_connect``: the job in this process, against the server.

    A stale plan (the job's ``PermanentJobError``) fails the task at once, as spark-submit's
    ``PERMANENT_EXIT_CODE`` does; a lost server (gRPC UNAVAILABLE) is left to the retries.
    """

    def compact_step(plan_path: str) -> dict[str, Any]:
        stats = order.step(order.COMPACT).function()(_runtime(cfg), plan_path)
        # The output file list can be long: the XCom keeps the counts (validate reads the stats file).
        return {k: v for k, v in stats.items() if k != "output_files"}

    return fail_fast(compact_step)


def _compact_tasks(cfg: TableConfig) -> tuple[Any, Any]:
    """The compaction as (first task, last task): one spark-submit, or an EMR step and its sensor."""
    from cdc_compaction.integrations.engine import compaction_conf

    if cfg.spark.engine == "emr":
        from cdc_compaction.integrations.engine import emr_steps

        emr = cfg.spark.emr
        assert emr is not None  # the registry requires it for engine: emr
        compact_submit = _emr_add_steps_operator()(
            task_id="compact_submit",
            job_flow_id=emr.job_flow_id,
            aws_conn_id=emr.aws_conn_id,
            # The plan path, and the job package's URI unless the registry names it, are filled in at run time.
            steps=emr_steps(cfg, PLAN_PLACEHOLDER, py_files=emr.py_files or PY_FILES_PLACEHOLDER),
            plan_path=PLAN_XCOM,
            storage_conn_id=cfg.storage_conn_id,
            doc_md="Add the compaction as an EMR step (spark-submit through command-runner.jar).",
        )
        compact = _emr_step_sensor()(
            task_id="compact",
            job_flow_id=emr.job_flow_id,
            step_id="{{ ti.xcom_pull(task_ids='compact_submit')[0] }}",
            plan_path=PLAN_XCOM,
            storage_conn_id=cfg.storage_conn_id,
            table=cfg.qualified_name,
            aws_conn_id=emr.aws_conn_id,
            mode="reschedule",
            doc_md="Wait for the EMR step; a failed step fails this task (the version is not published).",
        )
        compact_submit >> compact
        return compact_submit, compact
    if cfg.spark.engine == "spark_connect":
        # op_kwargs is templated: it holds only the plan-path XCom written here (registry values stay data).
        compact = CompactPythonOperator(
            task_id="compact",
            table=cfg.qualified_name,
            storage_conn_id=cfg.storage_conn_id,
            python_callable=skip_if_disabled(cfg, connect_compact_step(cfg)),
            op_kwargs={"plan_path": PLAN_XCOM},
            doc_md="Run the compaction job in this task against the Spark Connect server (registry spark.conn_id): "
            "a fresh server session; writes a new version directory.",
        )
        return compact, compact
    compact = RegistrySparkSubmitOperator(
        task_id="compact",
        application=str(settings.SPARK_JOBS_DIR / "compact.py"),
        application_args=["--plan", PLAN_XCOM],
        storage_conn_id=cfg.storage_conn_id,
        table=cfg.qualified_name,
        cfg=cfg,
        conn_id=cfg.spark.conn_id,
        conf=compaction_conf(cfg),
        jars=",".join(cfg.spark.jars) or None,
        name=f"cdc-compact-{cfg.qualified_name}",
        driver_memory=cfg.spark.driver_memory,
        executor_memory=cfg.spark.executor_memory,
        doc_md="Run the compaction job (`include/spark_jobs/compact.py`, the job package as `--py-files`) on the "
        "planned files; writes a new version directory.",
    )
    return compact, compact


def _compact_param() -> Any:
    from airflow.sdk import Param

    return Param(
        "auto",
        type="string",
        enum=["auto", "force"],
        title="Compact",
        description="auto: compaction.policy decides; force: compact whatever is pending now",
    )


def build_dag(cfg: TableConfig) -> DAG:
    """The compaction DAG of one table."""
    channels = AlertChannels.of(cfg.alerts)
    notifier = CdcAlertNotifier(
        table=cfg.qualified_name, emails=cfg.alerts.emails, smtp_conn_id=cfg.alerts.smtp_conn_id, channels=channels
    )
    default_args = {
        "owner": cfg.owner,
        "retries": cfg.retries,
        "retry_delay": cfg.retry_delay,
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": cfg.max_retry_delay,
        "on_failure_callback": [notifier],
    }
    # enabled: false -> no schedule (idle whatever the pause flag says: is_paused_upon_creation only
    # acts when Airflow first sees the DAG, so a DAG unpaused before the edit would keep running),
    # paused on creation, and every task skips (skip_if_disabled) for runs started by hand.
    disabled = () if cfg.enabled else ("disabled",)
    with DAG(
        dag_id=cfg.dag_id,
        description=f"CDC compaction of {cfg.qualified_name}" + ("" if cfg.enabled else " (disabled in the registry)"),
        # A retired table (its source was dropped) runs no more on its own; its data stays readable.
        schedule=cfg.schedule if cfg.enabled and not cfg.retired else None,
        start_date=cfg.start_date,
        catchup=cfg.catchup,
        max_active_runs=1,
        default_args=default_args,
        is_paused_upon_creation=True if not cfg.enabled or cfg.retired else None,
        tags=sorted(
            {"cdc", f"database:{cfg.database}", f"table:{cfg.table}", f"owner:{cfg.owner}", *cfg.tags, *disabled}
            | ({"retired"} if cfg.retired else set())
        ),
        doc_md=doc_md(cfg),
        render_template_as_native_obj=False,
    ) as dag:
        # Plain operators, not @task: the decorator's signature binding and XComArg wiring cost
        # about a third of a 500-table parse. The steps, their order, task ids and docs come from
        # pipeline.order; written here is only what Airflow adds to a step: the run id for plan,
        # the alerts, and that every task after plan reads the plan path through the same XCom
        # template as the compaction (and is made a direct downstream of plan below).
        def ensure_tables_step() -> dict[str, Any]:
            return order.step("ensure_tables").function()(_runtime(cfg))

        def plan_step(**context: Any) -> str:
            from cdc_compaction.integrations.notifications import (
                alert_ignored_landing,
                alert_quarantined_files,
                alert_schema_changes,
                alert_stalled_increments,
            )

            def quarantined(files: list[dict[str, Any]]) -> None:
                alert_quarantined_files(cfg.qualified_name, cfg.alerts.emails, cfg.alerts.smtp_conn_id, files, channels)

            def ignored(entries: list[dict[str, Any]]) -> None:
                alert_ignored_landing(cfg.qualified_name, cfg.alerts.emails, cfg.alerts.smtp_conn_id, entries, channels)

            def stalled(increments: list[dict[str, Any]]) -> None:
                alert_stalled_increments(
                    cfg.qualified_name, cfg.alerts.emails, cfg.alerts.smtp_conn_id, increments, channels
                )

            def schema_changed(changes: list[dict[str, Any]]) -> None:
                alert_schema_changes(cfg.qualified_name, cfg.alerts.emails, cfg.alerts.smtp_conn_id, changes, channels)

            return order.step(order.PLAN).function()(
                _runtime(cfg),
                run_id=context["run_id"],
                on_quarantined=quarantined,
                on_ignored=ignored,
                on_stalled=stalled,
                on_schema_changed=schema_changed,
                force=forced(context.get("params")),
            )

        def validate_step(plan_path: str) -> dict[str, Any]:
            from cdc_compaction.integrations.notifications import alert_rejected_rows

            rt = _runtime(cfg)
            stats = skip_if_skipped(order.step("validate").function()(rt, plan_path))
            if cfg.alerts.on_rejected_rows:
                alert_rejected_rows(
                    cfg.qualified_name,
                    cfg.alerts.emails,
                    cfg.alerts.smtp_conn_id,
                    stats,
                    stats["quarantine_location"],
                    channels,
                )
            return stats

        def publish_step(plan_path: str, outlet_events: Any = None) -> dict[str, Any]:
            from cdc_compaction.pipeline.publish import asset_event_extra

            published = skip_if_skipped(order.step("publish").function()(_runtime(cfg), plan_path))
            # Airflow passes the task's outlet events by parameter name; what is set here becomes the
            # extra of the base asset's event, which downstream DAGs scheduled on it can read.
            if outlet_events is not None:
                outlet_events[base_asset(cfg)].extra = asset_event_extra(cfg.qualified_name, published)
            return published

        def archive_step(plan_path: str) -> dict[str, Any]:
            return skip_if_skipped(order.step("archive").function()(_runtime(cfg), plan_path))

        def refresh_view_step(plan_path: str) -> dict[str, Any]:
            return order.step("refresh_view").function()(_runtime(cfg))

        callables: dict[str, Callable[..., Any]] = {
            "ensure_tables": ensure_tables_step,
            order.PLAN: plan_step,
            "validate": validate_step,
            "publish": publish_step,
            "archive": archive_step,
            "refresh_view": refresh_view_step,
        }
        extra: dict[str, dict[str, Any]] = {
            "publish": {"outlets": [base_asset(cfg)], "lineage_builder": functools.partial(_publish_lineage, cfg)}
        }
        after_plan = [s.id for s in order.after(order.PLAN)]
        made: dict[str, tuple[Any, Any]] = {}  # step id -> its (first, last) task
        for step in order.ORDER:
            if step.id == order.COMPACT:
                made[step.id] = _compact_tasks(cfg)
                continue
            if step.id == order.PLAN:
                # Runs of one table are serialized here, not only by max_active_runs (a backfill has
                # its own max_active_runs): plan waits until the previous run's plan and every task
                # downstream of it (compact ... refresh_view) succeeded or were skipped.
                task: Any = ShortCircuitOperator(
                    task_id=step.id,
                    python_callable=skip_if_disabled(cfg, fail_fast(callables[step.id])),
                    depends_on_past=True,
                    wait_for_downstream=True,
                    doc_md=step.doc,
                )
            else:
                # op_kwargs (and op_args) are templated: they hold only the plan-path XCom written here.
                # Registry values reach the steps through ``cfg`` in their closures, never as templates.
                task = (LineagePythonOperator if "lineage_builder" in extra.get(step.id, {}) else PythonOperator)(
                    task_id=step.id,
                    # A plan that does not compact (compaction.policy) skips compact ... archive; the views
                    # still show its increments. An empty plan skips every task after plan (ShortCircuit).
                    trigger_rule="none_failed" if step.id == VIEW_STEP else "all_success",
                    python_callable=skip_if_disabled(cfg, fail_fast(callables[step.id])),
                    op_kwargs={"plan_path": PLAN_XCOM} if step.id in after_plan else None,
                    doc_md=step.doc,
                    **extra.get(step.id, {}),
                )
            made[step.id] = (task, task)
        for (_, last), (first, _) in itertools.pairwise(made.values()):
            last >> first
        if cfg.doctor:
            # Not a step of pipeline.order: a check before the first step, which changes nothing in the table.
            def doctor_step() -> dict[str, str]:
                from cdc_compaction.operations.doctor import preflight

                return preflight(cfg, _runtime(cfg).metastore)

            doctor = PythonOperator(
                task_id=DOCTOR_TASK_ID,
                python_callable=skip_if_disabled(cfg, doctor_step),
                doc_md="Registry `doctor: true`: the metastore answers and the storage root takes a probe "
                "write/read/delete, else the run stops here (SMTP is only logged). "
                f"See {doc_ref('operations', 'doctor')}.",
            )
            doctor >> made[order.ORDER[0].id][0]
        # Every later task is a direct downstream of plan (see plan's comment above).
        made[order.PLAN][1] >> [made[s][1] for s in after_plan]
    # Read by the plan task from the context (never rendered): force compacts whatever the policy says.
    # Set on the built DAG, not passed to DAG(): Airflow deep-copies a DAG's params into every
    # operator it builds (three times each, once per class of its hierarchy) and validates them
    # against their JSON schema when the DAG is made, which cost a quarter of a 500-table parse.
    # A run sees the same params: a task's context merges the DAG's params with its own and the
    # run's conf (airflow.sdk.definitions.param.process_params), and the trigger form shows the
    # DAG's. tests/airflow/test_factory.py checks the param's default against its schema once.
    dag.params[COMPACT_PARAM] = _compact_param()
    return dag


#: The last step: it runs after a plan that does not compact too (its upstream steps skipped).
VIEW_STEP = "refresh_view"

#: The optional first task of a table's DAG (registry ``doctor: true``).
DOCTOR_TASK_ID = "doctor"

#: Start date of a registry-error DAG (it has no schedule; a fixed date keeps its serialization stable).
ERROR_DAG_START = datetime(2026, 1, 1, tzinfo=UTC)
ERROR_TASK_ID = "registry_error"


def error_doc_md(entry: RegistryEntry) -> str:
    """The documentation of a registry-error DAG: the error itself, field by field."""
    err = entry.error
    # Each problem led by its file:line:column where it has one.
    problems = err.lines() if err is not None else ["(unknown error)"]
    table = err.table if err is not None and err.table else "(unknown: the file could not be read as an entry)"
    lines = [
        f"### Registry error in `{entry.path.name}`",
        "",
        f"* **File:** `{entry.path}`",
        f"* **Table:** `{table}`",
        "",
        "This table is not compacted until its registry file is fixed; every other table is unaffected.",
        "",
        "**Problems:**",
        "",
        # Fenced: a problem quotes the author's values, which must not render as markdown.
        "```",
        *problems,
        "```",
    ]
    return "\n".join(lines) + "\n"


def broken_dag(entry: RegistryEntry) -> DAG:
    """A valid, unscheduled DAG that stands in for a table whose registry file is invalid.

    It must load cleanly: a DAG file that raises (or whose DAG fails validation) is an import
    error, and Airflow then marks every DAG of that file stale, i.e. every table. Instead this
    DAG keeps the table's DAG id, shows the error in its docs and fails its only task at once.
    """
    from airflow.sdk.exceptions import AirflowFailException

    err = entry.error or RegistryError(str(entry.path), None, ["(unknown error)"])
    message = str(err)
    log.error("%s: DAG %s only reports this error until the file is fixed", message, entry.dag_id)

    def fail() -> None:
        """Fail with the registry error (never retried: only fixing the file helps)."""
        raise AirflowFailException(message)

    with DAG(
        dag_id=entry.dag_id,
        description=f"Registry error in {entry.path.name}"[:1000],
        schedule=None,
        start_date=ERROR_DAG_START,
        catchup=False,
        max_active_runs=1,
        tags=["cdc", "registry-error"],
        doc_md=error_doc_md(entry),
    ) as dag:
        PythonOperator(task_id=ERROR_TASK_ID, python_callable=fail, retries=0, doc_md=fail.__doc__)
    return dag


def build_view_refresher(cfgs: Sequence[TableConfig]) -> DAG:
    """The DAG that keeps every table's views fresh between compactions.

    Every few minutes (``$CDC_VIEW_REFRESH_SCHEDULE``) one task per database registers newly
    landed increments of its tables, rewrites their DuckDB views and records freshness
    (:func:`cdc_compaction.pipeline.views.refresh_pending`): metastore calls only, no Spark.  A table
    that fails is logged and named in the task's error after every other table of the
    database was refreshed; one table's trouble never stops another.
    """
    by_db: dict[str, list[TableConfig]] = {}
    for cfg in sorted(cfgs, key=lambda c: c.qualified_name):
        by_db.setdefault(cfg.database, []).append(cfg)
    with DAG(
        dag_id=settings.VIEW_REFRESH_DAG_ID,
        description="Shows newly landed increments in every table's views between compactions",
        schedule=settings.view_refresh_schedule(),
        start_date=ERROR_DAG_START,
        catchup=False,
        max_active_runs=1,
        default_args={"retries": 0, "owner": "cdc"},
        tags=["cdc", "views"],
        doc_md=build_view_refresher.__doc__,
    ) as dag:
        for db, tables in by_db.items():

            def refresh(tables: list[TableConfig] = tables) -> dict[str, Any]:
                """Register new increments, rewrite DuckDB views, record freshness: for each table of the database."""
                from cdc_compaction.pipeline.views import refresh_pending

                results: dict[str, Any] = {}
                failed: list[str] = []
                for cfg in tables:
                    try:
                        results[cfg.qualified_name] = refresh_pending(_runtime(cfg))
                    except Exception as exc:
                        log.exception("%s: the view refresh failed; the other tables go on", cfg.qualified_name)
                        failed.append(f"{cfg.qualified_name}: {type(exc).__name__}: {exc}")
                if failed:
                    raise CompactionError(
                        f"view refresh failed for {len(failed)} of {len(tables)} tables (the others were refreshed): "
                        + "; ".join(failed)
                    )
                return results

            PythonOperator(task_id=f"refresh__{db}", python_callable=refresh, doc_md=refresh.__doc__)
    return dag


ERASE_VALIDATE_TASK_ID = "validate_predicate"
ERASE_TASK_ID = "erase"


def _erase_request(by_name: dict[str, TableConfig], params: Any) -> tuple[TableConfig, str, str]:
    """The (table, predicate, actor) an erase run was triggered with; fail at once if one is unusable.

    The values are used as given: never rendered, never interpolated into anything but messages.
    """
    from airflow.sdk.exceptions import AirflowFailException

    params = params or {}
    table, where, actor = params.get("table"), params.get("where"), params.get("actor")
    cfg = by_name.get(table) if isinstance(table, str) else None
    if cfg is None:
        raise AirflowFailException(
            f"{settings.ERASE_DAG_ID}: param 'table' is {table!r}, not a table of the registry "
            f"({', '.join(sorted(by_name))}); trigger the DAG again choosing one of them"
        )
    if not isinstance(where, str) or not where.strip():
        raise AirflowFailException(
            f"{cfg.qualified_name}: param 'where' is {where!r}, not a predicate; trigger again with a boolean "
            "expression over the registry columns (to erase a whole table, delete it)"
        )
    if not isinstance(actor, str) or not actor.strip():
        raise AirflowFailException(
            f"{cfg.qualified_name}: param 'actor' is {actor!r}; trigger again naming who asked for the erase "
            "(it goes into the audit record)"
        )
    return cfg, where, actor.strip()


def erase_failure_alert(by_name: dict[str, TableConfig]) -> Callable[[dict[str, Any]], None]:
    """The erase DAG's failure callback: alert the owners of the table the run names (its registry ``alerts:``).

    One DAG serves every table, so the channels are chosen per run from its ``table`` param.
    """

    def alert(context: dict[str, Any]) -> None:
        params = context.get("params") or {}
        table = params.get("table")
        cfg = by_name.get(table) if isinstance(table, str) else None
        if cfg is None:
            # The request named no registry table: no owners to tell; the task's error says what to fix.
            log.error(
                "%s: a task failed for table %r, not a registry table; no alert sent", settings.ERASE_DAG_ID, table
            )
            return
        CdcAlertNotifier(
            table=cfg.qualified_name,
            emails=cfg.alerts.emails,
            smtp_conn_id=cfg.alerts.smtp_conn_id,
            channels=AlertChannels.of(cfg.alerts),
        ).notify(context)

    return alert


def erase_doc_md(cfgs: Sequence[TableConfig]) -> str:
    """The erase DAG's documentation: the trigger form and what each task does."""
    tables = ", ".join(f"`{c.qualified_name}`" for c in cfgs)
    return (
        "### Erase rows by predicate (GDPR)\n\n"
        "Manual only: **Trigger DAG w/ config** and fill in the form.\n\n"
        f"* **table:** one of the registry's tables ({tables})\n"
        "* **where:** a boolean expression over the table's registry columns, e.g. `customer_id = 4711` "
        "(write it with keys, not with the personal data itself: it is recorded as given)\n"
        "* **actor:** who asked for the erase (recorded in the audit record)\n\n"
        f"`{ERASE_VALIDATE_TASK_ID}` parses the predicate and fails at once (no retry) naming the offending "
        f"token; `{ERASE_TASK_ID}` removes every matching row from the live version, kept versions, pending "
        "and archived increments and the quarantine, verifies that no file still matches, and returns the "
        "audit record as its XCom (counts and file names, never a row's values). While a compaction of the "
        "table runs it waits through retries.\n"
    )


def build_erase_dag(cfgs: Sequence[TableConfig]) -> DAG:
    """The manual-only DAG that erases rows matching a predicate from one registry table.

    Its ``params`` (table: an enum of the registry's tables, where, actor) make Airflow's
    "Trigger DAG w/ config" form; the tasks read them from the context, never through a
    templated field, so a value is data and is never rendered with Jinja.
    """
    from airflow.sdk import Param

    by_name = {c.qualified_name: c for c in sorted(cfgs, key=lambda c: c.qualified_name)}
    with DAG(
        dag_id=settings.ERASE_DAG_ID,
        description="Erase every row matching a predicate from one table, everywhere it is kept (GDPR)",
        schedule=None,
        start_date=ERROR_DAG_START,
        catchup=False,
        # One erase at a time: a queued request waits instead of competing for the same lease.
        max_active_runs=1,
        default_args={
            "owner": "cdc",
            # A running compaction holds the table's lease (ConcurrentRunError): wait for it.
            "retries": 3,
            "retry_delay": timedelta(minutes=5),
            "retry_exponential_backoff": True,
            "on_failure_callback": [erase_failure_alert(by_name)],
        },
        tags=["cdc", "erase"],
        doc_md=erase_doc_md(list(by_name.values())),
        params={
            "table": Param(
                type="string",
                enum=list(by_name),
                title="Table",
                description="The registry table (database.table) to erase rows from",
            ),
            "where": Param(
                type="string",
                minLength=1,
                title="Predicate",
                description="Boolean expression over the registry columns, e.g. customer_id = 4711",
            ),
            "actor": Param(
                type="string",
                minLength=1,
                title="Requested by",
                description="Who asked for the erase (recorded in the audit record)",
            ),
        },
    ) as dag:

        @fail_fast
        def validate_predicate(params: Any = None) -> dict[str, Any]:
            """Parse the predicate against the table's registry columns; a refusal fails at once, naming the token."""
            from cdc_compaction.operations.erase import parse_predicate

            cfg, where, _ = _erase_request(by_name, params)
            pred = parse_predicate(cfg, where)
            return {"table": cfg.qualified_name, "predicate": where, "columns": list(pred.columns)}

        @fail_fast
        def erase_rows(params: Any = None) -> dict[str, Any]:
            """Erase the matching rows everywhere, verify nothing matches; return the audit record."""
            from cdc_compaction.core.settings import metastore_from_airflow
            from cdc_compaction.operations.erase import erase

            cfg, where, actor = _erase_request(by_name, params)
            # Partitioned tables: a partition whose every row is erased is dropped from the metastore too.
            metastore = metastore_from_airflow(settings.METASTORE_CONN_ID) if cfg.partition_by is not None else None
            return erase(cfg, where, actor=actor, metastore=metastore)

        check = PythonOperator(
            task_id=ERASE_VALIDATE_TASK_ID,
            python_callable=validate_predicate,
            retries=0,
            doc_md=validate_predicate.__doc__,
        )
        run = PythonOperator(task_id=ERASE_TASK_ID, python_callable=erase_rows, doc_md=erase_rows.__doc__)
        check >> run
    return dag


def _unique_id(entry: RegistryEntry) -> str:
    digest = hashlib.sha256(entry.path.name.encode()).hexdigest()[:8]
    return f"{entry.dag_id[:200]}__{digest}"


def build_dags(
    entries: list[RegistryEntry], view_refresher: bool = True, eraser: bool = True, tables: bool = True
) -> dict[str, DAG]:
    """DAGs for every registry entry, keyed by DAG id, in registry (file name) order.

    With ``view_refresher`` (the DAG processor's full parse, or a task of that DAG) also the
    view refresher DAG over every valid table; with ``eraser`` the erase DAG over every valid table.
    Without ``tables`` (a task of the erase DAG) no per-table DAG is built.
    """
    dags: dict[str, DAG] = {}
    for e in entries if tables else []:
        if e.config is None:
            if e.dag_id in dags:
                # Two bad files whose names sanitize to one id (``a-b.c.yaml``, ``a_b.c.yaml``): both stay visible.
                e = RegistryEntry(e.path, None, e.error, dag_id_override=_unique_id(e))
            dags[e.dag_id] = broken_dag(e)
            continue
        try:
            dags[e.dag_id] = build_dag(e.config)
        except Exception as exc:  # noqa: BLE001 - one table's surprise must not take down every DAG of the file
            error = RegistryError(str(e.path), e.config.qualified_name, [f"cannot build its DAG: {exc!r}"])
            dags[e.dag_id] = broken_dag(RegistryEntry(e.path, None, error))
    # A disabled table's views are left as they are: nothing of it runs, the refresher included.
    cfgs = [e.config for e in entries if e.config is not None and e.config.enabled]
    if cfgs and view_refresher:
        try:
            dags[settings.VIEW_REFRESH_DAG_ID] = build_view_refresher(cfgs)
        except Exception:
            log.exception("the view refresher DAG could not be built; every table's DAG is unaffected")
    # Disabled and retired tables too: a personal-data erase cannot wait for a table to be compacted again.
    valid = [e.config for e in entries if e.config is not None]
    if valid and eraser:
        try:
            dags[settings.ERASE_DAG_ID] = build_erase_dag(valid)
        except Exception:
            log.exception("the erase DAG could not be built; every table's DAG is unaffected")
    return dags


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while the DAGs are built; the collector's previous state after.

    Building 500 tables' DAGs allocates a few million objects that all stay alive (the DAGs, their
    tasks, the registry), and every few hundred allocations the collector walked the young ones
    again, and now and then the whole heap, Airflow's modules included: a third of the parse's CPU
    (bench/parse_dags.py), for no garbage found.  Memory is still freed by reference counting; the
    few cycles made meanwhile wait for the collector's next run after this block.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def registry_found(directory: Path, entries: Sequence[RegistryEntry], dag_id: str | None = None) -> tuple[int, str]:
    """(log level, line) of what one parse of the DAG file found: where it looked (and why there), how
    many tables and error entries, or that there is no registry and what to set. An Airflow without the
    environment parses to no DAG at all: this line is then all that tells why."""
    source = settings.registry_dir_source()
    if not directory.is_dir():
        return logging.WARNING, (
            f"cdc_compaction: no registry directory {directory} ({source}), so no table DAGs: set CDC_REGISTRY_DIR "
            "to the directory of the <database>.<table>.yaml files (or CDC_PROJECT_ROOT to the project holding "
            "include/registry) in the environment of the DAG processor, scheduler and workers "
            f"({doc_ref('deployment', 'installing-the-package')})"
        )
    if not entries:
        return logging.WARNING, (
            f"cdc_compaction: registry directory {directory} ({source}) has no <database>.<table>.yaml files"
            + (f" defining DAG {dag_id}" if dag_id else "")
            + ", so no table DAGs"
        )
    bad = sorted(e.path.name for e in entries if e.error is not None)
    good = len(entries) - len(bad)
    only = f" (this parse builds DAG {dag_id} only)" if dag_id else ""
    text = (
        f"cdc_compaction: registry directory {directory} ({source}): {good} table{'s' * (good != 1)}, "
        f"{len(bad)} error entr{'ies' if len(bad) != 1 else 'y'}{only}"
    )
    if bad:
        shown = ", ".join(bad[:10]) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
        text += f" ({shown}: each a failing DAG of its own; cdc-compaction registry validate --dir {directory})"
    return (logging.WARNING if bad else logging.INFO), text


def load_dags(namespace: dict[str, Any]) -> dict[str, DAG]:
    """Build the registry's DAGs and put them into ``namespace``: a DAG file's whole body is
    ``from cdc_compaction.airflow.factory import load_dags; load_dags(globals())`` (``dags/cdc_compaction_dags.py``).

    A bad registry file never makes the DAG file an import error (that would mark every table's
    DAG stale): its table gets an unscheduled DAG that shows the error in its docs and fails its
    only task with it.  When a task runs, Airflow parses the DAG file for that task's DAG only:
    just that one is built (the DAG processor's full parse has no DAG id here and builds every
    table's DAG, plus the view refresher and the erase DAG, which cover every table).  The entry
    gets the full parse's verdict: :func:`load_registry` still checks it against every other file.
    Every parse logs one line of where it looked and what it found (:func:`registry_found`).
    """
    from airflow.sdk import get_parsing_context

    from cdc_compaction.core.registry import load_registry

    wanted = get_parsing_context().dag_id
    whole = wanted in (settings.VIEW_REFRESH_DAG_ID, settings.ERASE_DAG_ID)
    directory = settings.registry_dir()
    with gc_paused():
        entries = load_registry(directory, dag_id=None if whole else wanted)
        level, found = registry_found(directory, entries, None if whole else wanted)
        log.log(level, "%s", found)
        dags = build_dags(
            entries,
            view_refresher=wanted in (None, settings.VIEW_REFRESH_DAG_ID),
            eraser=wanted in (None, settings.ERASE_DAG_ID),
            # An erase task needs its own DAG only (built over every table), not one DAG per table.
            tables=wanted != settings.ERASE_DAG_ID,
        )
        for dag_id, dag in sorted(dags.items()):
            namespace[dag_id] = dag
    return dags
