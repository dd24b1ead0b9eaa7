"""Rendering of the HiveQL / Spark SQL templates in ``include/sql``.

The templates are the single source of truth for the DDL, the views and the
compaction rule.  Each table mode has its rule and view queries in
``include/sql/modes/<mode>/`` and builds the context they see (:mod:`cdc_compaction.modes`);
:func:`rule_sql` renders the mode's rule macros into the SQL fragments the Spark job applies,
so the job and the views share one definition.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from cdc_compaction.core.identifiers import quote
from cdc_compaction.core.names import table_names as table_names  # callers use sql.table_names
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.core.templates import _env as _env  # callers use sql._env, sql.sql_literal
from cdc_compaction.core.templates import sql_literal as sql_literal
from cdc_compaction.core.templates import template_module as template_module


def schema_fingerprint(cfg: TableConfig) -> str:
    """A short hash of everything that shapes the tables and views of ``cfg``."""
    from cdc_compaction.core.mode import mode_of

    doc = {
        "columns": [[c.name, c.type, c.comment] for c in cfg.columns],
        **mode_of(cfg).fingerprint_doc(cfg),
        # 2: NaN ordering values are refused (nan_order_by): views made under 1 are re-created.
        # 3: tombstones live in <t>_tombstones, not among the base table's rows: views read both.
        "rule_version": 3,
    }
    # Only when set, so that tables keep the fingerprint they had before these existed.
    if cfg.mode != "cdc":
        doc["mode"] = cfg.mode
    if cfg.partition_by is not None:
        doc["partition_by"] = cfg.partition_by.model_dump()
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def context(cfg: TableConfig) -> Any:
    """What the templates see as ``t``: the table's mode builds it (:meth:`TableMode.rule_context`)."""
    from cdc_compaction.core.mode import mode_of

    return mode_of(cfg).rule_context(cfg, schema_fingerprint(cfg))


def render(template: str, cfg: TableConfig, **extra: Any) -> str:
    """Render one template of ``include/sql`` for ``cfg``."""
    return _env().get_template(template).render(t=context(cfg), **extra).strip()


def render_mode(template: str, cfg: TableConfig, **extra: Any) -> str:
    """Render the table mode's own template ``template`` (``include/sql/modes/<mode>/<template>``)."""
    from cdc_compaction.core.mode import mode_of

    return render(mode_of(cfg).template(template), cfg, **extra)


class RuleSql(dict[str, str]):
    """The compaction rule as SQL expressions, for the Spark job (the plan's ``rule``).

    Which expressions there are depends on the table's mode (cdc: ``reject_reason``, ``rank``,
    ``is_delete``); each is also an attribute.
    """

    def __getattr__(self, name: str) -> str:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to_dict(self) -> dict[str, str]:
        return dict(self)


def rule_sql(cfg: TableConfig) -> RuleSql:
    """Render the rule macros of the table mode's ``_rule.sql.j2`` into expressions."""
    from cdc_compaction.core.mode import mode_of

    return RuleSql(mode_of(cfg).rule_sql(cfg))


@dataclass(frozen=True)
class PartitionSql:
    """A partitioned table's partition value as SQL, for the Spark job (registry ``partition_by``)."""

    column: str
    transform: str
    value: str

    def to_dict(self) -> dict[str, str]:
        return {"column": self.column, "transform": self.transform, "value": self.value}


def partition_sql(cfg: TableConfig) -> PartitionSql | None:
    """Render ``partition_value`` of ``_partition.sql.j2``; None for an unpartitioned table."""
    if cfg.partition_by is None:
        return None
    return PartitionSql(
        column=cfg.partition_by.column,
        transform=cfg.partition_by.transform,
        value=str(template_module("_partition.sql.j2").partition_value(context(cfg))).strip(),
    )


def spark_schema_ddl(cfg: TableConfig) -> str:
    """The registry columns as a Spark DDL schema string (for reading change files and versions).

    ``char(n)`` and ``varchar(n)`` read as ``string``: Spark 4 refuses them in a read schema
    (``UNSUPPORTED_CHAR_OR_VARCHAR_AS_STRING``), and Parquet holds them as plain strings anyway.
    The Hive tables still declare them (the DDL templates), and the values pass through as
    landed: a CHAR arrives blank-padded from the source and stays so.
    """
    return ", ".join(f"{quote(c.name)} {_read_type(c.type)}" for c in cfg.columns)


def _read_type(hive_type: str) -> str:
    return "string" if hive_type.startswith(("char(", "varchar(")) else hive_type


def create_statements(
    cfg: TableConfig,
    *,
    base_location: str,
    tombstones_location: str,
    incremental_location: str,
    compactor_location: str,
) -> list[str]:
    """DDL that creates the database and the four tables (idempotent)."""
    return [
        render("create_database.sql.j2", cfg),
        render("create_base.sql.j2", cfg, location=base_location),
        render("create_tombstones.sql.j2", cfg, location=tombstones_location),
        render("create_incremental.sql.j2", cfg, location=incremental_location),
        render("create_compactor.sql.j2", cfg, location=compactor_location),
    ]


def add_columns_statement(cfg: TableConfig, table: str, columns: list[Any]) -> str:
    return render("add_columns.sql.j2", cfg, table=table, columns=columns)


def set_fingerprint_statement(cfg: TableConfig, table: str, kind: str = "TABLE") -> str:
    return render("set_fingerprint.sql.j2", cfg, table=table, kind=kind)
