"""The table registry: one YAML file per table, validated with pydantic v2.

A registry directory holds files named ``<database>.<table>.yaml``.  Loading never
raises for a single bad file: every file becomes a :class:`RegistryEntry` that holds
either a validated :class:`TableConfig` or the :class:`RegistryError` that explains,
field by field, what is wrong with it.  That is what lets a bad file break only its
own table's DAG.

A database may have a defaults file, ``<registry dir>/<database>/_database.yaml``: fields every
table of that database gets unless its own file sets them (nested sections such as ``alerts``
and ``spark`` are merged key by key). A bad defaults file is an error of its own database's
tables only (:func:`load_database_defaults`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import stat
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from cdc_compaction.core.credentials import WHERE_CREDENTIALS_BELONG, credential_in_value, credential_key
from cdc_compaction.core.exceptions import IdentifierError, RegistryError
from cdc_compaction.core.identifiers import (
    RESERVED_PREFIX,
    check_identifier,
    normalize_hive_type,
    reserved_name_problem,
)
from cdc_compaction.core.names import table_names
from cdc_compaction.core.registry_errors import Context, Located, explain, load_located, yaml_error
from cdc_compaction.job.contract import OUTPUT_TIMESTAMP_TYPE_CONF

log = logging.getLogger(__name__)

REGISTRY_SUFFIXES = (".yaml", ".yml")
#: Airflow's limit on a DAG id (``ID_LEN``).
_MAX_DAG_ID = 250
#: The Hive metastore's limits (hive-metastore 2.3 ``package.jdo``): a longer column comment does
#: not fit COLUMNS_V2.COMMENT and Spark then falls back to a table Hive cannot read; a longer
#: derived table name fails deep inside Spark. Refused when the registry loads instead.
MAX_COMMENT_CHARS = 256
MAX_TABLE_NAME_CHARS = 128

# Storage roots end up inside SQL string literals (LOCATION '...') and in file system
# calls: a conservative character set plus a ban on '..' segments keeps both safe.
_PATH_CHARS = re.compile(r"^[A-Za-z0-9_./:\-+=@]+$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_DURATION_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_OP_CODE = re.compile(r"^[A-Za-z0-9_+\-]{1,16}$")
_TAG = re.compile(r"^[\w.\-:/ ]{1,100}$")
_PRESETS = {"@once", "@continuous", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly"}
_EMAIL = re.compile(r"^[^@\s'\";`]+@[^@\s'\";`]+\.[^@\s'\";`]+$")


def _parse_duration(value: Any) -> Any:
    """Accept ``"7d"``, ``"36h"``, ``"90m"``, an int of seconds, or a timedelta."""
    # timedelta raises OverflowError, which pydantic does not turn into a field error.
    try:
        if isinstance(value, str):
            m = _DURATION.match(value)
            if m:
                return timedelta(**{_DURATION_UNITS[m.group(2)]: int(m.group(1))})
        if isinstance(value, bool):
            raise ValueError("a duration such as '7d', '36h', '90m' or a number of seconds")
        if isinstance(value, int):
            return timedelta(seconds=value)
    except OverflowError as exc:
        raise ValueError(f"{value!r} is too long a duration (at most {timedelta.max.days} days)") from exc
    return value


def _non_negative(value: timedelta) -> timedelta:
    if value < timedelta(0):
        raise ValueError("must not be negative")
    return value


#: The JSON Schema of a duration (``registry schema``): the documented forms, not pydantic's ISO 8601 one.
DURATION_JSON_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "pattern": _DURATION.pattern, "examples": ["90s", "5m", "36h", "7d", "2w"]},
        {"type": "integer", "minimum": 0, "description": "seconds"},
    ]
}
Duration = Annotated[
    timedelta,
    BeforeValidator(_parse_duration),
    AfterValidator(_non_negative),
    WithJsonSchema(DURATION_JSON_SCHEMA),
]


def _holds_model(annotation: Any) -> bool:
    """True if a field of ``annotation`` is (or holds) a registry model: that model checks its own values."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_holds_model(a) for a in get_args(annotation))


@functools.cache
def _field_holds_model(model: type[BaseModel], name: str) -> bool:
    """True if ``model``'s field ``name`` is (or holds) a model (or is unknown: ``extra`` refuses it)."""
    field = model.model_fields.get(name)
    return field is None or _holds_model(field.annotation)


def _strings(value: Any, where: str = "") -> list[tuple[str, str]]:
    """(where inside the field, text) of every string ``value`` holds (a dict's keys name its values)."""
    if isinstance(value, str):
        return [(where, value)]
    if isinstance(value, dict):
        return [hit for k, v in value.items() for hit in _strings(v, f"the value of {k!r}")]
    if isinstance(value, list | tuple):
        return [hit for i, v in enumerate(value) for hit in _strings(v, where or f"item {i + 1}")]
    return []


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_credentials(cls, v: Any, info: ValidationInfo) -> Any:
        # Any value may carry one under a key that names none: a JDBC URL's password=, a URI's
        # user:password@, -D...secret...= in Java options. The value itself is never repeated.
        if _field_holds_model(cls, info.field_name or ""):
            return v
        for where, text in _strings(v):
            found = credential_in_value(text)
            if found is not None:
                raise ValueError(
                    f"{where or 'the value'} holds a credential ({found}); remove it: {WHERE_CREDENTIALS_BELONG}"
                )
        return v


class Column(_Strict):
    """A column of the source table, with its Hive type."""

    #: The column's name in the change files and the tables.
    name: str
    #: Its Hive type, e.g. int, bigint, string, decimal(12,2), timestamp, array<string>.
    type: str
    #: The column's comment in the metastore (one line, at most 256 characters).
    comment: str = ""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        check_identifier(v, "column name")
        if v.lower().startswith(RESERVED_PREFIX):
            raise ValueError(f"column names starting with {RESERVED_PREFIX!r} are reserved for the package")
        if (why := reserved_name_problem(v)) is not None:
            raise ValueError(f"{why}; rename the column (the source's, or with a rename transform in the sink)")
        return v

    @field_validator("type")
    @classmethod
    def _type(cls, v: str) -> str:
        return normalize_hive_type(v)

    @field_validator("comment")
    @classmethod
    def _comment(cls, v: str) -> str:
        if len(v) > MAX_COMMENT_CHARS or any(c in v for c in "\n\r\x00"):
            raise ValueError(
                f"comments are single-line text of at most {MAX_COMMENT_CHARS} characters "
                f"(the Hive metastore's COLUMNS_V2.COMMENT is varchar({MAX_COMMENT_CHARS}))"
            )
        return v


class OpCodes(_Strict):
    """The op column's codes; Debezium's ``c r u d`` by default."""

    #: The op code of an insert.
    create: str = "c"
    #: The op code of a snapshot read (an upsert).
    read: str = "r"
    #: The op code of an update.
    update: str = "u"
    #: The op code of a delete.
    delete: str = "d"

    @model_validator(mode="after")
    def _codes(self) -> OpCodes:
        codes = [self.create, self.read, self.update, self.delete]
        for c in codes:
            if not _OP_CODE.match(c):
                raise ValueError(f"op code {c!r} must be 1-16 letters, digits, '_', '+' or '-'")
        if len(set(codes)) != 4:
            raise ValueError("the four op codes must be distinct")
        return self

    @property
    def upserts(self) -> list[str]:
        return [self.create, self.read, self.update]


class Increments(_Strict):
    """Where change files land and when an increment counts as complete."""

    #: The landing area under storage_root.
    directory: str = "incremental"
    #: Increment directory names: <prefix><time_format>, e.g. increment_2026112210.
    prefix: str = "increment_"
    #: strftime format of the increment's hour in its directory name.
    time_format: str = "%Y%m%d%H"
    #: settle: complete when no data file changed for settle_seconds; marker: when marker_file exists.
    completion: Literal["settle", "marker"] = "settle"
    #: How long an increment's files must stay unchanged (completion: settle).
    settle_seconds: int = Field(default=120, ge=0)
    #: The file that marks an increment complete (completion: marker).
    marker_file: str = "_SUCCESS"
    #: The current hour's increment waits until the hour is over.
    wait_for_hour_end: bool = True
    #: An increment still incomplete this long after its hour ended and it last changed (a writer's
    #: abandoned temporaries, a marker that never came) is reported and alerted about, once.
    alert_after: Duration = timedelta(hours=6)

    @field_validator("directory", "prefix", "marker_file")
    @classmethod
    def _simple(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z0-9_\-.]+$", v) or v in {".", ".."}:
            raise ValueError(f"{v!r} must be a plain name (letters, digits, '_', '-', '.')")
        return v

    @field_validator("time_format")
    @classmethod
    def _fmt(cls, v: str) -> str:
        if "%" not in v or "/" in v:
            raise ValueError("time_format must be a strftime pattern without '/' such as '%Y%m%d%H'")
        return v


#: An SNS topic ARN: partition (aws, aws-cn, aws-us-gov), region, account, topic name.
_SNS_TOPIC = re.compile(r"^arn:aws(-[a-z]+)*:sns:[a-z]{2}(-[a-z]+)+-\d:\d{12}:[A-Za-z0-9_-]{1,256}$")


class Alerts(_Strict):
    """Who hears about failures, and through which channels (each one fails on its own)."""

    #: Recipients of failure and refused-rows e-mails (none: alerts are only logged).
    emails: list[str] = Field(default_factory=list)
    #: The Airflow SMTP connection of the e-mails.
    smtp_conn_id: str = "smtp_default"
    #: Alert when a compaction refused rows.
    on_rejected_rows: bool = True
    #: A Slack Incoming Webhook connection (type slackwebhook), or a Slack API one (type slack) with slack_channel.
    slack_conn_id: str | None = None
    #: The channel an API connection (type slack) posts to; a webhook's channel is the webhook's own.
    slack_channel: str | None = None
    #: An Amazon SNS topic, published to through ``aws_conn_id``.
    sns_topic_arn: str | None = None
    #: The Airflow AWS connection SNS is reached through.
    aws_conn_id: str = "aws_default"

    @field_validator("sns_topic_arn")
    @classmethod
    def _sns_topic(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if v.endswith(".fifo"):
            raise ValueError(
                f"{v!r} is a FIFO topic, which needs a message group id on every message; alerts publish to a "
                "standard topic: create one (or subscribe the FIFO topic's readers to a standard topic)"
            )
        if not _SNS_TOPIC.match(v):
            raise ValueError(f"{v!r} is not an SNS topic ARN (arn:aws:sns:<region>:<12-digit account>:<topic name>)")
        return v

    @field_validator("emails")
    @classmethod
    def _emails(cls, v: list[str]) -> list[str]:
        for e in v:
            if not _EMAIL.match(e):
                raise ValueError(f"{e!r} is not an e-mail address")
        return v


class EmrSettings(_Strict):
    """Where and how an EMR step runs the compaction (``spark.engine: emr``).

    ``application`` is the deployed ``include/spark_jobs/compact.py``, the entry script of the job
    package; ``py_files`` is the deployed job package (``cdc-compaction job-package``).
    ``py_files`` is optional on purpose: left out, it is derived when the task runs, as the zip of
    this deployment's job source in the S3 folder of ``application`` (the zip's name carries the
    hash of the source), so the step always runs the job version the Airflow side was built with,
    and an upgrade needs the new zip uploaded but no registry edit.  Set it to keep the zip
    elsewhere; a zip whose name is not this source's is then used as written, with a warning.
    """

    #: The EMR cluster (j-...) the compaction runs on as a step.
    job_flow_id: str
    #: The Airflow AWS connection (credentials and region live there, never here).
    aws_conn_id: str = "aws_default"
    #: The s3:// URI where include/spark_jobs/compact.py is deployed.
    application: str
    #: The s3:// URI of the deployed job package (.zip); unset: derived from application.
    py_files: str | None = None
    #: spark-submit's deploy mode.
    deploy_mode: Literal["cluster", "client"] = "cluster"
    #: What EMR does with the cluster when the step fails.
    action_on_failure: Literal["CONTINUE", "CANCEL_AND_WAIT"] = "CONTINUE"

    @field_validator("job_flow_id")
    @classmethod
    def _job_flow(cls, v: str) -> str:
        if not re.match(r"^j-[A-Z0-9]{1,64}$", v):
            raise ValueError(f"{v!r} is not an EMR cluster id (j-XXXXXXXX)")
        return v

    @field_validator("application")
    @classmethod
    def _application(cls, v: str) -> str:
        if not re.match(r"^s3://[a-z0-9.\-]{3,63}/[A-Za-z0-9_.\-/]+\.py$", v) or "/../" in v:
            raise ValueError(f"{v!r} must be the s3:// URI of the deployed compact.py (EMR reads it from S3)")
        return v

    @field_validator("py_files")
    @classmethod
    def _py_files(cls, v: str | None) -> str | None:
        if v is not None and (not re.match(r"^s3://[a-z0-9.\-]{3,63}/[A-Za-z0-9_.\-/]+\.zip$", v) or "/../" in v):
            raise ValueError(
                f"{v!r} must be the s3:// URI of the deployed job package zip (cdc-compaction job-package builds it)"
            )
        return v


class SparkSettings(_Strict):
    """How the compaction job is submitted."""

    #: spark_submit: spark-submit with conn_id; emr: an EMR step on an existing cluster;
    #: spark_connect: the job runs in the task against a long-lived Spark Connect server (conn_id).
    engine: Literal["spark_submit", "emr", "spark_connect"] = "spark_submit"
    #: The EMR cluster and job files (engine: emr).
    emr: EmrSettings | None = None
    #: The Airflow connection of the engine: a Spark connection (spark_submit; default spark_default)
    #: or a spark_connect one, sc://host:port (spark_connect; default spark_connect_default).
    conn_id: str = "spark_default"
    #: Extra Spark conf for the job, e.g. spark.sql.shuffle.partitions: "64".
    conf: dict[str, str] = Field(default_factory=dict)
    #: Hadoop settings, passed as spark.hadoop.<key> (never credentials).
    hadoop_conf: dict[str, str] = Field(default_factory=dict)
    #: Extra jars for spark-submit --jars (paths or URIs ending in .jar).
    jars: list[str] = Field(default_factory=list)
    #: spark-submit --driver-memory, e.g. 2g.
    driver_memory: str | None = None
    #: spark-submit --executor-memory, e.g. 4g.
    executor_memory: str | None = None
    #: Size the compaction aims at for each output file (estimated from the input's bytes per row).
    target_file_mb: int = Field(default=128, ge=1, le=65536)

    @model_validator(mode="after")
    def _engine(self) -> SparkSettings:
        if self.engine == "emr" and self.emr is None:
            raise ValueError("field 'emr': engine 'emr' needs emr.job_flow_id and emr.application")
        if self.engine == "spark_connect":
            # A Connect server is started once, with its own classpath and memory: a run cannot change them.
            server_side = {
                "emr": self.emr is not None,
                "jars": bool(self.jars),
                "driver_memory": self.driver_memory is not None,
                "executor_memory": self.executor_memory is not None,
            }
            for name, given in server_side.items():
                if given:
                    raise ValueError(
                        f"field '{name}': engine 'spark_connect' runs in a Spark Connect server that is already "
                        f"started; set {name} where the server starts (its spark-submit or cluster config) and "
                        "remove it here"
                    )
        return self

    @model_validator(mode="before")
    @classmethod
    def _connect_conn_id(cls, data: Any) -> Any:
        # spark_connect's connection is of another type than spark-submit's: its own default name.
        if isinstance(data, dict) and data.get("engine") == "spark_connect" and "conn_id" not in data:
            return {**data, "conn_id": "spark_connect_default"}
        return data

    @field_validator("jars")
    @classmethod
    def _jars(cls, v: list[str]) -> list[str]:
        for jar in v:
            if not re.match(r"^[A-Za-z0-9_.\-/:+=@]+\.jar$", jar) or "/../" in f"/{jar}/":
                raise ValueError(
                    f"jar {jar!r} must be a path or URI ending in .jar, without spaces, commas, quotes or '..'"
                )
        return v

    @field_validator("conf", "hadoop_conf", mode="before")
    @classmethod
    def _conf(cls, v: Any) -> Any:
        if isinstance(v, dict):
            out = {}
            for k, val in v.items():
                if not isinstance(k, str) or not re.match(r"^[A-Za-z0-9_.\-]+$", k):
                    raise ValueError(f"spark conf key {k!r} is not a valid property name")
                if credential_key(k):
                    raise ValueError(f"key {k!r} holds a credential; remove it: {WHERE_CREDENTIALS_BELONG}")
                if k == OUTPUT_TIMESTAMP_TYPE_CONF:
                    raise ValueError(
                        f"key {k!r}: the job sets it from the table's parquet_timestamps (micros or int96); "
                        "remove it here and set parquet_timestamps"
                    )
                out[k] = str(val).lower() if isinstance(val, bool) else str(val)
            return out
        return v


#: Types a partition value can be taken from as it is (``transform: identity``). Floating point
#: values have no stable text form and binary ones no text form at all.
_IDENTITY_PARTITION_TYPES = ("tinyint", "smallint", "int", "bigint", "string", "boolean", "date", "timestamp")
_DATE_TYPES = ("date", "timestamp")


class PartitionBy(_Strict):
    """How a base table is partitioned: one registry column, taken as is or truncated to a day, month or year.

    A compaction rewrites only the partitions its increments touch and reuses the others by
    reference, so its cost follows the change, not the table.
    """

    #: The registry column the base table is partitioned by.
    column: str
    #: identity: its values; day, month, year: of a date or timestamp column.
    transform: Literal["identity", "day", "month", "year"] = "identity"

    @field_validator("column")
    @classmethod
    def _column(cls, v: str) -> str:
        return check_identifier(v, "partition_by column")


class Views(_Strict):
    """Which engines' views of the table are published, and where (docs/readers.md#readers)."""

    #: Dialects of the views created in the metastore; the first gets <t>_view / <t>_pending_rejects,
    #: each further one the same names with _<dialect> appended.
    metastore: list[Literal["spark", "hive", "trino"]] = Field(default_factory=lambda: ["spark"], min_length=1)
    #: The catalog Trino views name their tables in (Trino's Hive catalog; Athena: awsdatacatalog).
    trino_catalog: str = "hive"
    #: A .sql script or a .duckdb database file the DuckDB views are (re)written to.
    duckdb: str | None = None

    @field_validator("metastore")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"{v} lists a dialect twice")
        return v

    @field_validator("trino_catalog")
    @classmethod
    def _catalog(cls, v: str) -> str:
        return check_identifier(v, "trino_catalog")

    @field_validator("duckdb")
    @classmethod
    def _duckdb(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not _PATH_CHARS.match(v) or ".." in v.split("/"):
            raise ValueError(f"{v!r} may only contain letters, digits and _ . / : - + = @, and no '..' segments")
        if not v.endswith((".sql", ".duckdb", ".db")):
            raise ValueError(f"{v!r} must end with .sql (a script) or .duckdb / .db (a DuckDB database file)")
        if v.startswith(("s3://", "s3a://")) and not v.endswith(".sql"):
            raise ValueError(f"{v!r}: a DuckDB database file must be local; on S3 write a .sql script")
        return v


class EventTime(_Strict):
    """The column holding when the source made each change (freshness; docs/readers.md#freshness)."""

    #: The column holding when the source made each change: timestamp, date or an integer count of unit.
    column: str
    #: For an integer column: epoch seconds, milliseconds, microseconds or nanoseconds.
    unit: Literal["s", "ms", "us", "ns"] = "ms"


class Slo(_Strict):
    """A freshness objective (docs/operations.md#metrics-and-slos): the base holds source events no older
    than ``freshness`` for at least ``target`` of the time over the last ``window``."""

    #: How old the newest source data the base holds may be (event time, else the newest increment's end).
    freshness: Duration
    #: The fraction of the window the table must be within ``freshness``.
    target: float = Field(default=0.99, gt=0, le=1)
    #: The time over which compliance is measured.
    window: Duration = timedelta(days=7)

    @model_validator(mode="after")
    def _bounds(self) -> Slo:
        if self.freshness <= timedelta(0):
            raise ValueError("slo.freshness must be longer than 0 (such as '90m')")
        if self.window < self.freshness:
            raise ValueError(
                f"slo.window ({self.window}) must be at least slo.freshness ({self.freshness}): "
                "compliance is measured over the window"
            )
        return self


class Compaction(_Strict):
    """When a run rewrites the base (docs/operations.md#compaction-policy).

    ``always`` (the default) compacts whatever is pending on every run.  ``threshold`` lets runs
    only register new increments in the views (which merge them with the base at read time)
    until any one threshold is crossed; then one run compacts everything pending.  A threshold
    set to null is not checked; at least one must be set.
    """

    #: always: every run compacts what is pending. threshold: only once a threshold below is crossed.
    policy: Literal["always", "threshold"] = "always"
    #: threshold: compact once the pending increments hold this many rows per row of the live version.
    pending_rows_ratio: float | None = Field(default=0.2, gt=0, allow_inf_nan=False)
    #: threshold: compact once this many pending (complete, not yet compacted) files wait.
    pending_files: int | None = Field(default=48, ge=1)
    #: threshold: compact once the oldest pending increment's hour is this long ago (90s, 5m, 36h, 7d).
    pending_age: Duration | None = timedelta(hours=6)

    @field_validator("pending_age")
    @classmethod
    def _age(cls, v: timedelta | None) -> timedelta | None:
        if v is not None and v <= timedelta(0):
            raise ValueError("must be longer than 0 (such as '6h'), or null to leave the age unchecked")
        return v

    @model_validator(mode="after")
    def _some_threshold(self) -> Compaction:
        if self.policy == "threshold" and (
            self.pending_rows_ratio is None and self.pending_files is None and self.pending_age is None
        ):
            raise ValueError(
                "compaction.policy is threshold but pending_rows_ratio, pending_files and pending_age are all "
                "null: the table would never be compacted; set at least one, or set policy: always"
            )
        return self


class TableConfig(_Strict):
    """One registry entry: everything the DAG for one table needs.

    The fields here are shared by every table mode; each mode's own fields (its key, its ordering,
    its change encoding) live on its subclass: :class:`CdcTable` (``mode: cdc``, the default),
    :class:`KeylessTable` (``mode: keyless``) and :class:`SnapshotTable` (``mode: snapshot``).
    :func:`parse_table` picks the class by ``mode`` (a pydantic discriminated union, :data:`TableSpec`).
    """

    #: The table mode: cdc (the default), keyless or snapshot.
    mode: str
    #: The Hive database; the file is named <database>.<table>.yaml.
    database: str
    #: The table's name; its DAG id is cdc__<database>__<table>.
    table: str
    #: What the table holds: the DAG's and the tables' description.
    description: str = ""
    #: The source table's columns, in order, with their Hive types.
    columns: list[Column] = Field(min_length=1)
    #: Table root: an absolute path, a path relative to the project root, or s3://bucket/prefix.
    storage_root: str
    #: The Airflow AWS connection of an S3 storage_root.
    storage_conn_id: str = "aws_default"
    #: How landed increments are named and when one is complete.
    increments: Increments = Field(default_factory=Increments)
    #: False keeps the table's DAG (visible, unscheduled, every task skips):
    #: docs/operations.md#pausing-resuming-deleting.
    enabled: bool = True
    #: True adds a ``doctor`` task before the first step: metastore and storage checks (docs/operations.md#doctor).
    doctor: bool = False
    #: A preset (@hourly, @daily, ...), a cron expression, or null (manual runs only).
    schedule: str | None = "@hourly"
    #: The DAG's fixed start date.
    start_date: datetime = datetime(2026, 1, 1, tzinfo=UTC)
    #: Airflow catch-up.
    catchup: bool = False
    #: The DAG's owner (also a tag).
    owner: str = "data-platform"
    #: Retries of each task (0-100).
    retries: int = Field(default=3, ge=0, le=100)
    #: The first retry's delay: 90s, 5m, 36h, 7d, 2w or a number of seconds.
    retry_delay: Duration = timedelta(minutes=5)
    #: The cap of the exponential retry backoff.
    max_retry_delay: Duration = timedelta(hours=1)
    #: Who hears about failures and refused rows.
    alerts: Alerts = Field(default_factory=Alerts)
    #: Extra DAG tags.
    tags: list[str] = Field(default_factory=list)
    #: How long a delete's tombstone stays: set it above the worst CDC delay.
    tombstone_retention: Duration = timedelta(days=7)
    #: Base versions kept for rollback, the live one included.
    keep_versions: int = Field(default=3, ge=1, le=1000)
    #: True: the compaction job writes each commit's change beside the version and publish puts it into
    #: ``<t>_changes`` (docs/data.md#change-feed): a cdc table's per key (insert, update_before and
    #: update_after, delete), a keyless table's as a multiset (one insert or delete row per copy added or
    #: removed), a snapshot table's per key between consecutive current tables. Refused for append tables
    #: (a commit only appends). Off by default.
    change_feed: bool = False
    #: Open table formats every published version is also readable as, over the same Parquet files
    #: (docs/formats.md#delta-and-iceberg): ``delta`` writes a Delta log at ``base/_delta_log``, ``iceberg`` Iceberg
    #: metadata. Derived like the change feed: a failure is logged and counted, never fails a publish.
    formats: list[Literal["delta", "iceberg"]] = Field(default_factory=list)
    #: The Parquet type the compaction job writes timestamps as (docs/formats.md#int96-timestamps): ``micros``
    #: (INT64 microseconds, the Iceberg specification's type) or ``int96`` (Spark's legacy type, for readers that
    #: read no INT64 timestamps: Hive before 4.0). Files written before keep their own type.
    parquet_timestamps: Literal["micros", "int96"] = "micros"
    #: How long archived increments and re-ingested quarantine entries stay; unset: forever. Archives a kept
    #: version still needs for a rebuild stay regardless (docs/data.md#retention).
    archive_retention: Duration | None = None
    #: How long a run's lease on the table lasts unrenewed: above the longest run with retries.
    lease_timeout: Duration = timedelta(hours=6)
    #: How the landed change files are written (docs/concepts.md#input-formats): ``parquet`` (default), ``json``
    #: (JSON Lines: one Kafka record value per line as Kafka Connect's JsonConverter writes it, with or
    #: without ``schemas.enable``; a tombstone is the line ``null``) or ``avro`` (Avro container files).
    format: Literal["parquet", "json", "avro"] = "parquet"
    #: What each record holds: ``flattened`` (the row, as Debezium's ExtractNewRecordState writes it: the
    #: source presets' ``__`` columns) or ``debezium`` (the raw envelope: before, after, source, op, ts_ms,
    #: transaction), which the job maps to the flattened row (``__op``, ``__deleted``, ``__lsn``, ...).
    envelope: Literal["flattened", "debezium"] = "flattened"
    #: The connector's ``decimal.handling.mode`` (precise: base64 bytes scaled by the column's decimal(p,s);
    #: double; string), for files that carry no schema (JSON without schemas.enable); a schema in the file wins.
    decimal_handling: Literal["precise", "double", "string"] = "precise"
    #: The connector's ``time.precision.mode``, for files that carry no schema: an integer in a timestamp
    #: column is microseconds (adaptive, adaptive_time_microseconds) or milliseconds (connect).
    time_precision: Literal["adaptive", "adaptive_time_microseconds", "connect"] = "adaptive"
    #: An unreadable or unfitting landed file: fail the run, or quarantine the file and go on.
    on_bad_file: Literal["fail", "quarantine"] = "fail"
    #: A landed column the registry does not list: fail (a bad file), or ignore the column.
    on_extra_columns: Literal["fail", "ignore"] = "fail"
    #: How landed files whose columns differ from the table's are taken (docs/data.md#changing-a-schema):
    #: ``fail`` (default: new columns and other types are bad files), ``evolve`` (follow the source:
    #: add columns, widen types) or ``ignore`` (drop new columns). Unset, ``on_extra_columns: ignore``
    #: means ``ignore`` (the older field).
    schema_changes: Literal["evolve", "fail", "ignore"] = "fail"
    #: The source table was dropped: no scheduled runs any more (a manual run still compacts what
    #: landed); tables, views and data are kept (docs/data.md#retiring-a-table).
    retired: bool = False
    #: How the compaction runs: spark-submit or EMR, conf, jars, memory.
    spark: SparkSettings = Field(default_factory=SparkSettings)
    #: Partition the base table by a column (or its day, month, year).
    partition_by: PartitionBy | None = None
    #: The views readers query, per dialect.
    views: Views = Field(default_factory=Views)
    #: The column holding when the source made each change (freshness).
    event_time: EventTime | None = None
    #: A freshness objective (freshness, target, window), checked after each publish
    #: (docs/operations.md#metrics-and-slos).
    slo: Slo | None = None
    #: When a run rewrites the base: always (default), or only once pending data crosses a threshold.
    compaction: Compaction = Field(default_factory=Compaction)

    @field_validator("formats")
    @classmethod
    def _formats(cls, v: list[str]) -> list[str]:
        twice = sorted({f for f in v if v.count(f) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} listed twice: name each format once")
        return v

    @field_validator("lease_timeout")
    @classmethod
    def _lease(cls, v: timedelta) -> timedelta:
        if v < timedelta(minutes=1):
            raise ValueError("must be at least 1m: a run renews its lease only when a task starts")
        return v

    @field_validator("database", "table")
    @classmethod
    def _ident(cls, v: str, info: Any) -> str:
        check_identifier(v, info.field_name)
        return v

    @field_validator("owner")
    @classmethod
    def _owner(cls, v: str) -> str:
        if not _TAG.match(v):
            raise ValueError(f"owner {v!r} must be 1-100 word characters, spaces or . - : /")
        return v

    @field_validator("description")
    @classmethod
    def _desc(cls, v: str) -> str:
        if len(v) > 4000:
            raise ValueError("at most 4000 characters")
        return v

    @field_validator("storage_conn_id")
    @classmethod
    def _storage_conn(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z0-9_.\-]{1,250}$", v):
            raise ValueError(f"{v!r} must be an Airflow connection id (letters, digits, _ . -)")
        return v

    @field_validator("storage_root")
    @classmethod
    def _root(cls, v: str) -> str:
        if not v or not _PATH_CHARS.match(v):
            raise ValueError(f"{v!r} may only contain letters, digits and _ . / : - + = @ (no spaces, quotes or ';')")
        if ".." in v.split("/"):
            raise ValueError(f"{v!r} must not contain '..' segments")
        if v.startswith(("s3://", "s3a://")):
            bucket, _, prefix = v.split("://", 1)[1].partition("/")
            if not _BUCKET.match(bucket):
                raise ValueError(f"{v!r}: {bucket!r} is not a valid S3 bucket name (3-63 of a-z 0-9 . -)")
            if not prefix.strip("/"):
                raise ValueError(f"{v!r} must name a prefix inside the bucket (s3://bucket/lake/db/table)")
            return v.rstrip("/")
        if "://" in v and not v.startswith("file://"):
            raise ValueError(
                f"{v!r}: supported storage roots are local paths, file://, s3:// and s3a:// "
                "(mount HDFS and other file systems, or use S3)"
            )
        # Where the root really is (relative roots under $CDC_LAKE_BASE, symbolic links followed): a
        # system, home, Airflow, project or registry directory is refused, since the table's files would
        # mix with what is there, and deleting the table's data would delete that (core/roots.py).
        from cdc_compaction.core import roots
        from cdc_compaction.core.settings import resolve_storage_root

        try:
            why = roots.refusal(resolve_storage_root(v))
        except (OSError, RuntimeError) as exc:  # a symbolic link loop, an unreadable directory
            raise ValueError(f"{v!r} cannot be resolved ({exc}); point it at a directory of its own") from exc
        if why is not None:
            raise ValueError(f"{v!r} {why}")
        return v

    @field_validator("tags")
    @classmethod
    def _tags(cls, v: list[str]) -> list[str]:
        for t in v:
            if not _TAG.match(t):
                raise ValueError(f"tag {t!r} must be 1-100 word characters, spaces or . - : /")
        return v

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, v: str | None) -> str | None:
        if v is None or v in _PRESETS:
            return v
        from croniter import croniter

        if not croniter.is_valid(v):
            raise ValueError(f"{v!r} is neither a cron expression nor one of {sorted(_PRESETS)}")
        return v

    @field_validator("start_date")
    @classmethod
    def _start(cls, v: datetime) -> datetime:
        return v if v.tzinfo else v.replace(tzinfo=UTC)

    @model_validator(mode="after")
    def _cross_field(self) -> TableConfig:
        names = [c.name for c in self.columns]
        lower = [n.lower() for n in names]
        dupes = sorted({n for n in lower if lower.count(n) > 1})
        if dupes:
            raise ValueError(f"columns: duplicate column names {dupes} (Hive names are case-insensitive)")
        types = {c.name: c.type for c in self.columns}
        self._check_mode(names, types)
        self._check_input(names)
        if self.max_retry_delay < self.retry_delay:
            raise ValueError("max_retry_delay: must be at least retry_delay")
        self._check_derived_names()
        if self.partition_by is not None:
            self._check_partition_by(names, types)
        if self.event_time is not None:
            kind = types.get(self.event_time.column)
            if kind is None:
                raise ValueError(f"event_time: column {self.event_time.column!r} is not among the columns {names}")
            if kind not in _DATE_TYPES and kind not in {"tinyint", "smallint", "int", "bigint"}:
                raise ValueError(
                    f"event_time: column {self.event_time.column!r} has type {kind}; it needs a timestamp, a date "
                    "or an integer count of time units since the epoch (with unit: s, ms, us or ns)"
                )
        duck = self.views.duckdb
        if duck is not None and duck.endswith((".duckdb", ".db")):
            stem = duck.rsplit("/", 1)[-1].rsplit(".", 1)[0]
            if stem.lower() == self.database.lower():
                raise ValueError(
                    f"views: DuckDB names a database file's catalog after the file, so in {duck!r} the catalog and "
                    f"the schema {self.database!r} would have one name and every query of them would be ambiguous; "
                    "name the file otherwise (e.g. lake.duckdb)"
                )
        if duck is not None and {"file_row_number", "filename"} & set(lower):
            raise ValueError(
                "views: DuckDB views cannot read a table with a column named filename or file_row_number "
                "(DuckDB's own columns for a row's file and position); leave views.duckdb unset"
            )
        return self

    @property
    def event_time_column(self) -> tuple[str, str | None] | None:
        """(column, unit) of the source's event time: the registry's ``event_time``, else a ``ts_ms``
        column (Debezium's), else the first timestamp column of ``order_by``; None if there is none.
        The unit is None for a timestamp or date column."""
        types = {c.name: c.type for c in self.columns}
        if self.event_time is not None:
            col = self.event_time.column
            return col, None if types[col] in _DATE_TYPES else self.event_time.unit
        if types.get("ts_ms") in {"bigint", "int"}:
            return "ts_ms", "ms"
        for c in self.ordering_columns:
            if types[c] in _DATE_TYPES:
                return c, None
        return None

    def _check_input(self, names: list[str]) -> None:
        """What ``format`` and ``envelope`` need of the mode and the columns (docs/concepts.md#input-formats)."""
        if self.mode == "snapshot" and (self.format != "parquet" or self.envelope != "flattened"):
            raise ValueError(
                f"format/envelope: a snapshot table reads whole-table snapshots as flattened Parquet; "
                f"format {self.format!r} with envelope {self.envelope!r} is not read in mode snapshot. "
                "Land the snapshots as Parquet, or use mode cdc for a change stream"
            )
        op = getattr(self, "op_column", None)
        if self.envelope == "debezium" and op is not None and not str(op).startswith("__"):
            raise ValueError(
                f"envelope: debezium gives each row the envelope's op as the column __op, but op_column is {op!r}; "
                "set source: debezium (op_column __op) and declare __op (string) among the columns"
            )
        if self.envelope == "debezium" and op is not None and op not in names:
            raise ValueError(f"envelope: debezium needs the op column {op!r} among the columns (type string)")

    def _check_mode(self, names: list[str], types: dict[str, str]) -> None:
        """The mode's own cross-field checks (its key, ordering and change columns)."""
        raise NotImplementedError  # every mode subclass defines it

    @property
    def ordering_columns(self) -> list[str]:
        """The columns that order a table's events (``order_by``), empty for a mode without."""
        return []

    @property
    def control_columns(self) -> list[str]:
        """Columns that describe a change rather than the row (the op column, before-images)."""
        return []

    def _check_derived_names(self) -> None:
        derived = list(table_names(self).values())
        # Metastore views of further dialects: <t>_view_<dialect>, <t>_pending_rejects_<dialect>.
        derived += [f"{n}_{d}" for d in self.views.metastore[1:] for n in derived]
        longest = max(derived, key=len)
        if len(longest) > MAX_TABLE_NAME_CHARS:
            room = MAX_TABLE_NAME_CHARS - (len(longest) - len(self.table))
            raise ValueError(
                f"table: derived name {longest!r} is {len(longest)} characters; the Hive metastore holds at most "
                f"{MAX_TABLE_NAME_CHARS}, so the table name may have at most {room}"
            )

    def _check_partition_by(self, names: list[str], types: dict[str, str]) -> None:
        part = self.partition_by
        assert part is not None
        if part.column not in types:
            raise ValueError(f"partition_by: column {part.column!r} is not among the columns {names}")
        if part.column in self.control_columns:
            raise ValueError(
                f"partition_by: column {part.column!r} is the op column or a before-image: it describes the change, "
                "not the row; partition by a data column (a key, a date, a region) instead"
            )
        kind = types[part.column]
        if part.transform != "identity" and kind not in _DATE_TYPES:
            raise ValueError(
                f"partition_by: transform {part.transform!r} needs a date or timestamp column, but "
                f"{part.column!r} has type {kind}; use transform: identity or another column"
            )
        identity_ok = kind in _IDENTITY_PARTITION_TYPES or kind.startswith(("varchar", "char", "decimal"))
        if part.transform == "identity" and not identity_ok:
            raise ValueError(
                f"partition_by: column {part.column!r} of type {kind} cannot name partitions "
                "(no stable text form); pick an integer, string, boolean, decimal, date or timestamp column"
            )

    # -- names derived from the entry ------------------------------------------------
    @property
    def qualified_name(self) -> str:
        return f"{self.database}.{self.table}"

    @property
    def dag_id(self) -> str:
        return dag_id_for(self.database, self.table)

    @property
    def schema_policy(self) -> str:
        """``schema_changes``, or ``ignore`` where only the older ``on_extra_columns: ignore`` is set."""
        if "schema_changes" not in self.model_fields_set and self.on_extra_columns == "ignore":
            return "ignore"
        return self.schema_changes

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]


def _check_ident_list(v: list[str], field: str) -> list[str]:
    for name in v:
        check_identifier(name, f"{field} column")
    if len({n.lower() for n in v}) != len(v):
        raise ValueError("lists a column twice")
    return v


def _check_op_and_order(
    names: list[str], types: dict[str, str], op_column: str, order_by: list[str], key: list[str]
) -> None:
    """Checks shared by the modes whose events carry an op code and ordering columns."""
    known = set(names)
    for field, cols in (("primary_key", key), ("order_by", order_by)):
        missing = [c for c in cols if c not in known]
        if missing:
            raise ValueError(f"{field}: {missing} not among the columns {names}")
    if op_column not in known:
        raise ValueError(f"op_column: {op_column!r} is not among the columns {names}")
    if op_column in key or op_column in order_by:
        raise ValueError("op_column: must not be part of primary_key or order_by")
    if types[op_column] != "string":
        raise ValueError(f"op_column: column {op_column!r} must have type string")
    for c in order_by:
        if types[c] in {"binary", "boolean"}:
            raise ValueError(f"order_by: column {c!r} of type {types[c]} cannot order events")


#: Types a placeholder string can stand in (Debezium writes it into text columns).
_TEXT_TYPES = ("string", "varchar", "char")


#: What the change-data tools write, as registry defaults (docs/concepts.md#source-presets). Each entry's
#: own fields win; a default that names a column applies only when the entry declares that column.
SOURCES = ("generic", "debezium", "dms", "wal2json")


def source_defaults(source: str, mode: str, columns: set[str]) -> dict[str, Any]:
    """The fields ``source`` fills in where an entry of ``mode`` with ``columns`` leaves them out."""
    found: dict[str, Any] = {}
    if source == "debezium":
        # ExtractNewRecordState with add.fields=op,source.ts_ms,lsn (Postgres) or file,pos,row (MySQL).
        found["op_column"] = "__op"
        if mode == "keyless" and {"__commit_lsn", "__lsn"} <= columns:
            # PostgreSQL delivers in commit order: the commit position (source.sequence's first LSN)
            # orders, the change LSN and the row ordinal tell its events apart. Unlike a Kafka offset
            # all three survive a killed Connect worker's re-delivery (docs/debezium.md).
            found["order_by"] = ["__commit_lsn"]
            found["event_id"] = ["__lsn", *(["__row"] if "__row" in columns else [])]
        elif mode == "keyless" and "__kafka_offset" in columns:
            # A keyless table's watermark follows the delivery position (tests/scenarios/README.md,
            # "What each source must provide"): a one-partition topic's offset (InsertField
            # offset.field) is one, and unique per event -- but a re-sent record gets a new one.
            found["order_by"] = ["__kafka_offset"]
        elif mode == "cdc" and {"__commit_lsn", "__lsn"} <= columns:
            # A key's events in commit order, then LSN order within a transaction: a snapshot's rows
            # (commit position 0) come before any change streamed after them.
            found["order_by"] = ["__commit_lsn", "__lsn"]
        elif "__lsn" in columns:
            found["order_by"] = ["__lsn"]
        elif {"__file", "__pos"} <= columns:
            # A binlog position is (file, offset in it, row of the event); the file's name ends in a
            # sequence number, compared as a number (mysql-bin.999999 < mysql-bin.1000000).
            found["order_by"] = ["__file", "__pos", *(["__row"] if "__row" in columns else [])]
            if mode == "cdc":
                found["order_as"] = {"__file": "binlog_file"}
        elif "__kafka_offset" in columns:
            # No log position declared: the Kafka offset a sink records in its file names
            # (<topic>+<partition>+<first offset>; envelope: debezium) orders a key's events, which
            # one partition holds in the order the connector sent them.
            found["order_by"] = ["__kafka_offset"]
        if "__source_ts_ms" in columns:
            found["event_time"] = {"column": "__source_ts_ms", "unit": "ms"}
        if mode == "cdc" and "__deleted" in columns:
            found["deleted_column"] = "__deleted"  # delete.handling.mode=rewrite
    elif source == "dms":
        # Op is I/U/D on change rows; full-load files carry no Op at all (unless IncludeOpForFullLoad).
        found["op_column"] = "Op"
        found["op_codes"] = {"create": "I", "update": "U", "delete": "D", "read": "L"}
        if mode == "cdc":
            found["missing_op"] = "read"
        if "AR_H_CHANGE_SEQ" in columns:
            found["order_by"] = ["AR_H_CHANGE_SEQ"]
    elif source == "wal2json":
        # format-version 1: "kind" is insert/update/delete; the LSN landed as a number.
        found["op_column"] = "kind"
        found["op_codes"] = {"create": "insert", "update": "update", "delete": "delete", "read": "snapshot"}
        if mode == "keyless" and {"commit_lsn", "lsn"} <= columns:
            # As cdc_compaction.devtools.pgsource lands it: commit order first (what the slot delivers in),
            # then the change's own LSN and its ordinal among the events at that LSN (a snapshot's rows).
            found["order_by"] = ["commit_lsn"]
            found["event_id"] = ["lsn", *(["lsn_row"] if "lsn_row" in columns else [])]
        elif "lsn" in columns:
            found["order_by"] = ["lsn"]
    return found


class EventTable(TableConfig):
    """The fields of the modes whose change files are events: an op code and the source log's order."""

    mode: str
    #: The tool that wrote the change files: fills in op column, op codes, order and delete
    #: conventions the entry leaves out (:func:`_source_defaults`).
    source: Literal["generic", "debezium", "dms", "wal2json"] = "generic"
    #: 1..n columns giving the event order, e.g. [lsn]: for a log-based source the log position, not a time.
    order_by: list[str] = Field(min_length=1)
    #: The op column (string; not part of the key or order).
    op_column: str = "op"
    #: The op column's codes (Debezium's c r u d by default).
    op_codes: OpCodes = Field(default_factory=OpCodes)

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("source", "generic") not in SOURCES:
            return data  # pydantic reports a wrong source or document itself
        columns = data.get("columns")
        names = {c.get("name") for c in columns if isinstance(c, dict)} if isinstance(columns, list) else set()
        defaults = source_defaults(data.get("source", "generic"), str(data.get("mode", "cdc")), names)
        merged = {**defaults, **data}
        if isinstance(defaults.get("op_codes"), dict) and isinstance(data.get("op_codes"), dict):
            merged["op_codes"] = {**defaults["op_codes"], **data["op_codes"]}  # override one code, keep the rest
        return merged

    def _check_source(self, types: dict[str, str]) -> None:
        """What a preset knows its tool gets wrong unless the landing converts it."""
        if self.source == "wal2json":
            text = [c for c in self.order_by if types[c].startswith(_TEXT_TYPES)]
            if text:
                raise ValueError(
                    f"order_by: {text} hold text, and wal2json's LSN text (0/16B3748) does not order as text "
                    "(0/9 sorts after 0/10); land the LSN as a bigint (pg_lsn - '0/0')"
                )

    @field_validator("order_by")
    @classmethod
    def _order(cls, v: list[str], info: Any) -> list[str]:
        return _check_ident_list(v, str(info.field_name))

    @field_validator("op_column")
    @classmethod
    def _op(cls, v: str, info: Any) -> str:
        return check_identifier(v, info.field_name)

    @property
    def ordering_columns(self) -> list[str]:
        return list(self.order_by)


def _mode_of(value: Any) -> str:
    """The ``mode`` tag of a registry document (``cdc`` when absent) or of a validated table."""
    if isinstance(value, dict):
        mode = value.get("mode", "cdc")
        return mode if isinstance(mode, str) else repr(mode)
    return str(getattr(value, "mode", "cdc"))


def mode_models() -> dict[str, type[TableConfig]]:
    """Every table mode's registry model, by its ``mode`` value (``cdc`` first: the default).

    Each mode owns its model (``cdc_compaction.modes.<mode>``); :mod:`cdc_compaction.core.mode`
    finds them, so a new mode is a new module and this registry does not name any.
    """
    from cdc_compaction.core.mode import table_modes

    return {name: mode.model for name, mode in table_modes().items()}


def mode_names() -> tuple[str, ...]:
    """The registry's ``mode`` values."""
    return tuple(mode_models())


@functools.cache
def _table_adapter() -> TypeAdapter[Any]:
    models = mode_models()
    names = ", ".join(repr(n) for n in models)
    members = tuple(Annotated[model, Tag(name)] for name, model in models.items())
    spec = Annotated[
        Union[members],  # noqa: UP007 - a union built from the modes found at run time
        Discriminator(
            _mode_of,
            custom_error_type="unknown_mode",
            custom_error_message=f"mode: must be one of {names}",
            custom_error_context={"discriminator": "mode"},
        ),
    ]
    return TypeAdapter(spec)


def parse_table(data: Any) -> TableConfig:
    """Validate one registry document as the table class of its ``mode``; raises pydantic's ValidationError."""
    return _table_adapter().validate_python(data)  # type: ignore[no-any-return]


def dag_id_for(database: str, table: str) -> str:
    """The DAG id of a table: ``cdc__<database>__<table>``."""
    return f"cdc__{database}__{table}"


@dataclass(frozen=True)
class RegistryEntry:
    """One registry file: its validated config, or the error that makes it unusable."""

    path: Path
    config: TableConfig | None
    error: RegistryError | None
    #: Set only when two bad files' names sanitize to the same DAG id (see ``factory.build_dags``).
    dag_id_override: str | None = None

    @property
    def dag_id(self) -> str:
        if self.dag_id_override is not None:
            return self.dag_id_override
        if self.config is not None:
            return self.config.dag_id
        # A bad file still gets its own DAG, named after the file: ``<db>.<table>.yaml`` gives the
        # id its table would have; any other name is reduced to characters Airflow accepts.
        stem = self.path.name.rsplit(".", 1)[0]
        safe = re.sub(r"[^A-Za-z0-9_]", "_", stem.replace(".", "__"))
        dag_id = f"cdc__{safe}"
        if len(dag_id) > _MAX_DAG_ID:
            digest = hashlib.sha256(stem.encode("utf-8", "surrogateescape")).hexdigest()[:8]
            dag_id = f"{dag_id[: _MAX_DAG_ID - 10]}__{digest}"
        return dag_id


_FIELD_PREFIX = re.compile(r"^(\w+): (.*)$", re.DOTALL)


@functools.cache
def _all_fields() -> frozenset[str]:
    return frozenset(name for model in mode_models().values() for name in model.model_fields)


def _format_pydantic(err: ValidationError) -> list[str]:
    problems = []
    for e in err.errors():
        parts = list(e["loc"])
        # A mode's own errors are located under its tag (('cdc', 'primary_key')): the file has no such level.
        if parts and parts[0] in mode_models():
            parts = parts[1:]
        loc = ".".join(str(p) for p in parts)
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        # Cross-field checks have no location of their own: their message starts with the field.
        m = _FIELD_PREFIX.match(msg) if not loc else None
        if m and m.group(1) in _all_fields():
            loc, msg = m.group(1), m.group(2)
        problems.append(f"field '{loc or '(entry)'}': {msg}")
    return problems


#: PyYAML's safe loader on libyaml when the wheel has it: the same documents, parsed ~6x faster
#: (500 registry files: 4.2 s -> 0.6 s, most of the DAG file's parse time before this).
_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# Bounds on one registry file, checked before it is built into Python objects: a real entry is
# a few KiB, at most 3 levels deep (entry > columns > column) and has no aliases. Beyond them a
# file could crash (50k-deep nesting overflows the composer's C stack), or exhaust memory and
# time (an alias bomb: 9 aliases per level, 9 levels, is 9**9 nodes once expanded).
MAX_FILE_BYTES = 1 << 20
MAX_YAML_DEPTH = 32
MAX_YAML_NODES = 100_000


def _check_yaml_bounds(text: str, where: list[str | None] | None = None) -> list[str]:
    """Problems with the shape of ``text`` as YAML: too deep or too many nodes once aliases expand.

    ``where`` (if given) receives the ``line:column`` of the node at which each problem was found.

    Walks the parser's flat event stream (no recursion, no objects built) and sizes every node
    with its aliases expanded, so nested anchors are counted as they would be constructed.
    """
    depth_of: dict[str, tuple[int, int]] = {}  # anchor -> (expanded nodes, depth)
    stack: list[list[Any]] = []  # open collections: [nodes, deepest child, anchor]
    total = 0

    def add(nodes: int, depth: int) -> str | None:
        nonlocal total
        total += nodes
        if stack:
            stack[-1][0] += nodes
            stack[-1][1] = max(stack[-1][1], depth)
        if total > MAX_YAML_NODES:
            return f"too many YAML nodes once aliases are expanded (more than {MAX_YAML_NODES})"
        if len(stack) + depth > MAX_YAML_DEPTH:
            return f"YAML nested deeper than {MAX_YAML_DEPTH} levels"
        return None

    for event in yaml.parse(text, Loader=_SAFE_LOADER):
        problem = None
        if isinstance(event, yaml.CollectionStartEvent):
            stack.append([1, 0, event.anchor])
            if len(stack) > MAX_YAML_DEPTH:
                problem = f"YAML nested deeper than {MAX_YAML_DEPTH} levels"
        elif isinstance(event, yaml.CollectionEndEvent):
            nodes, deepest, anchor = stack.pop()
            if anchor:
                depth_of[anchor] = (nodes, deepest + 1)
            problem = add(nodes, deepest + 1)
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor:
                depth_of[event.anchor] = (1, 0)
            problem = add(1, 0)
        elif isinstance(event, yaml.AliasEvent):
            # An unknown anchor is left to the loader, which reports it as invalid YAML.
            problem = add(*depth_of.get(event.anchor or "", (1, 0)))
        if problem:
            if where is not None:
                where.append(f"{event.start_mark.line + 1}:{event.start_mark.column + 1}")
            return [problem]
    return []


# -- a database's defaults ------------------------------------------------------------
#: The defaults file of database ``<db>``: ``<registry dir>/<db>/_database.yaml``. A subdirectory,
#: so :func:`registry_files` (the top level's files) never takes it for a table entry.
DEFAULTS_FILE_NAMES = ("_database.yaml", "_database.yml")
#: Fields that describe one table: a database's defaults file may not set them.
PER_TABLE_FIELDS = frozenset(
    {
        "database",
        "table",
        "description",
        "columns",
        "storage_root",
        "primary_key",
        "nullable_key",
        "old_key",
        "unchanged",
        "partition_by",
        "business_date",
    }
)


@functools.cache
def _defaults_model() -> type[BaseModel]:
    """Every field a table of some mode may take from its database's defaults, typed and constrained as
    there (pydantic ``extra="forbid"``: an unknown key is refused), each optional."""
    from pydantic import create_model

    fields: dict[str, Any] = {"mode": (Literal[mode_names()] | None, None)}
    for cls in mode_models().values():
        for name, info in cls.model_fields.items():
            if name in PER_TABLE_FIELDS or name in fields:
                continue
            typed = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
            fields[name] = (typed | None, None)
    return create_model("DatabaseDefaultsModel", __base__=_Strict, **fields)


@dataclass(frozen=True)
class DatabaseDefaults:
    """One database's defaults file: the mapping its tables are merged onto, or why it is unusable."""

    path: Path
    database: str
    values: dict[str, Any]
    error: RegistryError | None = None
    #: Where each default is written (errors of a table name the defaults file's line).
    located: Located | None = None


def database_defaults_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The defaults files of a registry directory (``<db>/_database.yaml``), sorted."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [
        sub / name
        for sub in d.iterdir()
        if sub.is_dir() and not sub.name.startswith(".")
        for name in DEFAULTS_FILE_NAMES
        # Any kind of path (a dangling link, a FIFO, a directory): an error, never skipped (its tables would
        # lose their defaults without a word).
        if os.path.lexists(sub / name)
    ]
    return sorted(found, key=str)


def parse_defaults(path: Path, text: str) -> dict[str, Any]:
    """Validate one defaults file's text; return its mapping or raise :class:`RegistryError`."""
    return _parse_defaults_located(path, text).data or {}


def _parse_defaults_located(path: Path, text: str) -> Located:
    """:func:`parse_defaults`, keeping where each key and value is (for errors of the tables it fills in)."""
    database = path.parent.name
    where = f"{database}.*"
    file = str(path)
    try:
        check_identifier(database, "database directory")
    except IdentifierError as exc:
        raise RegistryError(file, where, [f"{exc}; name the directory after the database"]) from exc
    if len(text) > MAX_FILE_BYTES:
        raise RegistryError(file, where, [f"larger than {MAX_FILE_BYTES} bytes; a defaults file is a few lines"])
    try:
        marks: list[str | None] = []
        problems = _check_yaml_bounds(text, marks)
        if problems:
            raise RegistryError(file, where, problems, [f"{file}:{m}" for m in marks])
        located = load_located(text, file, _SAFE_LOADER)
        data = located.data
    except yaml.YAMLError as exc:
        raise yaml_error(file, where, exc) from exc
    except ValueError as exc:
        raise RegistryError(file, where, [f"not valid YAML: {exc}"]) from exc
    except RegistryError as exc:
        raise RegistryError(file, where, exc.problems, exc.locations) from exc
    if data is None:
        return Located(file, {}, located.keys, located.values)
    if not isinstance(data, dict):
        raise RegistryError(
            file,
            where,
            ["the file must hold one mapping of defaults (owner, alerts, spark, ...)"],
            [located.nearest(())],
        )
    per_table = sorted(str(k) for k in data if k in PER_TABLE_FIELDS)
    if per_table:
        raise RegistryError(
            file,
            where,
            [
                f"field '{k}': describes one table; set it in each table's file "
                f"(<database>.<table>.yaml), not in the database's defaults"
                for k in per_table
            ],
            [located.nearest((k,), key=True) for k in per_table],
        )
    try:
        _defaults_model().model_validate(data)
    except ValidationError as exc:
        problems, locations = explain(exc, _format_pydantic(exc), _error_context(located, _defaults_model()))
        raise RegistryError(file, where, problems, locations) from exc
    return located


def load_database_defaults(directory: str | os.PathLike[str]) -> dict[str, DatabaseDefaults]:
    """Every database's defaults of a registry directory, by database name (cached until a file changes)."""
    return _defaults_cached(_signature(database_defaults_files(directory)))


@functools.lru_cache(maxsize=16)
def _defaults_cached(signature: tuple[tuple[str, int, int], ...]) -> dict[str, DatabaseDefaults]:
    out: dict[str, DatabaseDefaults] = {}
    for file, _mtime, _size in signature:
        path = Path(file)
        database = path.parent.name
        if database in out:  # _database.yaml and _database.yml: neither is taken
            error = RegistryError(
                file,
                f"{database}.*",
                [f"database {database!r} has two defaults files; keep one of {DEFAULTS_FILE_NAMES}"],
            )
            out[database] = DatabaseDefaults(path, database, {}, error)
            continue
        try:
            located = _parse_defaults_located(path, _read_text(path))
            out[database] = DatabaseDefaults(path, database, located.data or {}, located=located)
        except RegistryError as exc:
            out[database] = DatabaseDefaults(path, database, {}, exc)
        except Exception as exc:  # noqa: BLE001 - one database's file must not hide the other databases
            error = RegistryError(file, f"{database}.*", [f"cannot be loaded: {type(exc).__name__}: {exc}"[:1000]])
            out[database] = DatabaseDefaults(path, database, {}, error)
    return out


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``: mappings merge key by key, anything else (lists too) is replaced."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def merge_defaults(data: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """A table's document with its database's defaults under it.

    The table's own values win; nested sections (``alerts``, ``spark``, ``spark.conf``,
    ``increments``, ``views``, ``op_codes``) merge key by key; lists are replaced, not joined.
    A default the table's mode has no field for (``delta`` for a cdc table) is left out.
    """
    mode = data.get("mode", defaults.get("mode", "cdc"))
    cls = mode_models().get(mode) if isinstance(mode, str) else None
    if cls is None:
        return _deep_merge(defaults, data)  # the unknown mode is reported by parse_table
    return _deep_merge({k: v for k, v in defaults.items() if k in cls.model_fields}, data)


def _blame_defaults(problem: str, fields: set[str], path: Path) -> str:
    """A table's problem, naming the defaults file when the field's value came from there."""
    m = re.match(r"^field '([A-Za-z_]\w*)", problem)
    if m and m.group(1) in fields:
        return f"{problem} (the value comes from the database's defaults file {path})"
    return problem


def parse_entry(path: Path, text: str, defaults: dict[str, DatabaseDefaults] | None = None) -> TableConfig:
    """Parse and validate one registry file's text; raise :class:`RegistryError`.

    ``defaults`` (database name -> its defaults file) fills in what the entry leaves out
    (:func:`merge_defaults`); a problem with a value that came from there names that file.
    """
    file = str(path)
    if len(text) > MAX_FILE_BYTES:
        raise RegistryError(file, None, [f"larger than {MAX_FILE_BYTES} bytes; a registry entry is a few KiB"])
    try:
        marks: list[str | None] = []
        problems = _check_yaml_bounds(text, marks)
        if problems:
            raise RegistryError(file, None, problems, [f"{file}:{m}" for m in marks])
        # A safe loader (plain data only) that keeps each key's line and refuses a key written twice.
        located = load_located(text, file, _SAFE_LOADER)
        data = located.data
    except yaml.YAMLError as exc:
        raise yaml_error(file, None, exc) from exc
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise RegistryError(file, None, [f"not valid YAML: {exc}"]) from exc
    if not isinstance(data, dict):
        raise RegistryError(
            file, None, ["the file must hold one mapping (database, table, columns, ...)"], [located.nearest(())]
        )
    table = f"{data.get('database', '?')}.{data.get('table', '?')}"
    own = data.get("database")
    db_defaults = (defaults or {}).get(own) if isinstance(own, str) else None
    from_defaults: set[str] = set()
    if db_defaults is not None:
        if db_defaults.error is not None:
            raise RegistryError(
                file,
                table,
                [
                    f"the defaults file {db_defaults.path} of database {own!r} is invalid, so no table of {own} "
                    "is built until it is fixed: " + "; ".join(db_defaults.error.problems)
                ],
                # Where to fix it: the defaults file's first problem.
                [next((loc for loc in db_defaults.error.locations if loc), str(db_defaults.path))],
            )
        merged = merge_defaults(data, db_defaults.values)
        from_defaults = {k for k in merged if k not in data or merged[k] != data[k]}
        data = merged
    try:
        cfg = parse_table(data)
    except ValidationError as exc:
        problems = _format_pydantic(exc)
        if from_defaults:
            assert db_defaults is not None
            problems = [_blame_defaults(p, from_defaults, db_defaults.path) for p in problems]
        mode = data.get("mode", "cdc")
        model = mode_models().get(mode) if isinstance(mode, str) else None
        context = _error_context(located, model, data, db_defaults.located if db_defaults else None)
        problems, locations = explain(exc, problems, context)
        raise RegistryError(file, table, problems, locations) from exc
    except IdentifierError as exc:  # pragma: no cover - pydantic wraps these as ValueError
        raise RegistryError(file, table, [str(exc)]) from exc
    except Exception as exc:  # a validator's surprise (OverflowError, ...) is this file's error
        raise RegistryError(file, table, [f"cannot be validated: {type(exc).__name__}: {exc}"]) from exc
    expected = f"{cfg.database}.{cfg.table}"
    if path.name.rsplit(".", 1)[0] != expected:
        raise RegistryError(
            file,
            expected,
            [f"file name must be '{expected}.yaml' to match database and table; rename the file or fix them"],
            [located.nearest(("table",))],
        )
    return cfg


def _error_context(
    doc: Located,
    model: type[BaseModel] | None,
    data: dict[str, Any] | None = None,
    defaults: Located | None = None,
) -> Context:
    """What :func:`~cdc_compaction.core.registry_errors.explain` needs to locate and hint at an entry's errors."""
    from cdc_compaction.core.identifiers import _PRIMITIVE_TYPES

    preset: dict[str, Any] = {}
    source = data.get("source") if data else None
    if data and isinstance(source, str) and source in SOURCES:
        columns = data.get("columns")
        names = {c.get("name") for c in columns if isinstance(c, dict)} if isinstance(columns, list) else set()
        found = source_defaults(source, str(data.get("mode", "cdc")), names)
        preset = {k: v for k, v in found.items() if k not in data}
    return Context(
        doc=doc,
        model=model,
        other_models=mode_models(),
        defaults=defaults,
        preset=preset,
        source=source if isinstance(source, str) else None,
        hive_types=(*sorted(_PRIMITIVE_TYPES - {"integer"}), "decimal(p,s)", "varchar(n)", "char(n)"),
        schedule_presets=tuple(sorted(_PRESETS)),
        modes=mode_names(),
    )


_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _not_a_file(path: Path, mode: int) -> RegistryError:
    """The error of a registry path that is not a regular file (a FIFO, a directory named ``x.yaml``, ...)."""
    kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
    if path.is_symlink():
        problem = (
            f"is a symbolic link to {os.readlink(path)}, which is {kind}, not a regular file; point the link at "
            "the table's registry file, or delete the link"
        )
    else:
        problem = (
            f"is {kind}, not a regular file: a registry entry is a YAML file; replace it with the table's file, "
            "or move it out of the registry directory (or rename it to end in neither .yaml nor .yml)"
        )
    # Skipped, its table's DAG would vanish unseen: it is this path's error, located at the path itself.
    return RegistryError(str(path), None, [problem], [str(path)])


def _open_regular(path: Path) -> Any:
    """``path`` opened for reading in binary, when it is a regular file (or a link to one); else raise.

    Its type is checked with ``stat`` before it is opened, since opening a FIFO blocks until a writer
    comes; it is opened non-blocking and checked again on the open file, so a swap in between cannot
    block either. Raise :class:`RegistryError` for any other kind of file and for a dangling link.
    """
    try:
        st = path.stat()  # follows a link, never opens
        if not stat.S_ISREG(st.st_mode):
            raise _not_a_file(path, st.st_mode)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if path.is_symlink():
            # A dangling (or looping) link is this file's error: skipped, its table's DAG would vanish unseen.
            target = os.readlink(path)
            raise RegistryError(
                str(path),
                None,
                [
                    f"is a symbolic link to {target}, which cannot be opened ({exc.strerror}); restore {target}, "
                    "point the link at an existing file, or delete the link"
                ],
                [str(path)],  # the file itself: the link has no line to point at
            ) from exc
        raise
    fh = os.fdopen(fd, "rb")
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        fh.close()
        raise _not_a_file(path, mode)
    return fh


def _read_text(path: Path) -> str:
    """A registry file's text: at most :data:`MAX_FILE_BYTES`, UTF-8; raise :class:`RegistryError`.

    A path that is not a regular file (or a symbolic link to one) is an error naming it, never opened.
    """
    with _open_regular(path) as fh:
        data = fh.read(MAX_FILE_BYTES + 1)  # never more, whatever the file's size
    if len(data) > MAX_FILE_BYTES:
        raise RegistryError(str(path), None, [f"larger than {MAX_FILE_BYTES} bytes; a registry entry is a few KiB"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RegistryError(
            str(path), None, [f"not UTF-8 text: byte {data[exc.start]:#04x} at offset {exc.start}"]
        ) from exc


def registry_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The registry files of a directory, sorted by name (deterministic DAG order)."""
    d = Path(directory)
    if not d.is_dir():
        return []
    # By name: the same order as sorting the paths (one directory), without pathlib's slow comparisons.
    # Every kind of path is kept, not only regular files: a dangling symlink, a FIFO, a directory named
    # x.yaml are errors when loaded (:func:`_read_text`) instead of tables that vanish without a word.
    return sorted((p for p in d.iterdir() if p.suffix in REGISTRY_SUFFIXES), key=lambda p: p.name)


def load_registry(directory: str | os.PathLike[str], dag_id: str | None = None) -> list[RegistryEntry]:
    """Load every registry file of ``directory``; cached per process until a file changes.

    With ``dag_id`` (Airflow's parsing context: a task's process needs only its own DAG) only
    the entries that can define that DAG are returned (every entry if none can), with the
    verdict the full load gives them: the checks across files (one table per file, no
    overlapping storage roots) still see every file, through :func:`_related_files`, which
    reads the other files' names and ``storage_root`` lines instead of validating them all.
    """
    files = registry_files(directory)
    signature = _signature(files)
    # The databases' defaults files are part of every entry's meaning, so of the cache key.
    defaults_sig = _signature(database_defaults_files(directory))
    # Relative storage roots hang off $CDC_LAKE_BASE: it is part of what the entries mean.
    lake_base = os.environ.get("CDC_LAKE_BASE")
    resolved = str(Path(directory).resolve())
    # The other registry directories sharing the lake: their tables' roots are checked against these.
    others = _others_signature(resolved)
    if dag_id is not None:
        own = {str(p) for p in files if RegistryEntry(p, None, None).dag_id == dag_id}
        if own:
            related = _related_files(resolved, signature, frozenset(own), lake_base, defaults_sig)
            subset = tuple(s for s in signature if s[0] in related)
            loaded = _load_cached(resolved, subset, lake_base, defaults_sig, others=others)
            return [e for e in loaded if str(e.path) in own]
    # The whole registry (the DAG processor's parse, every 30 s in a fresh process) is shared across
    # processes; a task's subset is cheap to validate and would only crowd the whole one out.
    return list(_load_cached(resolved, signature, lake_base, defaults_sig, share=True, others=others))


Signature = tuple[tuple[str, int, int], ...]
#: Each other registry directory (resolved) with the signatures of its files and of its defaults files.
OthersSignature = tuple[tuple[str, Signature, Signature], ...]


def _others_signature(directory: str) -> OthersSignature:
    """``$CDC_OTHER_REGISTRY_DIRS`` (this directory and repeats left out), with what their files are now.

    Listing and ``stat`` only (no file is read): part of every cache key, so a change there is seen.
    A directory that is missing or cannot be listed has no tables to clash with (a warning says so).
    """
    from cdc_compaction.core.settings import other_registry_dirs

    out: list[tuple[str, Signature, Signature]] = []
    seen = {directory}
    for d in other_registry_dirs():
        try:
            where = str(d.resolve())
            if where in seen:
                continue
            seen.add(where)
            out.append((where, _signature(registry_files(where)), _signature(database_defaults_files(where))))
        except (OSError, RuntimeError) as exc:
            log.warning(
                "the other registry directory %s cannot be read (%s): its tables' roots are not checked", d, exc
            )
    return tuple(out)


def _signature(files: list[Path]) -> tuple[tuple[str, int, int], ...]:
    out = []
    for p in files:
        try:
            st = p.stat()
        except OSError:  # a dangling link: the link's own times, so fixing it is seen
            st = p.lstat()
        out.append((str(p), st.st_mtime_ns, st.st_size))
    return tuple(out)


#: A top-level ``storage_root: <value>`` line (block style), with an optional trailing comment.
_ROOT_LINE = re.compile(r"^storage_root[ \t]*:[ \t]*(.*?)[ \t]*(?:[ \t]#.*)?$")
#: :func:`_declared_root_key` of a file that cannot be a valid entry: it takes part in no check.
_NO_ENTRY = ""


def _declared_root_key(path: Path) -> str | None:
    """The storage root key of a registry file, read cheaply; None when only a full parse can tell.

    A valid entry's root is exactly its last top-level ``storage_root:`` line (quotes and
    comment aside) whenever that line holds only the characters a root may have; anything
    else (flow style, a value on the next line, escapes, aliases) returns None.
    """
    try:
        text = _read_text(path)
    except (RegistryError, OSError):
        return _NO_ENTRY  # unreadable: the full load makes it an error, so it overlaps nothing
    # Only lines starting with the key go through the regex (a full-text MULTILINE scan costs 3x).
    found = [
        m.group(1) for line in text.splitlines() if line.startswith("storage_root") and (m := _ROOT_LINE.match(line))
    ]
    if not found:
        return None
    value = found[-1]
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    if not _PATH_CHARS.match(value):
        return None
    try:
        return storage_root_key(value)
    except (OSError, ValueError, RuntimeError):
        return None


def _parsed_root_key(path: Path, defaults: dict[str, DatabaseDefaults]) -> str:
    try:
        return storage_root_key(parse_entry(path, _read_text(path), defaults).storage_root)
    except Exception:  # noqa: BLE001 - an invalid entry takes part in no check across files
        return _NO_ENTRY


def _roots_overlap(a: str, b: str) -> bool:
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


@functools.lru_cache(maxsize=16)
def _related_files(
    directory: str,
    signature: tuple[tuple[str, int, int], ...],
    own: frozenset[str],
    lake_base: str | None,
    defaults_sig: tuple[tuple[str, int, int], ...] = (),
) -> frozenset[str]:
    """``own`` plus every file whose entry can change their verdict in the checks across files.

    Those are the files that may define the same table (the same file name, ignoring case: a
    valid entry's file is named after its table) or whose storage root is the same as or
    nested with one of theirs, and, in turn, the files that may define the same table as one
    of those (a duplicate is refused before roots are compared). Loading only these gives
    ``own`` the verdict of the full load. Each file is read, not validated (500 files: about
    30 ms instead of about 1 s); only files whose root line is unusual are parsed in full.
    """
    del lake_base  # part of the cache key only: relative roots resolve against it
    paths = [Path(f) for f, _mtime, _size in signature]
    keys: dict[Path, str] = {}
    defaults = _defaults_cached(defaults_sig)
    for p in paths:
        key = _declared_root_key(p)
        keys[p] = _parsed_root_key(p, defaults) if key is None else key

    def stem(p: Path) -> str:
        return p.name.rsplit(".", 1)[0].lower()

    related = {p for p in paths if str(p) in own}
    related |= {q for q in paths for p in list(related) if stem(q) == stem(p)}
    overlapping = {
        q
        for q in paths
        for p in related
        if keys[p] and keys[q] and q not in related and _roots_overlap(keys[p], keys[q])
    }
    related |= overlapping
    related |= {q for q in paths for p in overlapping if stem(q) == stem(p)}
    return frozenset(str(p) for p in related)


def storage_root_key(root: str) -> str:
    """A storage root as one comparable location: resolved if local, ``s3a://`` spelled ``s3://``."""
    from cdc_compaction.core.settings import resolve_storage_root

    if root.startswith(("s3://", "s3a://")):
        # s3:// and s3a:// name the same objects; empty and '.' segments do not make a new place.
        bucket, _, prefix = root.split("://", 1)[1].partition("/")
        parts = [p for p in prefix.split("/") if p not in ("", ".")]
        return "s3://" + "/".join([bucket, *parts])
    return "file://" + resolve_storage_root(root)


def _where_in(path: Path, key: str) -> str | None:
    """``file:line:col`` of a valid entry's top-level ``key`` value (for an error found across files)."""
    try:
        return load_located(_read_text(path), str(path), _SAFE_LOADER).nearest((key,))
    except Exception:  # noqa: BLE001 - a location is a courtesy: the error stands without it
        return None


@functools.lru_cache(maxsize=16)
def _other_root_keys(others: OthersSignature) -> tuple[tuple[str, str, str], ...]:
    """The root key of every file of the other registry directories, read cheaply (as :func:`_related_files`
    does), with the file and its directory's defaults signature: (key, file, directory)."""
    out = []
    for directory, signature, defaults_sig in others:
        defaults = _defaults_cached(defaults_sig)
        for file, _mtime, _size in signature:
            path = Path(file)
            key = _declared_root_key(path)
            key = _parsed_root_key(path, defaults) if key is None else key
            if key:
                out.append((key, file, directory))
    return tuple(sorted(out))


@functools.lru_cache(maxsize=256)
def _other_entry(file: str, mtime: int, size: int, defaults_sig: Signature) -> TableConfig | None:
    """The validated entry of another registry directory's file, or None when it is invalid (it takes part
    in no check, as an invalid file of this directory does)."""
    del mtime, size  # part of the cache key only
    try:
        return parse_entry(Path(file), _read_text(Path(file)), _defaults_cached(defaults_sig))
    except Exception:  # noqa: BLE001 - another directory's bad file is that directory's error, not ours
        return None


def _foreign_clashes(key: str, others: OthersSignature) -> list[tuple[Path, TableConfig]]:
    """The valid entries of the other registry directories whose roots are the same as or nested with ``key``."""
    if not others:
        return []
    import bisect

    keys = _other_root_keys(others)
    parts = key.split("/")
    ancestors = {"/".join(parts[:n]) for n in range(3, len(parts) + 1)}
    found = [k for k in keys if k[0] in ancestors]  # the same root or one around it (few: a path's ancestors)
    at = bisect.bisect_left(keys, (key + "/",))
    while at < len(keys) and keys[at][0].startswith(key + "/"):  # roots inside it, adjacent once sorted
        found.append(keys[at])
        at += 1
    stats = {f: (m, z) for _d, sig, _ds in others for f, m, z in sig}
    defaults_of = {d: ds for d, _sig, ds in others}
    out = []
    for _key, file, directory in sorted(set(found), key=lambda k: k[1]):
        cfg = _other_entry(file, *stats[file], defaults_of[directory])
        if cfg is not None and _roots_overlap(key, storage_root_key(cfg.storage_root)):
            out.append((Path(file), cfg))
    return out


def _refuse_overlapping_roots(entries: list[RegistryEntry], others: OthersSignature = ()) -> None:
    """Refuse entries whose storage roots are the same or nested: both tables would read each other's files.

    Both entries become errors (not only the later one: file-name order says nothing about which
    table came first), and each error names the other entry's file, table and root. So does an entry
    whose root is the same as or nested with a table's of another registry directory sharing the lake
    (``others``, :func:`~cdc_compaction.core.settings.other_registry_dirs`); that table's error is
    reported when its own directory is loaded.
    """
    by_key: dict[str, list[int]] = {}
    for i, e in enumerate(entries):
        if e.config is not None:
            by_key.setdefault(storage_root_key(e.config.storage_root), []).append(i)
    foreign: dict[int, list[tuple[Path, TableConfig]]] = {}
    for key, idxs in by_key.items() if others else ():
        found = _foreign_clashes(key, others)
        for i in idxs if found else ():
            foreign[i] = found
    clashes: dict[int, list[int]] = {}
    for key, idxs in by_key.items():
        # The same root, or an ancestor of this root (checked at '/' boundaries: /lake/t2 is not under /lake/t).
        others = list(idxs)
        parts = key.split("/")
        for n in range(len(parts) - 1, 2, -1):
            others += by_key.get("/".join(parts[:n]), [])
        for i in idxs:
            for j in others:
                if i != j:
                    clashes.setdefault(i, []).append(j)
                    clashes.setdefault(j, []).append(i)
    configs = {i: e.config for i, e in enumerate(entries) if e.config is not None}
    for i in sorted(set(clashes) | set(foreign)):
        cfg = configs[i]
        problems = []
        for j in sorted(set(clashes.get(i, []))):
            other = configs[j]
            problems.append(
                f"field 'storage_root': {cfg.storage_root!r} overlaps storage_root {other.storage_root!r} of "
                f"{entries[j].path} (table {other.qualified_name}); every table needs its own storage root, "
                "neither equal to nor inside another table's"
            )
        for path, other in foreign.get(i, []):
            problems.append(
                f"field 'storage_root': {cfg.storage_root!r} overlaps storage_root {other.storage_root!r} of "
                f"{path} (table {other.qualified_name}, in the other registry directory {path.parent} of "
                "$CDC_OTHER_REGISTRY_DIRS, which shares this lake); every table needs its own storage root, "
                "neither equal to nor inside another table's: move one of them"
            )
        where = [_where_in(entries[i].path, "storage_root")] * len(problems)
        entries[i] = RegistryEntry(
            entries[i].path, None, RegistryError(str(entries[i].path), cfg.qualified_name, problems, where)
        )


#: Where validated registries are kept between processes (``$CDC_PARSE_CACHE_DIR``; ``off``: nowhere).
PARSE_CACHE_ENV = "CDC_PARSE_CACHE_DIR"
_PARSE_CACHE_FORMAT = 1
_PARSE_CACHE_KEEP = 8


def _parse_cache_dir() -> Path | None:
    """The cache directory, created private to this user; None when off or not safe to read from."""
    import stat

    setting = os.environ.get(PARSE_CACHE_ENV, "")
    if setting.lower() == "off":
        return None
    base = Path(setting) if setting else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    d = base / "cdc_compaction" / "registry" if not setting else base
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = d.stat()
    except OSError:
        return None
    # The cache holds pickles: read them only from a directory nobody else can write to.
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        log.warning("not using the registry parse cache %s: it is not private to this user", d)
        return None
    return d


@functools.cache
def _code_signature() -> str:
    """What the validation code is: every module of this package (name, mtime, size) and pydantic's version."""
    import pydantic

    root = Path(__file__).resolve().parents[1]  # the whole package: modes define models too
    parts = [pydantic.VERSION, yaml.__version__]
    for p in sorted(root.rglob("*.py")):
        st = p.stat()
        parts.append(f"{p.relative_to(root)}:{st.st_mtime_ns}:{st.st_size}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _digest(file: str) -> bytes:
    """A file's bytes, hashed; a path that is not a regular file is hashed by its kind, never opened
    (opening a FIFO blocks)."""
    try:
        with _open_regular(Path(file)) as fh:
            return hashlib.sha256(fh.read(MAX_FILE_BYTES + 1)).digest()
    except RegistryError as exc:
        return hashlib.sha256(repr(exc.problems).encode("utf-8", "surrogateescape")).digest()


def _parse_cache_key(
    directory: str,
    files: tuple[str, ...],
    lake_base: str | None,
    defaults_files: tuple[str, ...],
    others: OthersSignature = (),
) -> str:
    """A hash of everything a validated entry depends on: the files' bytes, their names, the code, the environment.

    By content, not by modification time: another process (the DAG processor parses the DAG file
    every 30 s in a fresh one) must never be handed entries of an edited file.
    """
    h = hashlib.sha256()
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("CDC_") and k != PARSE_CACHE_ENV)
    # Where a storage root may not be depends on these too (core/roots.py).
    env += [
        (k, os.environ.get(k, ""))
        for k in ("HOME", "AIRFLOW_HOME", "AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__PLUGINS_FOLDER")
    ]
    head = [_PARSE_CACHE_FORMAT, _code_signature(), directory, lake_base, os.getcwd(), env]
    h.update(repr(head).encode())
    # The other registry directories' files too: a table there may now overlap one here.
    other_groups = [
        tuple(f for f, _, _ in sig) for _d, files_sig, defaults_sig in others for sig in (files_sig, defaults_sig)
    ]
    for group in (files, defaults_files, *other_groups):
        h.update(b"\0group")
        for f in group:
            h.update(f.encode("utf-8", "surrogateescape") + b"\0")
            h.update(_digest(f))  # the raw bytes, whatever the file holds
    return h.hexdigest()


def _cached_across_processes(
    directory: str,
    signature: tuple[tuple[str, int, int], ...],
    lake_base: str | None,
    defaults_sig: tuple[tuple[str, int, int], ...],
    others: OthersSignature = (),
) -> tuple[RegistryEntry, ...]:
    """:func:`_validate_all`, reusing the entries an earlier process validated from the same bytes.

    Only a registry whose every entry is valid is kept (errors are rare and re-explained each
    time). Any trouble with the cache (unreadable, full disk, a stale pickle) falls back to
    validating: the cache can make a parse faster, never different.
    """
    import pickle

    cache = _parse_cache_dir()
    key = None
    if cache is not None:
        try:
            key = _parse_cache_key(
                directory,
                tuple(f for f, _, _ in signature),
                lake_base,
                tuple(f for f, _, _ in defaults_sig),
                others,
            )
            hit = cache / f"{key}.pickle"
            if hit.is_file():
                entries = pickle.loads(hit.read_bytes())  # our own file, in a private directory
                if isinstance(entries, tuple) and all(isinstance(e, RegistryEntry) for e in entries):
                    return entries
        except Exception:  # a cache problem must not fail the parse
            log.debug("registry parse cache unusable; validating every file", exc_info=True)
    entries = _validate_all(signature, defaults_sig, directory, others)
    if cache is not None and key is not None and all(e.error is None for e in entries):
        try:
            tmp = cache / f".{key}.{os.getpid()}.tmp"
            tmp.write_bytes(pickle.dumps(entries, protocol=pickle.HIGHEST_PROTOCOL))
            os.replace(tmp, cache / f"{key}.pickle")
            old = sorted(cache.glob("*.pickle"), key=lambda p: p.stat().st_mtime, reverse=True)
            for stale in old[_PARSE_CACHE_KEEP:]:
                stale.unlink(missing_ok=True)
        except Exception:  # as above: the parse goes on without the cache
            log.debug("could not write the registry parse cache", exc_info=True)
    return entries


@functools.lru_cache(maxsize=16)
def _load_cached(
    directory: str,
    signature: tuple[tuple[str, int, int], ...],
    lake_base: str | None,
    defaults_sig: tuple[tuple[str, int, int], ...] = (),
    share: bool = False,
    others: OthersSignature = (),
) -> tuple[RegistryEntry, ...]:
    # Once per process here; with ``share`` across processes too (the parse cache, keyed by the files' bytes).
    if share:
        return _cached_across_processes(directory, signature, lake_base, defaults_sig, others)
    return _validate_all(signature, defaults_sig, directory, others)


def _refuse_roots_in_registry(entries: list[RegistryEntry], directory: str) -> None:
    """Refuse a local root that is the loaded registry directory, an ancestor of it or inside it.

    The configured ones (``$CDC_REGISTRY_DIR``, ``$CDC_OTHER_REGISTRY_DIRS``) are refused by the entry's own
    validation (:mod:`~cdc_compaction.core.roots`); this is the one ``registry validate --dir`` names.
    """
    from cdc_compaction.core import roots

    for i, e in enumerate(entries):
        key = storage_root_key(e.config.storage_root) if e.config is not None else ""
        why = roots.refusal(key[len("file://") :], [directory]) if key.startswith("file://") else None
        if why is not None:
            assert e.config is not None
            problem = f"field 'storage_root': {e.config.storage_root!r} {why}"
            where = [_where_in(e.path, "storage_root")]
            entries[i] = RegistryEntry(
                e.path, None, RegistryError(str(e.path), e.config.qualified_name, [problem], where)
            )


def _validate_all(
    signature: tuple[tuple[str, int, int], ...],
    defaults_sig: tuple[tuple[str, int, int], ...],
    directory: str | None = None,
    others: OthersSignature = (),
) -> tuple[RegistryEntry, ...]:
    """Validate every file of ``signature`` and check them against each other (one table per file, own roots)
    and against the tables of the other registry directories sharing the lake (``others``)."""
    entries: list[RegistryEntry] = []
    defaults = _defaults_cached(defaults_sig)
    for file, _mtime, _size in signature:
        path = Path(file)
        try:
            entries.append(RegistryEntry(path, parse_entry(path, _read_text(path), defaults), None))
        except RegistryError as exc:
            entries.append(RegistryEntry(path, None, exc))
        except OSError as exc:
            entries.append(RegistryEntry(path, None, RegistryError(file, None, [f"cannot read: {exc}"])))
        except Exception as exc:  # noqa: BLE001 - whatever one file does, it must not hide the other tables
            problem = f"cannot be loaded: {type(exc).__name__}: {exc}"[:1000]
            entries.append(RegistryEntry(path, None, RegistryError(file, None, [problem])))
    # Two files claiming the same table would fight over one lake location: refuse both.
    by_name: dict[str, list[int]] = {}
    for i, e in enumerate(entries):
        if e.config is not None:
            by_name.setdefault(e.config.qualified_name.lower(), []).append(i)
    for name, idxs in by_name.items():
        if len(idxs) > 1:
            files = [entries[i].path.name for i in idxs]
            for i in idxs:
                e = entries[i]
                entries[i] = RegistryEntry(
                    e.path,
                    None,
                    RegistryError(
                        str(e.path),
                        name,
                        [f"field 'table': {name} is defined by several files {files}; keep one of them"],
                        [_where_in(e.path, "table")],
                    ),
                )
    if directory is not None:
        _refuse_roots_in_registry(entries, directory)
    _refuse_overlapping_roots(entries, others)
    return tuple(entries)


def load_table(directory: str | os.PathLike[str], qualified_name: str) -> TableConfig:
    """Return one valid table config by ``database.table``, or raise its registry error."""
    for e in load_registry(directory):
        name = e.config.qualified_name if e.config else e.path.name.rsplit(".", 1)[0]
        if name == qualified_name:
            if e.error is not None:
                raise e.error
            assert e.config is not None
            return e.config
    raise RegistryError(str(directory), qualified_name, ["no registry file defines this table"])
