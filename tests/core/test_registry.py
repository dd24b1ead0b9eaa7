"""Unit tests of the table registry: YAML entries validated into ``TableConfig``.

Pure Python and fast: no Spark, no metastore, no Airflow DAG runs.  The bad-entry
table below is the heart of it: every kind of mistake a registry author can make must
be refused with a message that names the offending field, the file and the table.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import STUDENT_COLUMNS
from pydantic import ValidationError

from cdc_compaction.core.exceptions import RegistryError
from cdc_compaction.core.registry import (
    Alerts,
    Column,
    Increments,
    OpCodes,
    RegistryEntry,
    SparkSettings,
    TableConfig,
    load_registry,
    load_table,
    parse_entry,
    parse_table,
)
from cdc_compaction.modes.cdc import CdcTable

SHIPPED_REGISTRY = Path(__file__).resolve().parents[2] / "include" / "registry"

Doc = dict[str, Any]


# -- helpers -------------------------------------------------------------------------


def good_doc(database: str = "tests", table: str = "student", **overrides: Any) -> Doc:
    """A valid registry entry shaped like the student table; ``overrides`` replace top-level keys."""
    doc: Doc = {
        "database": database,
        "table": table,
        "columns": [dict(c) for c in STUDENT_COLUMNS],
        "primary_key": ["id"],
        "order_by": ["ts_ms"],
        # One root per table: two tables may not share (or nest) storage roots.
        "storage_root": f"/lake/{database}/{table}",
    }
    doc.update(overrides)
    return doc


def write_yaml(directory: Path, name: str, doc: Any) -> Path:
    """Write ``doc`` as YAML into ``directory/name`` and return the path."""
    path = directory / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def write_text(directory: Path, name: str, text: str) -> Path:
    """Write raw registry text (for YAML that ``safe_dump`` cannot produce)."""
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def parse_file(path: Path) -> TableConfig:
    return parse_entry(path, path.read_text(encoding="utf-8"))


def refusal(path: Path) -> RegistryError:
    """Parse ``path`` and return the RegistryError it must raise."""
    with pytest.raises(RegistryError) as exc_info:
        parse_file(path)
    return exc_info.value


def names_field(err: RegistryError, field_name: str) -> bool:
    return any(p.startswith(f"field '{field_name}':") for p in err.problems)


def with_extra_column(name: Any = "extra", type_: Any = "string", **more: Any) -> Callable[[Doc], None]:
    """A mutation appending one column (it lands at index 4 of ``good_doc``'s columns)."""

    def mutate(doc: Doc) -> None:
        doc["columns"].append({"name": name, "type": type_, **more})

    return mutate


def _both(*mutations: Callable[[Doc], None]) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        for m in mutations:
            m(doc)

    return mutate


def setting(key: str, value: Any) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        doc[key] = value

    return mutate


def dropping(key: str) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        del doc[key]

    return mutate


def set_column(index: int, **values: Any) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        doc["columns"][index].update(values)

    return mutate


def renaming(old: str, new: str) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        doc[new] = doc.pop(old)

    return mutate


# -- the shipped registry ------------------------------------------------------------


def test_shipped_registry_loads_without_errors() -> None:
    entries = load_registry(SHIPPED_REGISTRY)
    assert [e.path.name for e in entries] == ["school.student.yaml", "shop.orders.yaml"]
    for e in entries:
        assert e.error is None, str(e.error)
        assert e.config is not None
    assert [e.dag_id for e in entries] == ["cdc__school__student", "cdc__shop__orders"]


def test_shipped_student_gets_the_defaults() -> None:
    cfg = load_table(SHIPPED_REGISTRY, "school.student")
    assert cfg.qualified_name == "school.student"
    assert cfg.column_names == ["id", "full_name", "op", "ts_ms"]
    assert cfg.value_columns == ["full_name", "op", "ts_ms"]
    assert cfg.op_codes == OpCodes(create="c", read="r", update="u", delete="d")
    assert cfg.op_codes.upserts == ["c", "r", "u"]
    assert cfg.schedule == "@hourly"
    assert cfg.retries == 3
    assert cfg.retry_delay == timedelta(minutes=1)
    assert cfg.tombstone_retention == timedelta(days=7)
    assert cfg.keep_versions == 3
    assert (cfg.lease_timeout, cfg.on_bad_file, cfg.on_extra_columns) == (timedelta(hours=6), "fail", "fail")
    assert cfg.increments.prefix == "increment_"
    assert cfg.increments.time_format == "%Y%m%d%H"
    assert cfg.increments.completion == "settle"
    assert cfg.increments.directory == "incremental"
    assert cfg.alerts == Alerts()
    assert (cfg.alerts.slack_conn_id, cfg.alerts.sns_topic_arn, cfg.alerts.aws_conn_id) == (None, None, "aws_default")
    assert cfg.spark == SparkSettings()
    assert cfg.start_date.tzinfo is not None


def test_shipped_orders_overrides_and_reserved_word_columns() -> None:
    cfg = load_table(SHIPPED_REGISTRY, "shop.orders")
    assert cfg.primary_key == ["tenant", "order_no"]
    assert cfg.order_by == ["lsn"]
    assert "timestamp" in cfg.column_names
    assert "order" in cfg.column_names
    types = {c.name: c.type for c in cfg.columns}
    assert types["amount"] == "decimal(12,2)"
    assert types["timestamp"] == "timestamp"
    assert cfg.retries == 2
    assert cfg.tombstone_retention == timedelta(days=14)
    assert cfg.keep_versions == 5
    assert cfg.spark.conf == {"spark.sql.shuffle.partitions": "4"}
    # Not overridden in the file, so still the defaults.
    assert cfg.op_codes.delete == "d"
    assert cfg.increments.completion == "settle"


def test_defaults_of_a_minimal_entry() -> None:
    cfg = parse_table(good_doc())
    assert cfg.op_column == "op"
    assert (cfg.op_codes.create, cfg.op_codes.read, cfg.op_codes.update, cfg.op_codes.delete) == ("c", "r", "u", "d")
    assert cfg.schedule == "@hourly"
    assert cfg.retries == 3
    assert cfg.tombstone_retention == timedelta(days=7)
    assert cfg.keep_versions == 3
    assert cfg.increments == Increments(prefix="increment_", time_format="%Y%m%d%H", completion="settle")
    assert cfg.dag_id == "cdc__tests__student"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("36h", timedelta(hours=36), id="36h"),
        pytest.param("90m", timedelta(minutes=90), id="90m"),
        pytest.param("14d", timedelta(days=14), id="14d"),
        pytest.param("2w", timedelta(weeks=2), id="2w"),
        pytest.param("45s", timedelta(seconds=45), id="45s"),
        pytest.param(" 36 h ", timedelta(hours=36), id="spaces"),
        pytest.param(3600, timedelta(hours=1), id="int-seconds"),
        pytest.param(0, timedelta(0), id="zero"),
    ],
)
def test_durations_parse(value: Any, expected: timedelta) -> None:
    cfg = parse_table(good_doc(tombstone_retention=value))
    assert cfg.tombstone_retention == expected


def test_retry_delays_parse_from_yaml(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "tests.student.yaml", good_doc(retry_delay="90m", max_retry_delay="36h"))
    cfg = parse_file(path)
    assert cfg.retry_delay == timedelta(minutes=90)
    assert cfg.max_retry_delay == timedelta(hours=36)


def test_spark_conf_values_become_strings() -> None:
    cfg = parse_table(good_doc(spark={"conf": {"spark.a.enabled": True, "spark.b.count": 4}}))
    assert cfg.spark.conf == {"spark.a.enabled": "true", "spark.b.count": "4"}


def test_parquet_timestamps_default_to_micros_and_spark_conf_cannot_set_them_behind_its_back() -> None:
    """The job sets Spark's timestamp type from ``parquet_timestamps``: a spark.conf entry would be overridden."""
    assert parse_table(good_doc()).parquet_timestamps == "micros"
    assert parse_table(good_doc(parquet_timestamps="int96")).parquet_timestamps == "int96"
    with pytest.raises(ValidationError, match="parquet_timestamps"):
        parse_table(good_doc(parquet_timestamps="millis"))
    with pytest.raises(ValidationError, match=r"outputTimestampType'.*set parquet_timestamps"):
        parse_table(good_doc(spark={"conf": {"spark.sql.parquet.outputTimestampType": "INT96"}}))


def test_column_type_is_normalised() -> None:
    col = Column(name="amount", type=" Decimal( 12, 2 ) ")
    assert col.type == "decimal(12,2)"
    assert Column(name="n", type="INTEGER").type == "int"


@pytest.mark.parametrize(
    ("column", "type_", "transform"),
    [
        ("full_name", "string", "identity"),
        ("id", "int", "identity"),  # a key column: keys never move between partitions
        ("ts_ms", "bigint", "identity"),  # an order_by column
        ("changed_at", "timestamp", "day"),
        ("changed_at", "timestamp", "month"),
        ("changed_on", "date", "year"),
        ("changed_on", "date", "identity"),
        ("amount", "decimal(10,2)", "identity"),
        ("code", "varchar(8)", "identity"),
    ],
)
def test_partition_by_accepts(column: str, type_: str, transform: str) -> None:
    doc = good_doc(partition_by={"column": column, "transform": transform})
    if column not in {c["name"] for c in doc["columns"]}:
        doc["columns"].append({"name": column, "type": type_})
    cfg = parse_table(doc)
    assert cfg.partition_by is not None
    assert (cfg.partition_by.column, cfg.partition_by.transform) == (column, transform)


def test_partition_by_defaults() -> None:
    assert parse_table(good_doc()).partition_by is None
    cfg = parse_table(good_doc(partition_by={"column": "full_name"}))
    assert cfg.partition_by is not None and cfg.partition_by.transform == "identity"


def test_models_are_frozen() -> None:
    cfg = parse_table(good_doc())
    with pytest.raises(ValidationError, match="frozen"):
        cfg.retries = 5  # type: ignore[misc]


# -- bad entries ---------------------------------------------------------------------

BAD_IDENTIFIERS = [
    pytest.param("x; DROP TABLE y", id="sql-injection"),
    pytest.param("a`b", id="backtick"),
    pytest.param("a'b", id="single-quote"),
    pytest.param('a"b', id="double-quote"),
    pytest.param("a b", id="space"),
    pytest.param("a.b", id="dot"),
    pytest.param("1abc", id="leading-digit"),
    pytest.param("", id="empty"),
    pytest.param("a" * 129, id="129-chars"),
]


@dataclass(frozen=True)
class Bad:
    """One bad registry entry: how to break a good doc, and what the error must say."""

    mutate: Callable[[Doc], None]
    field: str
    fragment: str
    # True where the check lives in TableConfig's model validator (no pydantic location of its own).
    cross_field: bool = False


def _bad_cases() -> list[Any]:
    cases: list[Any] = [
        pytest.param(Bad(dropping("primary_key"), "primary_key", "Field required"), id="primary_key-missing"),
        pytest.param(Bad(setting("primary_key", []), "primary_key", "at least 1 item"), id="primary_key-empty"),
        pytest.param(
            Bad(setting("primary_key", ["nope"]), "primary_key", "['nope'] not among the columns", cross_field=True),
            id="primary_key-not-a-column",
        ),
        pytest.param(
            Bad(setting("primary_key", ["ID"]), "primary_key", "['ID'] not among the columns", cross_field=True),
            id="primary_key-wrong-case",
        ),
        pytest.param(
            Bad(setting("primary_key", ["id", "id"]), "primary_key", "lists a column twice"),
            id="primary_key-twice",
        ),
        pytest.param(
            Bad(setting("primary_key", ["x; DROP TABLE y"]), "primary_key", "is not a valid identifier"),
            id="primary_key-injection",
        ),
        pytest.param(Bad(dropping("order_by"), "order_by", "Field required"), id="order_by-missing"),
        pytest.param(
            Bad(setting("order_by", ["nope"]), "order_by", "['nope'] not among the columns", cross_field=True),
            id="order_by-not-a-column",
        ),
        pytest.param(
            Bad(
                set_column(3, type="boolean"),
                "order_by",
                "column 'ts_ms' of type boolean cannot order events",
                cross_field=True,
            ),
            id="order_by-boolean",
        ),
        pytest.param(
            Bad(setting("op_column", "nope"), "op_column", "'nope' is not among the columns", cross_field=True),
            id="op_column-not-a-column",
        ),
        pytest.param(
            Bad(set_column(2, type="int"), "op_column", "column 'op' must have type string", cross_field=True),
            id="op_column-not-string",
        ),
        pytest.param(
            Bad(
                setting("primary_key", ["id", "op"]),
                "op_column",
                "must not be part of primary_key or order_by",
                cross_field=True,
            ),
            id="op_column-in-primary_key",
        ),
        pytest.param(
            Bad(
                setting("order_by", ["ts_ms", "op"]),
                "op_column",
                "must not be part of primary_key or order_by",
                cross_field=True,
            ),
            id="op_column-in-order_by",
        ),
        pytest.param(
            Bad(setting("op_column", "x; DROP TABLE y"), "op_column", "is not a valid identifier"),
            id="op_column-injection",
        ),
        pytest.param(
            Bad(with_extra_column("id", "int"), "columns", "duplicate column names ['id']", cross_field=True),
            id="columns-duplicate",
        ),
        pytest.param(
            Bad(with_extra_column("Id", "int"), "columns", "duplicate column names ['id']", cross_field=True),
            id="columns-duplicate-case-insensitive",
        ),
        pytest.param(Bad(setting("columns", []), "columns", "at least 1 item"), id="columns-empty"),
        pytest.param(
            Bad(with_extra_column("x", "varchar2"), "columns.4.type", "unknown Hive type 'varchar2'"),
            id="type-varchar2",
        ),
        pytest.param(
            Bad(with_extra_column("x", "map<string,int>"), "columns.4.type", "unknown Hive type 'map<string,int>'"),
            id="type-map",
        ),
        pytest.param(
            Bad(with_extra_column("x", "decimal(5,7)"), "columns.4.type", "scale is larger than its precision"),
            id="type-decimal-scale-gt-precision",
        ),
        pytest.param(
            Bad(with_extra_column("_cdc_x", "int"), "columns.4.name", "reserved for the package"),
            id="column-reserved-prefix",
        ),
        pytest.param(
            Bad(with_extra_column("_CDC_Pos", "int"), "columns.4.name", "reserved for the package"),
            id="column-reserved-prefix-upper",
        ),
        pytest.param(
            Bad(with_extra_column("cdc_partition", "string"), "columns.4.name", "'cdc_partition' is reserved"),
            id="column-reserved-partition-directory-name",
        ),
        pytest.param(
            Bad(with_extra_column("CDC_Partition", "int"), "columns.4.name", "rename the column"),
            id="column-reserved-partition-directory-name-upper",
        ),
        pytest.param(
            Bad(with_extra_column("x", "string", comment="two\nlines"), "columns.4.comment", "single-line"),
            id="comment-newline",
        ),
        pytest.param(
            Bad(
                with_extra_column("x", "string", comment="c" * 257),
                "columns.4.comment",
                "at most 256 characters (the Hive metastore's COLUMNS_V2.COMMENT is varchar(256))",
            ),
            id="comment-longer-than-the-metastore-holds",
        ),
        pytest.param(
            Bad(
                setting("table", "t" * 113),
                "table",
                f"derived name {'t' * 113 + '_pending_rejects'!r} is 129 characters; the Hive metastore",
                cross_field=True,
            ),
            id="table-derived-name-too-long",
        ),
        pytest.param(
            Bad(
                with_extra_column("x", "string", nullable=True), "columns.4.nullable", "Extra inputs are not permitted"
            ),
            id="column-unknown-key",
        ),
        pytest.param(
            Bad(renaming("primary_key", "primay_key"), "primay_key", "Extra inputs are not permitted"),
            id="typo-primay_key",
        ),
        pytest.param(Bad(setting("retries", -1), "retries", "greater than or equal to 0"), id="retries-negative"),
        pytest.param(Bad(setting("keep_versions", 0), "keep_versions", "greater than or equal to 1"), id="keep-zero"),
        pytest.param(
            Bad(setting("tombstone_retention", "soon"), "tombstone_retention", "'soon' is not a duration"),
            id="duration-garbage",
        ),
        pytest.param(
            Bad(setting("tombstone_retention", True), "tombstone_retention", "a duration such as '7d'"),
            id="duration-bool",
        ),
        pytest.param(
            Bad(
                setting("alerts", {"emails": ["not-an-address"]}), "alerts.emails", "'not-an-address' is not an e-mail"
            ),
            id="email-no-at",
        ),
        pytest.param(
            Bad(setting("alerts", {"emails": ["ops@example"]}), "alerts.emails", "'ops@example' is not an e-mail"),
            id="email-no-domain-dot",
        ),
        pytest.param(
            Bad(
                setting("alerts", {"sns_topic_arn": "cdc-alerts"}),
                "alerts.sns_topic_arn",
                "'cdc-alerts' is not an SNS topic ARN (arn:aws:sns:<region>",
            ),
            id="sns-topic-not-an-arn",
        ),
        pytest.param(
            Bad(
                setting("alerts", {"sns_topic_arn": "arn:aws:sqs:us-east-1:123456789012:cdc-alerts"}),
                "alerts.sns_topic_arn",
                "is not an SNS topic ARN",
            ),
            id="sns-topic-is-a-queue",
        ),
        pytest.param(
            Bad(
                setting("alerts", {"sns_topic_arn": "arn:aws:sns:us-east-1:123456789012:cdc-alerts.fifo"}),
                "alerts.sns_topic_arn",
                "is a FIFO topic",
            ),
            id="sns-topic-fifo",
        ),
        pytest.param(
            Bad(setting("op_codes", {"create": "c", "update": "c"}), "op_codes", "the four op codes must be distinct"),
            id="op_codes-not-distinct",
        ),
        pytest.param(
            Bad(setting("op_codes", {"delete": "x'y"}), "op_codes", "must be 1-16 letters"),
            id="op_codes-quote",
        ),
        pytest.param(
            Bad(setting("increments", {"prefix": "../up"}), "increments.prefix", "must be a plain name"),
            id="increments-prefix-path",
        ),
        pytest.param(
            Bad(setting("lease_timeout", "30s"), "lease_timeout", "must be at least 1m"),
            id="lease_timeout-too-short",
        ),
        pytest.param(
            Bad(setting("on_bad_file", "skip"), "on_bad_file", "'fail' or 'quarantine'"),
            id="on_bad_file-unknown",
        ),
        pytest.param(
            Bad(setting("on_extra_columns", "quarantine"), "on_extra_columns", "'fail' or 'ignore'"),
            id="on_extra_columns-unknown",
        ),
        pytest.param(
            Bad(setting("increments", {"time_format": "%Y/%m"}), "increments.time_format", "without '/'"),
            id="increments-time_format-slash",
        ),
        pytest.param(
            Bad(setting("spark", {"conf": {"spark x": "1"}}), "spark.conf", "'spark x' is not a valid property name"),
            id="spark-conf-key",
        ),
        pytest.param(Bad(setting("mode", "snapshots"), "mode", "'cdc'"), id="mode-unknown"),
        pytest.param(
            Bad(
                setting("partition_by", {"column": "nope"}),
                "partition_by",
                "column 'nope' is not among the columns",
                cross_field=True,
            ),
            id="partition_by-not-a-column",
        ),
        pytest.param(
            Bad(setting("partition_by", {"column": "op"}), "partition_by", "is the op column", cross_field=True),
            id="partition_by-op-column",
        ),
        pytest.param(
            Bad(
                setting("partition_by", {"column": "ts_ms", "transform": "day"}),
                "partition_by",
                "transform 'day' needs a date or timestamp column, but 'ts_ms' has type bigint",
                cross_field=True,
            ),
            id="partition_by-day-of-bigint",
        ),
        pytest.param(
            Bad(
                setting("partition_by", {"column": "full_name", "transform": "week"}),
                "partition_by.transform",
                "'identity', 'day', 'month' or 'year'",
            ),
            id="partition_by-unknown-transform",
        ),
        pytest.param(
            Bad(
                lambda d: (with_extra_column("score", "double")(d), setting("partition_by", {"column": "score"})(d)),
                "partition_by",
                "column 'score' of type double cannot name partitions",
                cross_field=True,
            ),
            id="partition_by-double",
        ),
        pytest.param(
            Bad(
                setting("partition_by", {"column": "x; DROP TABLE y"}), "partition_by.column", "not a valid identifier"
            ),
            id="partition_by-injection",
        ),
        pytest.param(
            Bad(setting("partition_by", {"columns": ["id"]}), "partition_by.columns", "Extra inputs are not permitted"),
            id="partition_by-typo",
        ),
    ]
    cases += [
        pytest.param(Bad(setting("views", {"metastore": []}), "views.metastore", "at least 1"), id="views-none"),
        pytest.param(
            Bad(setting("views", {"metastore": ["spark", "spark"]}), "views.metastore", "lists a dialect twice"),
            id="views-twice",
        ),
        pytest.param(
            Bad(setting("views", {"metastore": ["oracle"]}), "views.metastore.0", "'spark', 'hive' or 'trino'"),
            id="views-oracle",
        ),
        pytest.param(
            Bad(setting("views", {"duckdb": "/x/views.txt"}), "views.duckdb", "must end with .sql"), id="duckdb-ext"
        ),
        pytest.param(
            Bad(setting("views", {"duckdb": "s3://b/lake/v.duckdb"}), "views.duckdb", "must be local"),
            id="duckdb-file-on-s3",
        ),
        pytest.param(
            Bad(setting("views", {"duckdb": "/x/tests.duckdb"}), "views", "would be ambiguous"),
            id="duckdb-file-named-like-the-database",
        ),
        pytest.param(
            Bad(setting("views", {"trino_catalog": "hive; DROP"}), "views.trino_catalog", "not a valid identifier"),
            id="trino-catalog-injection",
        ),
        pytest.param(
            Bad(setting("event_time", {"column": "nope"}), "event_time", "is not among the columns"),
            id="event-time-unknown",
        ),
        pytest.param(
            Bad(setting("event_time", {"column": "full_name"}), "event_time", "has type string"),
            id="event-time-string",
        ),
        pytest.param(
            Bad(setting("event_time", {"column": "ts_ms", "unit": "days"}), "event_time.unit", "'s', 'ms'"),
            id="event-time-unit",
        ),
        pytest.param(
            Bad(
                _both(setting("views", {"metastore": ["spark", "trino"]}), setting("table", "t" * 110)), "table", "106"
            ),
            id="table-name-too-long-for-a-second-dialect",
        ),
    ]
    for what in ("database", "table"):
        for p in BAD_IDENTIFIERS:
            (name,) = p.values
            cases.append(
                pytest.param(
                    Bad(setting(what, name), what, f"{what} {name!r} is not a valid identifier"), id=f"{what}-{p.id}"
                )
            )
    for p in BAD_IDENTIFIERS:
        (name,) = p.values
        cases.append(
            pytest.param(
                Bad(
                    with_extra_column(name, "int"), "columns.4.name", f"column name {name!r} is not a valid identifier"
                ),
                id=f"column-{p.id}",
            )
        )
    roots = [
        ("/lake/../etc", "must not contain '..' segments", "dotdot-middle"),
        ("../lake", "must not contain '..' segments", "dotdot-leading"),
        ("file:///lake/..", "must not contain '..' segments", "dotdot-file-url"),
        ("/lake;rm", "may only contain", "semicolon"),
        ("/lake'x", "may only contain", "single-quote"),
        ('/lake"x', "may only contain", "double-quote"),
        ("/lake x", "may only contain", "space"),
        ("/lake`x", "may only contain", "backtick"),
        ("", "may only contain", "empty"),
        ("s3://Bucket_X/lake", "not a valid S3 bucket name", "s3-bad-bucket"),
        ("s3://bucket", "must name a prefix", "s3-no-prefix"),
        ("s3a://bucket/", "must name a prefix", "s3a-root-prefix"),
        ("hdfs://nn/lake", "supported storage roots are", "hdfs"),
        ("gs://bucket/lake", "supported storage roots are", "gs"),
    ]
    for root, fragment, ident in roots:
        cases.append(
            pytest.param(Bad(setting("storage_root", root), "storage_root", fragment), id=f"storage_root-{ident}")
        )
    return cases


BAD_CASES = _bad_cases()


def _field_cases() -> list[Any]:
    """BAD_CASES again, with the cross-field ones marked as the known bug."""
    out = []
    for p in BAD_CASES:
        (bad,) = p.values
        marks: list[Any] = []
        out.append(pytest.param(bad, id=p.id, marks=marks))
    return out


def _write_bad(tmp_path: Path, bad: Bad) -> tuple[Path, Doc]:
    doc = copy.deepcopy(good_doc())
    bad.mutate(doc)
    return write_yaml(tmp_path, "tests.student.yaml", doc), doc


@pytest.mark.parametrize("bad", BAD_CASES)
def test_bad_entry_is_refused(tmp_path: Path, bad: Bad) -> None:
    path, doc = _write_bad(tmp_path, bad)
    err = refusal(path)
    message = str(err)
    assert bad.fragment in message
    # The field is named in the message (possibly not in the 'field ...' label; see the next test).
    assert bad.field.split(".")[0] in message
    # Every message names the file, and the table as far as the file says it.
    assert err.file == str(path)
    assert str(path) in message
    table = f"{doc.get('database', '?')}.{doc.get('table', '?')}"
    assert err.table == table
    assert f"(table {table})" in message
    assert err.problems, "a refusal must list at least one problem"


@pytest.mark.parametrize("bad", _field_cases())
def test_bad_entry_names_the_field(tmp_path: Path, bad: Bad) -> None:
    path, _ = _write_bad(tmp_path, bad)
    err = refusal(path)
    assert names_field(err, bad.field), err.problems
    labelled = [p for p in err.problems if p.startswith(f"field '{bad.field}':")]
    assert any(bad.fragment in p for p in labelled), err.problems


@pytest.mark.parametrize(
    ("root", "stored"),
    [("s3://lake-bucket/db/t", "s3://lake-bucket/db/t"), ("s3a://lake.bucket/db/t/", "s3a://lake.bucket/db/t")],
)
def test_s3_storage_roots_are_accepted(root: str, stored: str) -> None:
    from cdc_compaction.core.lake import Layout

    cfg = parse_table(good_doc(storage_root=root, storage_conn_id="aws_lake"))
    assert cfg.storage_root == stored
    assert cfg.storage_conn_id == "aws_lake"
    # S3 roots are used as written: no project-relative resolution.
    assert Layout.for_table(cfg).incremental == f"{stored}/incremental"


def test_bad_entry_model_validate_raises_too() -> None:
    doc = good_doc(primary_key=["nope"])
    with pytest.raises(ValueError, match="not among the columns"):
        parse_table(doc)


def test_all_problems_are_reported_at_once(tmp_path: Path) -> None:
    doc = good_doc(retries=-1, storage_root="/lake x")
    doc["columns"][1]["type"] = "varchar2"
    err = refusal(write_yaml(tmp_path, "tests.student.yaml", doc))
    assert names_field(err, "retries")
    assert names_field(err, "storage_root")
    assert names_field(err, "columns.1.type")
    assert len(err.problems) == 3


@pytest.mark.parametrize("value", [pytest.param(-3600, id="int"), pytest.param("-1d", id="string")])
def test_negative_tombstone_retention_is_refused(tmp_path: Path, value: Any) -> None:
    err = refusal(write_yaml(tmp_path, "tests.student.yaml", good_doc(tombstone_retention=value)))
    assert names_field(err, "tombstone_retention")


def test_decimal_precision_above_38_is_refused(tmp_path: Path) -> None:
    doc = good_doc()
    with_extra_column("big", "decimal(39,0)")(doc)
    err = refusal(write_yaml(tmp_path, "tests.student.yaml", doc))
    assert names_field(err, "columns.4.type")


def test_max_retry_delay_below_retry_delay_is_refused(tmp_path: Path) -> None:
    err = refusal(write_yaml(tmp_path, "tests.student.yaml", good_doc(retry_delay="2h", max_retry_delay="1h")))
    assert "field 'max_retry_delay': must be at least retry_delay" in str(err)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("database: [unclosed\ntable: student\n", "not valid YAML", id="bad-yaml-syntax"),
        pytest.param("database: a\n  table: : b\n", "not valid YAML", id="bad-yaml-indent"),
        pytest.param("- database: tests\n- table: student\n", "must hold one mapping", id="yaml-list"),
        pytest.param("just a string\n", "must hold one mapping", id="yaml-scalar"),
        pytest.param("", "must hold one mapping", id="empty-file"),
    ],
)
def test_unreadable_yaml_is_refused(tmp_path: Path, text: str, fragment: str) -> None:
    path = write_text(tmp_path, "tests.student.yaml", text)
    err = refusal(path)
    assert fragment in str(err)
    assert err.file == str(path)
    assert str(path) in str(err)
    assert err.table is None  # not known: the file could not be read as an entry


def test_file_name_must_match_database_and_table(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "tests.other.yaml", good_doc())
    err = refusal(path)
    assert err.file == str(path)
    assert err.table == "tests.student"
    assert "file name must be 'tests.student.yaml'" in str(err)
    assert str(path) in str(err)
    assert "(table tests.student)" in str(err)


def test_file_name_match_is_case_sensitive(tmp_path: Path) -> None:
    err = refusal(write_yaml(tmp_path, "Tests.Student.yaml", good_doc()))
    assert "file name must be 'tests.student.yaml'" in str(err)


def test_yml_suffix_is_accepted(tmp_path: Path) -> None:
    cfg = parse_file(write_yaml(tmp_path, "tests.student.yml", good_doc()))
    assert cfg.qualified_name == "tests.student"


# -- load_registry -------------------------------------------------------------------


def test_load_registry_isolates_a_bad_file(tmp_path: Path) -> None:
    # Written out of order on purpose: entries must come back sorted by file name.
    write_yaml(tmp_path, "zeta.events.yaml", good_doc("zeta", "events"))
    write_yaml(tmp_path, "mid.broken.yaml", good_doc("mid", "broken", primary_key=[]))
    write_yaml(tmp_path, "alpha.users.yaml", good_doc("alpha", "users"))
    write_text(tmp_path, "README.md", "not a registry file\n")
    (tmp_path / "subdir.yaml").mkdir()

    entries = load_registry(tmp_path)

    # A directory named like an entry is an error of its own (issue 35), not a table that vanishes unseen.
    assert [e.path.name for e in entries] == ["alpha.users.yaml", "mid.broken.yaml", "subdir.yaml", "zeta.events.yaml"]
    odd = entries.pop(2)
    assert odd.config is None and odd.error is not None and "is a directory" in str(odd.error)
    good = {e.path.name: e for e in entries if e.error is None}
    assert set(good) == {"alpha.users.yaml", "zeta.events.yaml"}
    assert good["alpha.users.yaml"].config is not None
    assert good["alpha.users.yaml"].config.qualified_name == "alpha.users"
    assert good["zeta.events.yaml"].config is not None
    assert good["zeta.events.yaml"].config.qualified_name == "zeta.events"

    bad = entries[1]
    assert bad.config is None
    assert isinstance(bad.error, RegistryError)
    assert bad.error.file == str(tmp_path / "mid.broken.yaml")
    assert names_field(bad.error, "primary_key")

    assert [e.dag_id for e in entries] == ["cdc__alpha__users", "cdc__mid__broken", "cdc__zeta__events"]


@pytest.mark.parametrize(
    ("file_name", "dag_id"),
    [
        pytest.param("sales.bad.yaml", "cdc__sales__bad", id="db-table"),
        pytest.param("my-db.my table.yaml", "cdc__my_db__my_table", id="unsafe-chars"),
        pytest.param("lonely.yml", "cdc__lonely", id="no-table-part"),
    ],
)
def test_dag_id_of_a_bad_file_comes_from_its_name(tmp_path: Path, file_name: str, dag_id: str) -> None:
    write_text(tmp_path, file_name, "- not a mapping\n")
    (entry,) = load_registry(tmp_path)
    assert entry.config is None
    assert entry.error is not None
    assert entry.dag_id == dag_id


def test_dag_id_direct() -> None:
    entry = RegistryEntry(Path("/r/a.b.yaml"), None, RegistryError("/r/a.b.yaml", None, ["x"]))
    assert entry.dag_id == "cdc__a__b"
    cfg = parse_table(good_doc("sales", "orders"))
    assert RegistryEntry(Path("/r/whatever.yaml"), cfg, None).dag_id == "cdc__sales__orders"


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param(("dup.t.yaml", "dup", "t"), ("dup.t.yml", "dup", "t"), id="yaml-and-yml"),
        pytest.param(("dup.t.yaml", "dup", "t"), ("Dup.T.yaml", "Dup", "T"), id="case-insensitive"),
    ],
)
def test_same_table_in_two_files_makes_both_errors(
    tmp_path: Path, first: tuple[str, str, str], second: tuple[str, str, str]
) -> None:
    for file_name, database, table in (first, second):
        write_yaml(tmp_path, file_name, good_doc(database, table))
    write_yaml(tmp_path, "other.t.yaml", good_doc("other", "t"))

    entries = {e.path.name: e for e in load_registry(tmp_path)}

    assert entries["other.t.yaml"].error is None
    for file_name in (first[0], second[0]):
        e = entries[file_name]
        assert e.config is None
        assert e.error is not None
        assert e.error.file == str(tmp_path / file_name)
        message = str(e.error)
        assert first[0] in message
        assert second[0] in message
        assert "defined by several files" in message
        assert names_field(e.error, "table")
        assert "dup.t" in message


# -- the cache -----------------------------------------------------------------------


def _bump_mtime(path: Path, seconds: int) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + seconds * 1_000_000_000))


def test_load_registry_is_cached(tmp_path: Path) -> None:
    write_yaml(tmp_path, "a.one.yaml", good_doc("a", "one"))
    write_yaml(tmp_path, "b.two.yaml", good_doc("b", "two", primary_key=[]))
    first = load_registry(tmp_path)
    second = load_registry(tmp_path)
    assert first == second
    assert first is not second  # callers get their own list ...
    assert first[0].config is second[0].config  # ... of the cached entries


def test_load_registry_sees_a_rewritten_file(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "a.one.yaml", good_doc("a", "one", retries=3))
    assert load_registry(tmp_path)[0].config.retries == 3  # type: ignore[union-attr]

    size = path.stat().st_size
    write_yaml(tmp_path, "a.one.yaml", good_doc("a", "one", retries=4))
    assert path.stat().st_size == size  # only the mtime tells the cache
    _bump_mtime(path, 10)

    (entry,) = load_registry(tmp_path)
    assert entry.config is not None
    assert entry.config.retries == 4


def test_load_registry_sees_a_file_turning_bad_and_a_new_file(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "a.one.yaml", good_doc("a", "one"))
    assert load_registry(tmp_path)[0].error is None

    write_yaml(tmp_path, "a.one.yaml", good_doc("a", "one", retries=-1))
    _bump_mtime(path, 10)
    write_yaml(tmp_path, "b.two.yaml", good_doc("b", "two"))

    entries = load_registry(tmp_path)
    assert [e.path.name for e in entries] == ["a.one.yaml", "b.two.yaml"]
    assert entries[0].error is not None
    assert names_field(entries[0].error, "retries")
    assert entries[1].error is None


def test_load_registry_cache_is_keyed_on_mtime_and_size(tmp_path: Path) -> None:
    path = write_yaml(tmp_path, "a.one.yaml", good_doc("a", "one", retries=3))
    st = path.stat()
    assert load_registry(tmp_path)[0].config.retries == 3  # type: ignore[union-attr]

    write_yaml(tmp_path, "a.one.yaml", good_doc("a", "one", retries=4))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime: looks unchanged
    assert load_registry(tmp_path)[0].config.retries == 3  # type: ignore[union-attr]


def test_load_registry_of_a_missing_directory_is_empty(tmp_path: Path) -> None:
    assert load_registry(tmp_path / "absent") == []


# -- load_table ----------------------------------------------------------------------


def test_load_table(tmp_path: Path) -> None:
    write_yaml(tmp_path, "a.one.yaml", good_doc("a", "one"))
    write_yaml(tmp_path, "b.bad.yaml", good_doc("b", "bad", op_column="nope"))

    assert load_table(tmp_path, "a.one").qualified_name == "a.one"

    (bad_entry,) = [e for e in load_registry(tmp_path) if e.path.name == "b.bad.yaml"]
    with pytest.raises(RegistryError) as exc_info:
        load_table(tmp_path, "b.bad")
    assert exc_info.value is bad_entry.error
    assert exc_info.value.file == str(tmp_path / "b.bad.yaml")
    assert "'nope' is not among the columns" in str(exc_info.value)

    with pytest.raises(RegistryError) as unknown:
        load_table(tmp_path, "c.missing")
    assert unknown.value.table == "c.missing"
    assert "no registry file defines this table" in str(unknown.value)
    assert str(tmp_path) in str(unknown.value)


def test_load_table_of_a_duplicated_table_raises(tmp_path: Path) -> None:
    write_yaml(tmp_path, "dup.t.yaml", good_doc("dup", "t"))
    write_yaml(tmp_path, "dup.t.yml", good_doc("dup", "t"))
    with pytest.raises(RegistryError, match="defined by several files"):
        load_table(tmp_path, "dup.t")


# -- hostile files: each is its own table's error, never everyone's -----------------------


def _alias_bomb(where: str) -> str:
    """A "billion laughs" document: 9 levels of 9 aliases each, 9**9 strings once expanded."""
    lines = [yaml.safe_dump(good_doc(), sort_keys=False).rstrip("\n")]
    anchors = ["&a0 [" + ",".join(['"lol"'] * 9) + "]"]
    anchors += [f"&a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    # Anchors live in a list under an extra key; the last level lands where ``where`` says.
    lines.append("x_anchors: [" + ", ".join(anchors) + "]")
    lines.append(where.replace("BOMB", "[" + ",".join(["*a8"] * 9) + "]"))
    return "\n".join(lines) + "\n"


def _hostile_files() -> list[Any]:
    good = yaml.safe_dump(good_doc(), sort_keys=False)
    return [
        pytest.param(b"database: caf\xe9\ntable: student\n", "not UTF-8 text", id="not-utf8"),
        pytest.param(
            yaml.safe_dump(good_doc(tombstone_retention="99999999999d")).encode(),
            "field 'tombstone_retention': '99999999999d' is too long a duration",
            id="duration-overflow",
        ),
        pytest.param(
            yaml.safe_dump(good_doc(lease_timeout=10**30)).encode(),
            "field 'lease_timeout'",
            id="seconds-overflow",
        ),
        pytest.param(
            ("database: tests\ntable: student\ncolumns: " + "[" * 50_000 + "]" * 50_000 + "\n").encode(),
            "nested deeper than",
            id="deep-flow-nesting",
        ),
        pytest.param(
            ("database: tests\ntable: student\ncolumns: " + "{a: " * 50_000 + "1" + "}" * 50_000 + "\n").encode(),
            "nested deeper than",
            id="deep-mapping-nesting",
        ),
        pytest.param(
            _alias_bomb("spark: {conf: {spark.x: BOMB}}").encode(), "too many YAML nodes", id="alias-bomb-in-conf"
        ),
        pytest.param(_alias_bomb("description: BOMB").encode(), "too many YAML nodes", id="alias-bomb"),
        pytest.param((good + "# " + "x" * (2 << 20) + "\n").encode(), "larger than 1048576 bytes", id="huge-file"),
        pytest.param(
            good.replace("retries: 1", "").encode() + b"retries: 1" + b"0" * 5000 + b"\n", "digits", id="huge-int"
        ),
    ]


HOSTILE_FILES = _hostile_files()


@pytest.mark.parametrize(("content", "fragment"), HOSTILE_FILES)
def test_a_hostile_file_is_only_its_own_error(tmp_path: Path, content: bytes, fragment: str) -> None:
    write_yaml(tmp_path, "alpha.users.yaml", good_doc("alpha", "users", storage_root="/lake/alpha/users"))
    (tmp_path / "tests.student.yaml").write_bytes(content)
    write_yaml(tmp_path, "zeta.events.yaml", good_doc("zeta", "events", storage_root="/lake/zeta/events"))

    entries = {e.path.name: e for e in load_registry(tmp_path)}

    assert entries["alpha.users.yaml"].error is None
    assert entries["zeta.events.yaml"].error is None
    bad = entries["tests.student.yaml"]
    assert bad.config is None and bad.error is not None
    assert bad.error.file == str(tmp_path / "tests.student.yaml")
    assert fragment in str(bad.error), str(bad.error)[:2000]
    assert bad.dag_id == "cdc__tests__student"
    assert len(str(bad.error)) < 5000  # the error names the problem, it does not echo the file


# -- overlapping storage roots --------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param("/lake/shared", "/lake/shared", id="same"),
        pytest.param("/lake/shared", "/lake/shared/", id="trailing-slash"),
        pytest.param("/lake/shared", "/lake/shared/inner", id="nested"),
        pytest.param("/lake/shared", "file:///lake/shared", id="file-url"),
        pytest.param("/lake/./shared", "/lake/shared", id="dot-segment"),
        pytest.param("s3://bucket-a/lake/t", "s3a://bucket-a/lake/t/", id="s3-vs-s3a"),
        pytest.param("s3a://bucket-a/lake", "s3://bucket-a/lake/t", id="s3-nested"),
        pytest.param("RELATIVE", "ABSOLUTE", id="relative-vs-absolute"),
    ],
)
def test_overlapping_storage_roots_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: str, second: str
) -> None:
    from cdc_compaction.core import settings

    monkeypatch.delenv("CDC_LAKE_BASE", raising=False)
    roots = {"RELATIVE": ".lake/overlap/t", "ABSOLUTE": str(settings.PROJECT_ROOT / ".lake" / "overlap" / "t")}
    write_yaml(tmp_path, "a.one.yaml", good_doc("a", "one", storage_root=roots.get(first, first)))
    write_yaml(tmp_path, "b.two.yaml", good_doc("b", "two", storage_root=roots.get(second, second)))
    write_yaml(tmp_path, "c.other.yaml", good_doc("c", "other", storage_root="/lake/shared_not"))

    entries = {e.path.name: e for e in load_registry(tmp_path)}

    assert entries["c.other.yaml"].error is None
    for name in ("a.one.yaml", "b.two.yaml"):
        e = entries[name]
        assert e.config is None and e.error is not None, name
        assert e.error.file == str(tmp_path / name)
        assert names_field(e.error, "storage_root"), e.error.problems
        message = str(e.error)
        # Both entries are named: files and tables.
        assert "a.one.yaml" in message and "b.two.yaml" in message
        assert "a.one" in message and "b.two" in message


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param("/lake/shared", "/lake/shared/inner", id="nested"),
        pytest.param("s3://bucket-a/lake/t", "s3a://bucket-a/lake/t/", id="s3-vs-s3a"),
        pytest.param("RELATIVE", "ABSOLUTE", id="relative-vs-absolute"),
    ],
)
def test_a_task_process_parse_sees_the_overlap_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: str, second: str
) -> None:
    """With Airflow's parsing context (``dag_id``) only one table's DAG is built, with the full load's verdict."""
    from cdc_compaction.core import settings

    monkeypatch.delenv("CDC_LAKE_BASE", raising=False)
    roots = {"RELATIVE": ".lake/overlap/t", "ABSOLUTE": str(settings.PROJECT_ROOT / ".lake" / "overlap" / "t")}
    write_yaml(tmp_path, "a.one.yaml", good_doc("a", "one", storage_root=roots.get(first, first)))
    write_yaml(tmp_path, "b.two.yaml", good_doc("b", "two", storage_root=roots.get(second, second)))
    write_yaml(tmp_path, "c.other.yaml", good_doc("c", "other", storage_root="/lake/shared_not"))

    for dag_id, other in (("cdc__a__one", "b.two.yaml"), ("cdc__b__two", "a.one.yaml")):
        (entry,) = load_registry(tmp_path, dag_id=dag_id)
        assert entry.dag_id == dag_id and entry.config is None and entry.error is not None
        assert names_field(entry.error, "storage_root") and other in str(entry.error), entry.error.problems
    (fine,) = load_registry(tmp_path, dag_id="cdc__c__other")
    assert fine.error is None and fine.config is not None


def _verdicts(entries: list[Any]) -> dict[str, str | None]:
    return {e.path.name: (str(e.error) if e.error else None) for e in entries}


def test_a_task_process_parse_gives_every_table_the_full_loads_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every way a root can be written, duplicates, invalid and hostile neighbours: one verdict per file."""
    monkeypatch.setenv("CDC_LAKE_BASE", str(tmp_path / "base"))
    write_yaml(tmp_path, "p.plain.yaml", good_doc("p", "plain", storage_root="/lake/x"))
    # The same root written differently: quoted, with a comment, in flow style, relative.
    write_text(
        tmp_path,
        "p.quoted.yaml",
        yaml.safe_dump(good_doc("p", "quoted")).replace(
            "storage_root: /lake/p/quoted", "storage_root: '/lake/x/q'  # nested under p.plain"
        ),
    )
    write_text(
        tmp_path,
        "p.flow.yaml",
        yaml.safe_dump(good_doc("p", "flow", storage_root="/lake/x/f"), default_flow_style=True),
    )
    write_yaml(tmp_path, "r.rel.yaml", good_doc("r", "rel", storage_root="rel/t"))
    write_yaml(tmp_path, "r.abs.yaml", good_doc("r", "abs", storage_root=str(tmp_path / "base" / "rel" / "t" / "in")))
    # One table in two files (the same name but for case), one of them overlapping another root.
    write_yaml(tmp_path, "d.dup.yaml", good_doc("d", "dup", storage_root="/lake/d1"))
    write_yaml(tmp_path, "D.dup.yaml", good_doc("D", "dup", storage_root="/lake/y/inner"))
    write_yaml(tmp_path, "y.root.yaml", good_doc("y", "root", storage_root="/lake/y"))
    # An invalid entry overlapping a valid one: it is its own error only; the valid one stays.
    bad = good_doc("z", "bad", storage_root="/lake/z/inner")
    bad["primay_key"] = bad.pop("primary_key")
    write_yaml(tmp_path, "z.bad.yaml", bad)
    write_yaml(tmp_path, "z.root.yaml", good_doc("z", "root", storage_root="/lake/z"))
    (tmp_path / "h.hostile.yaml").write_bytes(b"storage_root: /lake/x\n\xff\xfe")
    write_yaml(tmp_path, "s.solo.yaml", good_doc("s", "solo", storage_root="s3://bucket/solo"))

    full = load_registry(tmp_path)
    expected = _verdicts(full)
    assert expected["y.root.yaml"] is None, "a duplicate entry is refused as such and overlaps nothing"
    assert expected["z.root.yaml"] is None and expected["s.solo.yaml"] is None
    assert all(expected[n] for n in ("p.plain.yaml", "p.quoted.yaml", "p.flow.yaml", "r.rel.yaml", "r.abs.yaml"))
    assert "is defined by several files" in str(expected["D.dup.yaml"])
    for e in full:
        (alone,) = load_registry(tmp_path, dag_id=e.dag_id)
        assert _verdicts([alone]) == {e.path.name: expected[e.path.name]}, e.path.name


def test_sibling_storage_roots_with_a_common_name_prefix_are_fine(tmp_path: Path) -> None:
    write_yaml(tmp_path, "a.one.yaml", good_doc("a", "one", storage_root="/lake/t"))
    write_yaml(tmp_path, "b.two.yaml", good_doc("b", "two", storage_root="/lake/t2"))
    write_yaml(tmp_path, "c.three.yaml", good_doc("c", "three", storage_root="s3://bucket/lake/t"))
    write_yaml(tmp_path, "d.four.yaml", good_doc("d", "four", storage_root="s3://bucket2/lake/t"))
    assert all(e.error is None for e in load_registry(tmp_path))


def test_names_and_comments_at_the_metastore_limits_are_accepted() -> None:
    doc = good_doc(table="t" * 112)
    doc["columns"][1]["comment"] = "c" * 256
    cfg = parse_table(doc)
    assert len(cfg.table) == 112


# -- table modes -------------------------------------------------------------------------------


def keyless_doc(**overrides: Any) -> Doc:
    """A valid ``mode: keyless`` entry: two data columns, their before-images, an op and a sequence."""
    doc: Doc = {
        "mode": "keyless",
        "database": "tests",
        "table": "visits",
        "columns": [
            {"name": "name", "type": "string"},
            {"name": "visits", "type": "int"},
            {"name": "_before_name", "type": "string"},
            {"name": "_before_visits", "type": "int"},
            {"name": "op", "type": "string"},
            {"name": "lsn", "type": "bigint"},
        ],
        "order_by": ["lsn"],
        "storage_root": "/lake/tests/visits",
    }
    doc.update(overrides)
    return doc


def test_mode_picks_the_table_class() -> None:
    from cdc_compaction.modes.cdc import CdcTable
    from cdc_compaction.modes.keyless import KeylessTable

    assert type(parse_table(good_doc())) is CdcTable  # no mode: cdc, as before modes existed
    assert type(parse_table(good_doc(mode="cdc"))) is CdcTable
    keyless = parse_table(keyless_doc())
    assert type(keyless) is KeylessTable
    assert keyless.data_columns == ["name", "visits"]
    assert keyless.before_columns == ["_before_name", "_before_visits"]
    assert keyless.control_columns == ["op", "_before_name", "_before_visits"]
    # A column that describes the event, not the row: its time (event_time) is no data column.
    timed = keyless_doc(event_time={"column": "ts_ms"})
    timed["columns"].append({"name": "ts_ms", "type": "bigint"})
    assert parse_table(timed).data_columns == ["name", "visits"]
    timed.pop("event_time")
    with pytest.raises(ValidationError, match="declare it as event_time or put it in order_by"):
        parse_table(timed)


@pytest.mark.parametrize(
    ("doc", "field", "fragment"),
    [
        (good_doc(mode="snapshots"), "mode", "must be one of 'cdc', 'append', 'keyless', 'snapshot'"),
        (good_doc(mode=3), "mode", "must be one of 'cdc', 'append', 'keyless', 'snapshot'"),
        # A cdc field in a keyless entry (and the other way round) is refused, not ignored.
        (keyless_doc(primary_key=["name"]), "primary_key", "Extra inputs are not permitted"),
        (good_doc(before_prefix="_old_"), "before_prefix", "Extra inputs are not permitted"),
        (keyless_doc(order_by=[]), "order_by", "at least 1 item"),
        (keyless_doc(before_prefix="_cdc_x"), "before_prefix", "reserved for the package"),
        (keyless_doc(partition_by={"column": "name"}), "partition_by", "keyless tables are not partitioned"),
    ],
    ids=["unknown-mode", "mode-not-text", "keyless-with-key", "cdc-with-before", "no-order", "reserved", "partition"],
)
def test_mode_fields_are_checked(tmp_path: Path, doc: Doc, field: str, fragment: str) -> None:
    err = refusal(write_yaml(tmp_path, f"tests.{doc['table']}.yaml", doc))
    assert names_field(err, field), err.problems
    assert fragment in str(err)


def _keyless_columns(drop: str | None = None, retype: tuple[str, str] | None = None, add: Doc | None = None) -> Doc:
    doc = keyless_doc()
    cols = [c for c in doc["columns"] if c["name"] != drop]
    if retype:
        cols = [{**c, "type": retype[1]} if c["name"] == retype[0] else c for c in cols]
    if add:
        cols.append(add)
    doc["columns"] = cols
    return doc


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        (_keyless_columns(drop="_before_visits"), "'visits' has no before-image column '_before_visits'"),
        (
            _keyless_columns(retype=("_before_visits", "bigint")),
            "'_before_visits' has type bigint but 'visits' has int",
        ),
        (_keyless_columns(drop="op"), "'op' is not among the columns"),
        (_keyless_columns(retype=("lsn", "boolean")), "cannot order events"),
    ],
    ids=["missing-before", "before-type", "no-op", "boolean-order"],
)
def test_keyless_columns_are_checked(tmp_path: Path, doc: Doc, fragment: str) -> None:
    err = refusal(write_yaml(tmp_path, "tests.visits.yaml", doc))
    assert err.table == "tests.visits"
    assert fragment in str(err), err.problems


# -- source presets ----------------------------------------------------------------------------


def preset_doc(source: str, columns: list[tuple[str, str]], **overrides: Any) -> Doc:
    """A ``mode: cdc`` entry keyed by ``id`` with ``columns`` (name, type) and ``source``, nothing else said."""
    doc: Doc = {
        "database": "tests",
        "table": "src",
        "source": source,
        "primary_key": ["id"],
        "columns": [{"name": "id", "type": "int"}, *({"name": n, "type": t} for n, t in columns)],
        "storage_root": "/lake/tests/src",
    }
    doc.update(overrides)
    return doc


DEBEZIUM_PG = [("name", "string"), ("__op", "string"), ("__lsn", "bigint"), ("__source_ts_ms", "bigint")]
DEBEZIUM_MYSQL = [("name", "string"), ("__op", "string"), ("__file", "string"), ("__pos", "bigint"), ("__row", "int")]
DMS = [("name", "string"), ("Op", "string"), ("AR_H_CHANGE_SEQ", "string")]


def test_debezium_postgres_preset_fills_op_order_and_event_time() -> None:
    cfg = parse_table(preset_doc("debezium", [*DEBEZIUM_PG, ("__deleted", "string")]))
    assert isinstance(cfg, CdcTable)
    assert (cfg.op_column, cfg.order_by, cfg.deleted_column) == ("__op", ["__lsn"], "__deleted")
    assert [cfg.op_codes.create, cfg.op_codes.read, cfg.op_codes.update, cfg.op_codes.delete] == ["c", "r", "u", "d"]
    assert cfg.event_time is not None and (cfg.event_time.column, cfg.event_time.unit) == ("__source_ts_ms", "ms")
    assert cfg.missing_op == "refuse" and cfg.order_as == {}
    # Without a __deleted column there is no delete marker.
    assert parse_table(preset_doc("debezium", DEBEZIUM_PG)).deleted_column is None


def test_debezium_mysql_preset_orders_by_binlog_position_with_the_file_as_a_number() -> None:
    cfg = parse_table(preset_doc("debezium", DEBEZIUM_MYSQL))
    assert cfg.order_by == ["__file", "__pos", "__row"]
    assert cfg.order_as == {"__file": "binlog_file"}
    no_row = parse_table(preset_doc("debezium", [c for c in DEBEZIUM_MYSQL if c[0] != "__row"]))
    assert no_row.order_by == ["__file", "__pos"]


def test_dms_preset_reads_a_missing_op_as_a_full_load_row() -> None:
    cfg = parse_table(preset_doc("dms", DMS))
    assert (cfg.op_column, cfg.order_by, cfg.missing_op) == ("Op", ["AR_H_CHANGE_SEQ"], "read")
    assert (cfg.op_codes.create, cfg.op_codes.update, cfg.op_codes.delete) == ("I", "U", "D")


def test_wal2json_preset_uses_kind_and_a_numeric_lsn() -> None:
    cfg = parse_table(preset_doc("wal2json", [("name", "string"), ("kind", "string"), ("lsn", "bigint")]))
    assert (cfg.op_column, cfg.order_by) == ("kind", ["lsn"])
    assert (cfg.op_codes.create, cfg.op_codes.update, cfg.op_codes.delete) == ("insert", "update", "delete")


def test_every_preset_default_is_overridable() -> None:
    cols = [*DEBEZIUM_PG, ("__deleted", "string"), ("op", "string"), ("seq", "bigint")]
    cfg = parse_table(
        preset_doc(
            "debezium",
            cols,
            op_column="op",
            order_by=["seq"],
            deleted_column=None,
            event_time={"column": "seq", "unit": "us"},
        )
    )
    assert (cfg.op_column, cfg.order_by, cfg.deleted_column) == ("op", ["seq"], None)
    assert cfg.event_time is not None and cfg.event_time.unit == "us"
    # One op code overridden, the preset's others kept.
    dms = parse_table(preset_doc("dms", DMS, op_codes={"delete": "X"}, missing_op="refuse"))
    assert (dms.op_codes.create, dms.op_codes.delete, dms.missing_op) == ("I", "X", "refuse")


def test_generic_is_the_default_and_changes_nothing() -> None:
    cfg = parse_table(
        preset_doc("generic", [("op", "string"), ("lsn", "bigint"), ("__deleted", "string")], order_by=["lsn"])
    )
    assert cfg.source == "generic" and cfg.op_column == "op" and cfg.deleted_column is None
    del_source = preset_doc("generic", [("op", "string"), ("lsn", "bigint")], order_by=["lsn"])
    del del_source["source"]
    assert parse_table(del_source).source == "generic"


def test_a_keyed_debezium_table_orders_by_the_commit_position_where_it_is_declared() -> None:
    """``__commit_lsn`` (source.sequence's first LSN) survives a killed Connect worker's re-delivery and puts a
    snapshot's rows (commit position 0) before every change streamed after them; ``__lsn`` orders within."""
    cfg = parse_table(preset_doc("debezium", [*DEBEZIUM_PG, ("__commit_lsn", "bigint")]))
    assert cfg.order_by == ["__commit_lsn", "__lsn"]
    assert parse_table(preset_doc("debezium", DEBEZIUM_PG)).order_by == ["__lsn"]


def _keyless_preset(source: str, *names: str, **overrides: Any) -> Doc:
    """A keyless entry of ``source`` with one data column, its before-image and ``names`` (bigints but the op)."""
    doc = keyless_doc(source=source, **overrides)
    op = {"debezium": "__op", "wal2json": "kind"}[source]
    doc["columns"] = [
        {"name": "name", "type": "string"},
        {"name": "_before_name", "type": "string"},
        {"name": op, "type": "string"},
        *({"name": n, "type": "bigint"} for n in names),
    ]
    if "order_by" not in overrides:
        del doc["order_by"]
    return doc


@pytest.mark.parametrize(
    ("doc", "order_by", "event_id"),
    [
        # The position PostgreSQL delivers in (commit LSN), then what tells its events apart.
        (_keyless_preset("debezium", "__commit_lsn", "__lsn", "__row"), ["__commit_lsn"], ["__lsn", "__row"]),
        (_keyless_preset("debezium", "__kafka_offset"), ["__kafka_offset"], []),
        (_keyless_preset("wal2json", "commit_lsn", "lsn", "lsn_row"), ["commit_lsn"], ["lsn", "lsn_row"]),
    ],
    ids=["debezium-commit-lsn", "debezium-kafka-offset", "wal2json"],
)
def test_a_keyless_table_takes_the_presets_op_and_position(doc: Doc, order_by: list[str], event_id: list[str]) -> None:
    cfg = parse_table(doc)
    assert (cfg.order_by, cfg.event_id, cfg.data_columns) == (order_by, event_id, ["name"])
    assert cfg.op_column in ("__op", "kind")


@pytest.mark.parametrize(
    ("doc", "field", "fragment"),
    [
        # The change LSN is not the order PostgreSQL delivers in: a late commit's changes would be replays.
        (_keyless_preset("debezium", "__lsn"), "order_by", "delivers changes in commit order"),
        (_keyless_preset("wal2json", "lsn"), "order_by", "Land the transaction's commit position as 'commit_lsn'"),
        # A snapshot's rows share one LSN: without an ordinal they are one row delivered again.
        (_keyless_preset("debezium", "__commit_lsn", "__lsn"), "event_id", "add it to event_id"),
        (_keyless_preset("wal2json", "commit_lsn", "lsn"), "event_id", "as 'lsn_row'"),
        (_keyless_preset("wal2json", "commit_lsn", "lsn", "lsn_row", event_id=["nope"]), "event_id", "not among"),
        (
            _keyless_preset("wal2json", "commit_lsn", "lsn", "lsn_row", event_id=["commit_lsn", "lsn_row"]),
            "event_id",
            "repeats a column or an order_by column",
        ),
    ],
    ids=["debezium-change-lsn", "wal2json-change-lsn", "debezium-no-row", "wal2json-no-row", "missing", "repeated"],
)
def test_a_keyless_position_that_loses_rows_is_refused(tmp_path: Path, doc: Doc, field: str, fragment: str) -> None:
    err = refusal(write_yaml(tmp_path, "tests.visits.yaml", doc))
    assert err.table == "tests.visits" and names_field(err, field), err.problems
    assert fragment in str(err), err.problems


@pytest.mark.parametrize(
    ("doc", "field", "fragment"),
    [
        (preset_doc("oracle", DEBEZIUM_PG, order_by=["__lsn"]), "source", "'generic', 'debezium', 'dms' or 'wal2json'"),
        (preset_doc("debezium", [("name", "string"), ("__op", "string")]), "order_by", "Field required"),
        (
            preset_doc("wal2json", [("kind", "string"), ("lsn", "string")]),
            "order_by",
            "land the LSN as a bigint",
        ),
        (preset_doc("debezium", [*DEBEZIUM_PG, ("__deleted", "int")]), "deleted_column", "needs string"),
        (preset_doc("debezium", DEBEZIUM_PG, deleted_column="gone"), "deleted_column", "not among the columns"),
        (preset_doc("debezium", DEBEZIUM_PG, deleted_column="__lsn"), "deleted_column", "ordering, op or old-key"),
        (preset_doc("debezium", DEBEZIUM_PG, order_as={"name": "binlog_file"}), "order_as", "not an order_by column"),
        (preset_doc("debezium", DEBEZIUM_PG, order_as={"__lsn": "binlog_file"}), "order_as", "compares a text column"),
        (preset_doc("dms", DMS, missing_op="maybe"), "missing_op", "'refuse' or 'read'"),
        (keyless_doc(deleted_column="op"), "deleted_column", "Extra inputs are not permitted"),
    ],
    ids=[
        "unknown-source",
        "no-order-column",
        "wal2json-text-lsn",
        "deleted-int",
        "deleted-missing",
        "deleted-is-order",
        "order-as-not-ordering",
        "order-as-number",
        "missing-op-value",
        "keyless-deleted",
    ],
)
def test_source_conventions_are_checked(tmp_path: Path, doc: Doc, field: str, fragment: str) -> None:
    err = refusal(write_yaml(tmp_path, f"tests.{doc['table']}.yaml", doc))
    assert names_field(err, field), err.problems
    assert fragment in str(err), err.problems


def snapshot_doc(**overrides: Any) -> Doc:
    """A valid ``mode: snapshot`` entry: a two-column key, two compared columns and a date column."""
    doc: Doc = {
        "mode": "snapshot",
        "database": "tests",
        "table": "accounts",
        "columns": [
            {"name": "bank", "type": "string"},
            {"name": "id", "type": "int"},
            {"name": "balance", "type": "decimal(12,2)"},
            {"name": "as_of", "type": "date"},
            {"name": "owner", "type": "string"},
        ],
        "primary_key": ["bank", "id"],
        "storage_root": "/lake/tests/accounts",
    }
    doc.update(overrides)
    return doc


def test_snapshot_mode_gets_its_class_and_defaults() -> None:
    from cdc_compaction.modes.snapshot import SnapshotTable

    cfg = parse_table(snapshot_doc())
    assert type(cfg) is SnapshotTable
    assert cfg.delta is False and cfg.business_date is None and cfg.business_date_column is None
    # Compared: every column but the key, in registry order.
    assert cfg.value_columns == ["balance", "as_of", "owner"]
    dated = parse_table(snapshot_doc(delta=True, business_date={"column": "as_of"}))
    assert dated.delta is True and dated.business_date_column == "as_of"
    assert dated.value_columns == ["balance", "owner"], "the business date is not compared"


def _snapshot_with_column(name: str, type_: str = "string") -> Doc:
    doc = snapshot_doc()
    doc["columns"] = [*doc["columns"], {"name": name, "type": type_}]
    return doc


@pytest.mark.parametrize(
    ("doc", "field", "fragment"),
    [
        (snapshot_doc(primary_key=[]), "primary_key", "at least 1 item"),
        (snapshot_doc(primary_key=["nope"]), "primary_key", "['nope'] not among the columns"),
        (snapshot_doc(order_by=["id"]), "order_by", "Extra inputs are not permitted"),
        (snapshot_doc(op_column="op"), "op_column", "Extra inputs are not permitted"),
        (snapshot_doc(delta="sometimes"), "delta", "valid boolean"),
        (snapshot_doc(business_date={"column": "nope"}), "business_date", "'nope' is not among the columns"),
        (snapshot_doc(business_date={"column": "owner"}), "business_date", "has type string; it must have type date"),
        (snapshot_doc(business_date="as_of"), "business_date", "valid dictionary"),
        (snapshot_doc(business_date={"column": "as_of", "x": 1}), "business_date.x", "Extra inputs"),
        (_snapshot_with_column("operation"), "columns", "'operation' is reserved for the package"),
        (_snapshot_with_column("EFF_START_DATE", "date"), "columns", "'EFF_START_DATE' is reserved for the package"),
        (_snapshot_with_column("_cdc_key_hash"), "columns.5.name", "reserved for the package"),
        (snapshot_doc(partition_by={"column": "bank"}), "partition_by", "snapshot tables are not partitioned"),
    ],
    ids=[
        "no-key",
        "key-not-a-column",
        "order_by",
        "op_column",
        "delta-not-bool",
        "date-not-a-column",
        "date-not-a-date",
        "date-not-a-mapping",
        "date-extra-field",
        "operation-column",
        "eff_start_date-column",
        "hash-column",
        "partitioned",
    ],
)
def test_snapshot_fields_are_checked(tmp_path: Path, doc: Doc, field: str, fragment: str) -> None:
    path = write_yaml(tmp_path, "tests.accounts.yaml", doc)
    err = refusal(path)
    assert err.file == str(path) and err.table == "tests.accounts"
    assert names_field(err, field), err.problems
    assert fragment in str(err), err.problems


def test_snapshot_business_date_must_not_be_a_key_column(tmp_path: Path) -> None:
    doc = snapshot_doc(primary_key=["bank", "as_of"], business_date={"column": "as_of"})
    err = refusal(write_yaml(tmp_path, "tests.accounts.yaml", doc))
    assert names_field(err, "business_date") and "is a primary_key column" in str(err), err.problems


# -- a database's defaults file (<registry dir>/<database>/_database.yaml) ---------------


def write_defaults(registry: Path, database: str, doc: Any, name: str = "_database.yaml") -> Path:
    (registry / database).mkdir(parents=True, exist_ok=True)
    path = registry / database / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def _by_name(entries: list[Any]) -> dict[str, Any]:
    return {e.path.name: e for e in entries}


def test_database_defaults_apply_and_table_files_override_them(tmp_path: Path) -> None:
    write_defaults(
        tmp_path,
        "shop",
        {
            "owner": "shop-team",
            "retries": 5,
            "tags": ["shop"],
            "alerts": {"emails": ["team@shop.example"], "on_rejected_rows": False},
            "spark": {
                "conf": {"spark.sql.shuffle.partitions": "8", "spark.speculation": "true"},
                "driver_memory": "2g",
            },
            "increments": {"completion": "marker"},
        },
    )
    table_overrides = {
        "retries": 1,
        "alerts": {"emails": ["orders@shop.example"]},
        "spark": {"conf": {"spark.sql.shuffle.partitions": "64"}},
    }
    write_yaml(tmp_path, "shop.orders.yaml", good_doc("shop", "orders", **table_overrides))
    write_yaml(tmp_path, "shop.plain.yaml", good_doc("shop", "plain"))
    write_yaml(tmp_path, "crm.users.yaml", good_doc("crm", "users"))
    entries = _by_name(load_registry(tmp_path))
    assert [e.error for e in entries.values()] == [None, None, None]
    orders = entries["shop.orders.yaml"].config
    # Scalars and lists: the table's value wins. Mappings: merged key by key, the table's keys winning.
    assert (orders.owner, orders.retries, orders.tags) == ("shop-team", 1, ["shop"])
    assert orders.alerts.emails == ["orders@shop.example"] and orders.alerts.on_rejected_rows is False
    assert orders.spark.conf == {"spark.sql.shuffle.partitions": "64", "spark.speculation": "true"}
    assert orders.spark.driver_memory == "2g"
    assert orders.increments.completion == "marker" and orders.increments.directory == "incremental"
    plain = entries["shop.plain.yaml"].config
    assert (plain.owner, plain.retries, plain.alerts.emails) == ("shop-team", 5, ["team@shop.example"])
    # Another database's tables get none of it.
    users = entries["crm.users.yaml"].config
    assert (users.owner, users.retries, users.alerts.emails, users.spark.conf) == ("data-platform", 3, [], {})


def test_database_defaults_of_another_mode_are_left_out(tmp_path: Path) -> None:
    # delta is a snapshot field: a cdc table of the same database does not take it.
    write_defaults(tmp_path, "bank", {"delta": True, "keep_versions": 7})
    write_yaml(tmp_path, "bank.events.yaml", good_doc("bank", "events"))
    snapshot = good_doc("bank", "accounts", mode="snapshot")
    del snapshot["order_by"]
    write_yaml(tmp_path, "bank.accounts.yaml", snapshot)
    entries = _by_name(load_registry(tmp_path))
    events, accounts = entries["bank.events.yaml"].config, entries["bank.accounts.yaml"].config
    assert events is not None and accounts is not None, [e.error for e in entries.values()]
    assert (events.keep_versions, accounts.keep_versions, accounts.delta) == (7, 7, True)
    assert not hasattr(events, "delta")


def test_database_defaults_can_set_the_source_preset(tmp_path: Path) -> None:
    write_defaults(tmp_path, "pg", {"source": "wal2json"})
    doc = good_doc(
        "pg",
        "t",
        columns=[{"name": "id", "type": "int"}, {"name": "kind", "type": "string"}, {"name": "lsn", "type": "bigint"}],
    )
    del doc["order_by"]
    write_yaml(tmp_path, "pg.t.yaml", doc)
    (entry,) = load_registry(tmp_path)
    assert entry.error is None, entry.error
    assert (entry.config.op_column, entry.config.order_by) == ("kind", ["lsn"])


@pytest.mark.parametrize(
    ("defaults", "fragment"),
    [
        pytest.param({"owner": "x", "bogus": 1}, "field 'bogus': Extra inputs are not permitted", id="unknown-key"),
        pytest.param({"alerts": {"email": ["a@b.co"]}}, "field 'alerts.email': Extra inputs", id="unknown-nested-key"),
        pytest.param({"retries": -1}, "field 'retries':", id="bad-value"),
        pytest.param({"retry_delay": "soon"}, "field 'retry_delay':", id="bad-duration"),
        pytest.param({"mode": "stream"}, "field 'mode':", id="bad-mode"),
        pytest.param({"columns": []}, "field 'columns': describes one table", id="per-table-field"),
        pytest.param({"storage_root": "/lake"}, "field 'storage_root': describes one table", id="root"),
        pytest.param("- a list\n", "one mapping of defaults", id="not-a-mapping"),
        pytest.param("owner: [unclosed\n", "not valid YAML", id="bad-yaml"),
    ],
)
def test_a_bad_defaults_file_breaks_only_its_own_databases_tables(tmp_path: Path, defaults: Any, fragment: str) -> None:
    path = write_defaults(tmp_path, "shop", defaults)
    write_yaml(tmp_path, "shop.orders.yaml", good_doc("shop", "orders"))
    write_yaml(tmp_path, "shop.items.yaml", good_doc("shop", "items"))
    write_yaml(tmp_path, "crm.users.yaml", good_doc("crm", "users"))
    entries = _by_name(load_registry(tmp_path))
    assert entries["crm.users.yaml"].error is None
    for name in ("shop.orders.yaml", "shop.items.yaml"):
        err = entries[name].error
        assert err is not None and err.file == str(tmp_path / name), name
        assert str(path) in str(err) and fragment in str(err), err.problems
    # The defaults file's own verdict names the file and the field too.
    from cdc_compaction.core.registry import load_database_defaults

    own = load_database_defaults(tmp_path)["shop"]
    assert own.error is not None and own.error.file == str(path) and fragment in str(own.error)


def test_a_table_problem_caused_by_a_default_names_the_defaults_file(tmp_path: Path) -> None:
    # Value rules beyond the type (an owner's characters) are checked on the merged entry: the
    # problem is the table's, and says the value came from the defaults file.
    path = write_defaults(tmp_path, "shop", {"owner": "bad;owner"})
    write_yaml(tmp_path, "shop.orders.yaml", good_doc("shop", "orders"))
    write_yaml(tmp_path, "shop.own.yaml", good_doc("shop", "own", owner="own-team"))
    entries = _by_name(load_registry(tmp_path))
    err = entries["shop.orders.yaml"].error
    assert err is not None and names_field(err, "owner"), err
    assert f"the value comes from the database's defaults file {path}" in str(err)
    assert entries["shop.own.yaml"].error is None


def test_two_defaults_files_of_one_database_are_refused(tmp_path: Path) -> None:
    write_defaults(tmp_path, "shop", {"owner": "a"})
    write_defaults(tmp_path, "shop", {"owner": "b"}, name="_database.yml")
    write_yaml(tmp_path, "shop.orders.yaml", good_doc("shop", "orders"))
    (entry,) = load_registry(tmp_path)
    assert entry.error is not None and "two defaults files" in str(entry.error)


def test_an_empty_defaults_file_and_a_directory_without_one_change_nothing(tmp_path: Path) -> None:
    write_defaults(tmp_path, "shop", "# nothing yet\n")
    (tmp_path / "crm").mkdir()
    write_yaml(tmp_path, "shop.orders.yaml", good_doc("shop", "orders"))
    write_yaml(tmp_path, "crm.users.yaml", good_doc("crm", "users"))
    entries = load_registry(tmp_path)
    assert [e.error for e in entries] == [None, None]
    assert [e.config.owner for e in entries] == ["data-platform", "data-platform"]


def test_load_registry_sees_a_changed_defaults_file(tmp_path: Path) -> None:
    path = write_defaults(tmp_path, "shop", {"owner": "first"})
    write_yaml(tmp_path, "shop.orders.yaml", good_doc("shop", "orders"))
    assert load_registry(tmp_path)[0].config.owner == "first"
    path.write_text("owner: second-owner\n")
    _bump_mtime(path, 5)
    assert load_registry(tmp_path)[0].config.owner == "second-owner"
    path.write_text("owner: 1\nbogus: 1\n")
    _bump_mtime(path, 10)
    assert load_registry(tmp_path)[0].error is not None
    path.unlink()
    assert load_registry(tmp_path)[0].config.owner == "data-platform"


def test_a_task_process_parse_gets_the_defaults_too(tmp_path: Path) -> None:
    write_defaults(tmp_path, "shop", {"owner": "shop-team"})
    write_yaml(tmp_path, "shop.orders.yaml", good_doc("shop", "orders"))
    write_yaml(tmp_path, "crm.users.yaml", good_doc("crm", "users"))
    (orders,) = load_registry(tmp_path, dag_id="cdc__shop__orders")
    assert orders.config is not None and orders.config.owner == "shop-team"
    write_defaults(tmp_path, "shop", {"bogus": 1})
    _bump_mtime(tmp_path / "shop" / "_database.yaml", 5)
    (orders,) = load_registry(tmp_path, dag_id="cdc__shop__orders")
    assert orders.error is not None and "field 'bogus'" in str(orders.error)
    (users,) = load_registry(tmp_path, dag_id="cdc__crm__users")
    assert users.error is None


def test_a_defaults_file_is_not_a_table_entry(tmp_path: Path) -> None:
    from cdc_compaction.core.registry import registry_files

    write_defaults(tmp_path, "shop", {"owner": "x"})
    write_yaml(tmp_path, "shop.orders.yaml", good_doc("shop", "orders"))
    assert [p.name for p in registry_files(tmp_path)] == ["shop.orders.yaml"]
    assert [e.dag_id for e in load_registry(tmp_path)] == ["cdc__shop__orders"]


@pytest.mark.parametrize(
    "arn",
    [
        "arn:aws:sns:us-east-1:123456789012:cdc-alerts",
        "arn:aws-cn:sns:cn-north-1:123456789012:cdc_alerts",
        "arn:aws-us-gov:sns:us-gov-west-1:123456789012:Alerts-1",
    ],
)
def test_alerts_take_an_sns_topic_of_any_partition(arn: str) -> None:
    assert Alerts(sns_topic_arn=arn, slack_conn_id="slack_alerts").sns_topic_arn == arn


# ------------------------------------------------------------------ input formats (issue 36)
def test_input_format_and_envelope_default_to_flattened_parquet_and_mirror_the_connector() -> None:
    cfg = parse_table(preset_doc("debezium", DEBEZIUM_PG))
    assert (cfg.format, cfg.envelope, cfg.decimal_handling, cfg.time_precision) == (
        "parquet",
        "flattened",
        "precise",
        "adaptive",
    )
    cfg = parse_table(
        preset_doc("debezium", DEBEZIUM_PG, format="avro", envelope="debezium", decimal_handling="string")
    )
    assert (cfg.format, cfg.envelope, cfg.decimal_handling, cfg.order_by) == ("avro", "debezium", "string", ["__lsn"])


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("format", "orc", "Input should be 'parquet', 'json' or 'avro'"),
        ("envelope", "raw", "Input should be 'flattened' or 'debezium'"),
        ("decimal_handling", "exact", "Input should be 'precise', 'double' or 'string'"),
        ("time_precision", "nanos", "Input should be 'adaptive', 'adaptive_time_microseconds' or 'connect'"),
    ],
)
def test_input_fields_take_only_the_connectors_values(field: str, value: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        parse_table(preset_doc("debezium", DEBEZIUM_PG, **{field: value}))


def test_the_envelope_needs_the_op_as_an_add_fields_column() -> None:
    generic = preset_doc("generic", [("name", "string"), ("op", "string"), ("ts", "bigint")], order_by=["ts"])
    with pytest.raises(ValidationError, match=r"gives each row the envelope.s op as the column __op"):
        parse_table({**generic, "envelope": "debezium"})


def test_a_snapshot_table_reads_flattened_parquet_only() -> None:
    doc: Doc = {
        "database": "tests",
        "table": "snap",
        "mode": "snapshot",
        "primary_key": ["id"],
        "columns": [{"name": "id", "type": "int"}, {"name": "name", "type": "string"}],
        "storage_root": "/lake/tests/snap",
        "format": "json",
    }
    with pytest.raises(ValidationError, match="is not read in mode snapshot"):
        parse_table(doc)


def test_the_debezium_preset_orders_by_the_kafka_offset_without_a_log_position() -> None:
    cfg = parse_table(
        preset_doc("debezium", [("name", "string"), ("__op", "string"), ("__kafka_offset", "bigint")], format="json")
    )
    assert cfg.order_by == ["__kafka_offset"]
    # A log position, where declared, still comes first.
    both = parse_table(preset_doc("debezium", [*DEBEZIUM_PG, ("__kafka_offset", "bigint")]))
    assert both.order_by == ["__lsn"]


def test_change_feed_is_taken_by_the_modes_that_have_one() -> None:
    """cdc, keyless and snapshot tables have a change feed (docs/data.md#change-feed); an append table's
    ``change_feed`` is refused, naming the table, the field and what to do, not silently ignored."""
    assert parse_table(good_doc(change_feed=True)).change_feed
    assert parse_table(keyless_doc(change_feed=True)).change_feed
    assert parse_table(snapshot_doc(change_feed=True)).change_feed
    clicks: Doc = {
        "mode": "append",
        "database": "web",
        "table": "clicks",
        "columns": [{"name": "message_id", "type": "string"}, {"name": "url", "type": "string"}],
        "event_id": ["message_id"],
        "storage_root": "/lake/web/clicks",
        "change_feed": True,
    }
    with pytest.raises(ValidationError, match=r"change_feed: an append table has no change feed.*web\.clicks"):
        parse_table(clicks)
