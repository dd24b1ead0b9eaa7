"""A table's views in every reader's SQL dialect, rendered from the one rule.

The compaction rule is written once per table mode, as the Jinja macros of
``include/sql/modes/<mode>/_rule.sql.j2`` (Spark SQL).  The mode's ``view_query.sql.j2`` and
``rejects_query.sql.j2`` call those macros over
placeholders: three sources (``__cdc_base__``, ``__cdc_tombstones__``,
``__cdc_incremental__``) and two functions giving a pending event's file name and row
position (``__cdc_file_name__()``, ``__cdc_row_index__()``).  :func:`query` parses the
rendered text once with sqlglot, swaps the placeholders for what each engine offers and
writes the tree in that engine's dialect.  Every view therefore applies the same rule as
the Spark job: only the placeholders differ, and what each engine cannot express is
stated in :attr:`Dialect.ties`.

| dialect | where the view lives | a pending event's file, row |
|---|---|---|
| ``spark`` | the metastore (Spark SQL view) | ``_metadata.file_name``, ``_metadata.row_index`` |
| ``hive`` | the metastore (Hive view, HiveQL) | ``INPUT__FILE__NAME``, ``BLOCK__OFFSET__INSIDE__FILE + 0`` |
| ``trino`` | the metastore (Trino/Athena view) | ``"$path"``, none |
| ``duckdb`` | a ``.sql`` script or a ``.duckdb`` file | ``filename``, ``file_row_number`` |
"""

from __future__ import annotations

import base64
import collections
import functools
import json
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp

from cdc_compaction.core import sql
from cdc_compaction.core.registry import TableConfig

#: The placeholders of the view templates.
BASE, TOMBSTONES, INCREMENTAL = "__cdc_base__", "__cdc_tombstones__", "__cdc_incremental__"
FILE_NAME, ROW_INDEX = "__cdc_file_name__", "__cdc_row_index__"
KINDS = ("view", "rejects")


@dataclass(frozen=True)
class Dialect:
    """How one engine spells what the rule needs from a pending event's file."""

    name: str
    #: sqlglot's name of the dialect.
    sqlglot: str
    #: The name (not the path) of the file a pending event was read from, in this dialect.
    file_name: str
    #: The event's position in that file, in this dialect.
    row_index: str
    #: Views of this dialect are registered in the Hive metastore (else they are written to a file).
    in_metastore: bool
    #: The tie this dialect cannot break, and what a reader then gets (README, "Readers").
    ties: str


DIALECTS: dict[str, Dialect] = {
    "spark": Dialect(
        name="spark",
        sqlglot="spark",
        file_name="_metadata.file_name",
        row_index="_metadata.row_index",
        in_metastore=True,
        ties="none: file name and row index break every tie, as the compaction does",
    ),
    "hive": Dialect(
        name="hive",
        sqlglot="hive",
        file_name="regexp_extract(INPUT__FILE__NAME, '[^/]+$', 0)",
        # "+ 0", not the bare virtual column (nor a CAST of it, which Hive drops): Hive 4.0.1 names a bare
        # BLOCK__OFFSET__INSIDE__FILE by itself under the alias `_cdc_pos`, and then refuses the outer query's
        # `_cdc_pos` ("Invalid table alias or column reference '_cdc_pos'"); an arithmetic expression keeps it.
        row_index="BLOCK__OFFSET__INSIDE__FILE + 0",
        in_metastore=True,
        ties=(
            "two pending events of one key with equal order_by values in one file: Hive orders them by "
            "BLOCK__OFFSET__INSIDE__FILE, which for Parquet is the reader's position estimate, not the row "
            "index, so rows read together can compare equal and the view returns either of them"
        ),
    ),
    "trino": Dialect(
        name="trino",
        sqlglot="trino",
        file_name="regexp_extract(\"$path\", '[^/]+$')",
        row_index="CAST(NULL AS BIGINT)",
        in_metastore=True,
        ties=(
            "two pending events of one key with equal order_by values in one file: Trino and Athena have no "
            "row position, so the view returns either of them (a compaction keeps the later row)"
        ),
    ),
    "duckdb": Dialect(
        name="duckdb",
        sqlglot="duckdb",
        file_name="_cdc_src_file",
        row_index="_cdc_src_pos",
        in_metastore=False,
        ties="none: file name and file_row_number break every tie, as the compaction does",
    ),
}


@functools.lru_cache(maxsize=256)
def _parse_spark(text: str) -> exp.Expression:
    return sqlglot.parse_one(text, read="spark")


def _template_tree(cfg: TableConfig, kind: str) -> exp.Expression:
    if kind == "view":
        return _parse_spark(sql.render_mode("view_query.sql.j2", cfg))
    return _parse_spark(sql.render("rejects_query.sql.j2", cfg))


def _expression(text: str, dialect: str) -> exp.Expression:
    return sqlglot.parse_one(text, read=dialect)


#: Rendered queries by (registry entry, kind, dialect, sources). Rendering walks and prints the whole
#: rule's tree (about 70 ms), and a publish renders the same views several times (staleness checks,
#: the metastore views, the DuckDB script): the text depends on nothing else, so it is kept.
_RENDERED: collections.OrderedDict[tuple[str, str, str, tuple[tuple[str, str], ...]], str] = collections.OrderedDict()
_RENDERED_MAX = 256


def query(cfg: TableConfig, kind: str, dialect: str, sources: dict[str, exp.Expression]) -> str:
    """The SELECT of ``kind`` (``view`` or ``rejects``) in ``dialect`` over ``sources``.

    ``sources`` maps each placeholder table to a table or an aliased subquery (see
    :func:`metastore_sources` and :func:`cdc_compaction.core.duckdb_views.sources`).
    """
    key = (
        cfg.model_dump_json(),
        kind,
        dialect,
        tuple(sorted((name, src.sql(dialect=DIALECTS[dialect].sqlglot)) for name, src in sources.items())),
    )
    text = _RENDERED.get(key)
    if text is None:
        text = _render(cfg, kind, dialect, sources)
        _RENDERED[key] = text
        if len(_RENDERED) > _RENDERED_MAX:
            _RENDERED.popitem(last=False)
    else:
        _RENDERED.move_to_end(key)
    return text


def _render(cfg: TableConfig, kind: str, dialect: str, sources: dict[str, exp.Expression]) -> str:
    d = DIALECTS[dialect]
    file_name, row_index = _expression(d.file_name, d.sqlglot), _expression(d.row_index, d.sqlglot)

    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Table) and node.name in sources:
            src = sources[node.name].copy()
            if isinstance(src, exp.Table) and node.alias:
                src.set("alias", exp.TableAlias(this=exp.to_identifier(node.alias)))
            return src
        if isinstance(node, exp.Anonymous) and node.name.lower() == FILE_NAME:
            return file_name.copy()
        if isinstance(node, exp.Anonymous) and node.name.lower() == ROW_INDEX:
            return row_index.copy()
        if dialect == "hive" and isinstance(node, exp.GenerateSeries):
            # Hive 2.3 has no sequence(): an array of n elements to explode is split(space(n - 1), ' ').
            n = exp.Cast(this=exp.Sub(this=node.args["end"].copy(), expression=exp.Literal.number(1)), to="int")
            return exp.Split(this=exp.Anonymous(this="space", expressions=[n]), expression=exp.Literal.string(" "))
        if dialect == "hive" and isinstance(node, exp.IsNan):
            # Hive has no isnan(), and its comparison operators compare doubles with compareTo, which
            # holds NaN equal to NaN (so `x <> x` never finds one): compare with NaN itself.
            nan = exp.Cast(this=exp.Literal.string("NaN"), to=exp.DataType.build("double"))
            return exp.Paren(this=exp.EQ(this=node.this.copy(), expression=nan))
        return node

    tree = _template_tree(cfg, kind).copy().transform(swap)
    leftover = [n.name for n in tree.find_all(exp.Table, exp.Anonymous) if n.name.startswith("__cdc_")]
    if leftover:
        raise ValueError(f"{cfg.qualified_name}: placeholders {leftover} have no source in {dialect}")
    return tree.sql(dialect=d.sqlglot, pretty=True)


def metastore_sources(cfg: TableConfig) -> dict[str, exp.Expression]:
    """The three sources as the metastore's tables (``db.t_base``, ``db.t_tombstones``, ``db.t_incremental``)."""
    names = sql.table_names(cfg)
    return {
        BASE: exp.table_(names["base_table"], db=cfg.database, quoted=True),
        TOMBSTONES: exp.table_(names["tombstones_table"], db=cfg.database, quoted=True),
        INCREMENTAL: exp.table_(names["incremental_table"], db=cfg.database, quoted=True),
    }


# ------------------------------------------------------------------- view objects
@dataclass(frozen=True)
class ViewDef:
    """One view of one table in one dialect: its name, columns and SELECT."""

    database: str
    name: str
    kind: str
    dialect: str
    columns: list[tuple[str, str]]
    query: str
    comment: str
    properties: dict[str, str]


REJECT_COLUMNS = [("_cdc_increment", "string"), ("_cdc_file", "string"), ("_cdc_pos", "bigint")]


def view_columns(cfg: TableConfig, kind: str) -> list[tuple[str, str]]:
    """(name, Hive type) of the view's columns."""
    from cdc_compaction.core.mode import mode_of

    if kind == "view":
        return mode_of(cfg).view_columns(cfg)
    return [(c.name, c.type) for c in cfg.columns] + [*REJECT_COLUMNS, ("_cdc_reject_reason", "string")]


def view_names(cfg: TableConfig) -> dict[str, dict[str, str]]:
    """dialect -> {kind: view name} of the metastore views the registry asks for.

    The first dialect of ``views.metastore`` gets ``<t>_view`` and ``<t>_pending_rejects``;
    each further one the same names with ``_<dialect>`` appended.
    """
    names = sql.table_names(cfg)
    out = {}
    for i, d in enumerate(cfg.views.metastore):
        suffix = "" if i == 0 else f"_{d}"
        out[d] = {"view": names["view_name"] + suffix, "rejects": names["rejects_view"] + suffix}
    return out


def _comment(cfg: TableConfig, kind: str) -> str:
    if kind == "view" and cfg.mode == "snapshot":
        return f"Current table of {cfg.qualified_name} as published (no view over pending snapshots yet)"
    if kind == "view":
        return f"Current state of {cfg.qualified_name}: base plus pending increments, deduplicated at query time"
    return f"Change events of {cfg.qualified_name} in pending increments that compaction will refuse, with the reason"


def metastore_views(cfg: TableConfig) -> list[ViewDef]:
    """Every metastore view the registry asks for (``views.metastore``), rendered."""
    fingerprint = sql.schema_fingerprint(cfg)
    out = []
    for dialect, names in view_names(cfg).items():
        for kind in KINDS:
            out.append(
                ViewDef(
                    database=cfg.database,
                    name=names[kind],
                    kind=kind,
                    dialect=dialect,
                    columns=view_columns(cfg, kind),
                    query=query(cfg, kind, dialect, metastore_sources(cfg)),
                    comment=_comment(cfg, kind),
                    properties={
                        "cdc.managed_by": "cdc_compaction",
                        "cdc.role": "view" if kind == "view" else "rejects_view",
                        "cdc.dialect": dialect,
                        "cdc.fingerprint": fingerprint,
                    },
                )
            )
    return out


def spark_statement(cfg: TableConfig, view: ViewDef) -> str:
    """``CREATE OR REPLACE VIEW`` for a Spark view (run through the Spark engine)."""
    return sql.render(
        "view.sql.j2",
        cfg,
        name=view.name,
        comment=view.comment,
        role=view.properties["cdc.role"],
        query=view.query,
    )


# Hive type -> the type a Trino view declares for the column. Timestamps are timestamp(6): Trino's Hive
# connector reads them as timestamp(3) by default (hive.timestamp-precision=MILLISECONDS), which coerces to
# timestamp(6), and as timestamp(6) under MICROSECONDS; a declared timestamp(3) would be refused as stale there.
_TRINO_TYPES = {
    "tinyint": "tinyint",
    "smallint": "smallint",
    "int": "integer",
    "bigint": "bigint",
    "float": "real",
    "double": "double",
    "string": "varchar",
    "boolean": "boolean",
    "date": "date",
    "timestamp": "timestamp(6)",
    "binary": "varbinary",
}


def trino_type(hive_type: str) -> str:
    t = hive_type.lower().replace(" ", "")
    if t in _TRINO_TYPES:
        return _TRINO_TYPES[t]
    if t.startswith(("decimal", "varchar", "char")):
        return t
    raise ValueError(f"no Trino type for Hive type {hive_type!r}")


PRESTO_VIEW_PREFIX = "/* Presto View: "
PRESTO_VIEW_SUFFIX = " */"
PRESTO_VIEW_EXPANDED = "/* Presto View */"


def trino_view_text(view: ViewDef, catalog: str) -> str:
    """The metastore text of a Trino (or Athena) view: Trino's own encoding, base64 JSON in a comment."""
    doc: dict[str, Any] = {
        "originalSql": view.query,
        "catalog": catalog,
        "schema": view.database,
        "columns": [{"name": n, "type": trino_type(t)} for n, t in view.columns],
        "comment": view.comment,
        "owner": "cdc_compaction",
        "runAsInvoker": False,
    }
    payload = base64.b64encode(json.dumps(doc, sort_keys=True).encode("utf-8")).decode("ascii")
    return PRESTO_VIEW_PREFIX + payload + PRESTO_VIEW_SUFFIX


def decode_trino_view_text(text: str) -> dict[str, Any]:
    """The JSON document of :func:`trino_view_text` (what Trino reads back)."""
    if not (text.startswith(PRESTO_VIEW_PREFIX) and text.endswith(PRESTO_VIEW_SUFFIX)):
        raise ValueError("not a Presto/Trino view text")
    return json.loads(base64.b64decode(text[len(PRESTO_VIEW_PREFIX) : -len(PRESTO_VIEW_SUFFIX)]))


def view_statements(cfg: TableConfig) -> list[str]:
    """The Spark SQL views (the deduplicating view, then the pending-rejects view) as DDL.

    Rendered from the same rule as every other dialect.
    """
    return [spark_statement(cfg, v) for v in metastore_views(cfg) if v.dialect == "spark"]
