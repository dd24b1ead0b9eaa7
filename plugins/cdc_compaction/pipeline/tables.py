"""The ``ensure_tables`` step: the table's database, tables and views exist and match the registry.

Creates what is missing, adds new columns, widens types where that is safe, and refuses
drops, renames and any other type change (:func:`_check_columns`); a fingerprint in each
table's properties makes an unchanged registry cost no DDL and no JVM.
"""

from __future__ import annotations

import logging
import posixpath
from types import SimpleNamespace
from typing import Any

from cdc_compaction.core import sql
from cdc_compaction.core.docs import doc_ref
from cdc_compaction.core.exceptions import SchemaChangeError, StorageRootMismatchError
from cdc_compaction.core.hive_types import hive_widening
from cdc_compaction.core.identifiers import RESERVED_PREFIX, normalize_hive_type
from cdc_compaction.core.lake import EMPTY_VERSION, version_dir_of
from cdc_compaction.core.mode import mode_of
from cdc_compaction.core.ownership import claim
from cdc_compaction.integrations.metastore import Metastore, connect
from cdc_compaction.job.contract import META_COLUMNS, PARTITION_COLUMN
from cdc_compaction.pipeline import views
from cdc_compaction.pipeline.runtime import Runtime, version_seq

log = logging.getLogger(__name__)


def _check_columns(rt: Runtime, table: str, existing: list[Any], extra: list[str]) -> tuple[list[Any], dict[str, str]]:
    """Registry columns missing from ``table`` and columns to widen (name -> new type).

    Refuse drops, renames and any type change that is not a widening.
    """
    registry = {c.name.lower(): c for c in rt.cfg.columns}
    # A registry column never starts with the reserved prefix: such a column is the pipeline's own
    # (a mode's hidden column left from an option since removed, as cdc's unchanged bookkeeping).
    have = {
        c.name.lower(): c
        for c in existing
        if c.name.lower() not in extra and not c.name.lower().startswith(RESERVED_PREFIX)
    }
    gone = [c for c in have if c not in registry]
    if gone:
        raise SchemaChangeError(
            f"{rt.cfg.qualified_name}: table {table} has columns {gone} that the registry no longer lists. "
            "Dropping or renaming columns is not automatic: add them back to the registry, or migrate the "
            f"table by hand (see {doc_ref('data', 'changing-a-schema')})"
        )
    widen: dict[str, str] = {}
    for name, col in have.items():
        old, new = normalize_hive_type(col.type), normalize_hive_type(registry[name].type)
        if old == new:
            continue
        if not hive_widening(old, new):
            raise SchemaChangeError(
                f"{rt.cfg.qualified_name}: column {col.name!r} is {old} in table {table}, but the registry says "
                f"{new}. Changing a live column's type is only widening (int -> bigint, float -> double, "
                "decimal(p,s) -> a decimal holding every value of it, varchar/char -> string): put the type "
                f"back, or migrate the table by hand (see {doc_ref('data', 'changing-a-schema')})"
            )
        widen[col.name] = new
    return [c for name, c in registry.items() if name not in have], widen


def ensure_tables(rt: Runtime) -> dict[str, Any]:
    """Create the database and the base / incremental / compactor tables (and the mode's own); add new columns."""
    cfg, lay, st = rt.cfg, rt.lake.layout, rt.lake.storage
    db, names = cfg.database, rt.names
    fingerprint = sql.schema_fingerprint(cfg)
    # Before anything is written: the root must be (or become) this table's alone (core/ownership.py).
    claim(rt.lake)
    for d in (lay.data_dir(EMPTY_VERSION), str(lay.tombstones_dir(EMPTY_VERSION)), lay.incremental, lay.staging):
        st.makedirs(d)
    statements: list[str] = []
    with connect(rt.metastore) as ms:
        check_storage_root(rt, ms)
        latest = rt.lake.latest_commit()
        live = rt.lake.data_location(latest)
        tables = {
            names[role]: ms.get_table(db, names[role])
            for role in ("base_table", "tombstones_table", "incremental_table", "compactor_table")
        }
        # A mode's outputs may add columns to the tables, and tables of their own (TableMode.extra_tables).
        mode = mode_of(cfg)
        own = [name.lower() for name, _ in mode.output_columns(cfg)]
        extra_tables = {x.name: (x, ms.get_table(db, x.name)) for x in mode.extra_tables(cfg)}
        widened: dict[str, dict[str, str]] = {}
        base_t = tables[names["base_table"]]
        want_keys = [PARTITION_COLUMN] if cfg.partition_by is not None else []
        if base_t is not None and [k.lower() for k in base_t.partition_keys] != want_keys:
            raise SchemaChangeError(
                f"{cfg.qualified_name}: table {names['base_table']} is partitioned by {base_t.partition_keys}, but "
                f"field 'partition_by' asks for {want_keys or 'no partitions'}. Changing partition_by is not "
                "automatic: put it back, or reload the table under a new storage_root and table name "
                f"(see {doc_ref('partitioned', 'partitioned-tables')})"
            )
        if any(t is None for t in tables.values()):
            # A partitioned base table stays at base/: its partitions point into the version directories.
            statements += sql.create_statements(
                cfg,
                base_location=lay.base if cfg.partition_by is not None else live,
                tombstones_location=rt.lake.tombstones_location(latest),
                incremental_location=lay.incremental,
                compactor_location=lay.staging,
            )
        for x, t in extra_tables.values():
            if t is None:
                # Its partitions point into the version directories, as a partitioned base table's do.
                statements.append(sql.render(x.template, cfg, location=lay.base))
        checked = dict(tables)
        checked.update({name: t for name, (_, t) in extra_tables.items()})
        for name, t in checked.items():
            if t is None or (t.parameters or {}).get("cdc.fingerprint") == fingerprint:
                continue
            extra = [*META_COLUMNS, *own] if name != names["incremental_table"] else ["_cdc_increment"]
            if name == names["tombstones_table"]:
                extra = [*META_COLUMNS, *own, PARTITION_COLUMN]
            missing, widen = _check_columns(rt, name, list(t.sd.cols), extra)
            widened[name] = widen
            if name in (names["base_table"], names["tombstones_table"]):
                # The mode's hidden columns (cdc: the bookkeeping of left-out values) a table made
                # before them lacks: the views read them; old files read NULL there.
                have = {c.name.lower() for c in t.sd.cols}
                missing += [
                    SimpleNamespace(name=n, type=kind, comment="")
                    for n, kind in mode.output_columns(cfg)
                    if n.lower() not in have
                ]
            if missing:
                statements.append(sql.add_columns_statement(cfg, name, missing))
            statements.append(sql.set_fingerprint_statement(cfg, name))
        for name, widen in widened.items():
            if widen:
                # Spark SQL cannot change a column's type; the metastore can (Spark's schema too).
                log.warning("%s: widening %s of %s", cfg.qualified_name, widen, name)
                ms.widen_columns(db, name, widen)
        # Stale Spark views go in the same submission: one JVM for all DDL of a run, not two.
        stale = views.stale(rt, ms)
        statements += views.spark_statements(rt, stale)
        if statements:
            log.info("%s: running %d DDL statements", cfg.qualified_name, len(statements))
            rt.engine.run_sql(cfg, statements)
        # Hive and Trino views go straight to the metastore (after the tables they read exist).
        views.put_other_views(rt, ms, stale)
        # The registry's storage root is the truth: follow it if it moved.
        inc_table = names["incremental_table"]
        if tables[inc_table] is not None and ms.table_location(db, inc_table) != lay.incremental:
            log.warning("%s: incremental table moves to %s", cfg.qualified_name, lay.incremental)
            ms.set_location(db, inc_table, lay.incremental)
            ms.drop_partitions(db, inc_table, list(ms.partitions(db, inc_table)))
    # Moving the base table to the live version is left to plan, which holds the lease.
    return {"ddl_statements": len(statements), "live_version": latest.version}


def check_storage_root(rt: Runtime, ms: Metastore) -> None:
    """Refuse a ``storage_root`` that changed under a live table without its data moving along.

    The metastore names the live version (the table's location, or its partitions'); if
    that lies under another root, the registry's root must hold the same commit (the whole
    tree was copied there).  Otherwise the next run would publish a near-empty base.
    """
    cfg, lay = rt.cfg, rt.lake.layout
    db, base = cfg.database, rt.names["base_table"]
    location = ms.table_location(db, base)
    if location is None:
        return
    shown = list(ms.partitions(db, base).values()) if cfg.partition_by is not None else [location]
    for loc in shown:
        version_dir = version_dir_of(loc)
        seq = version_seq(version_dir)
        if not seq or posixpath.dirname(version_dir) == lay.base:
            continue
        here = rt.lake.read_commit(seq)
        if here is not None and here.version == posixpath.basename(version_dir):
            continue  # the whole tree moved: follow it
        raise StorageRootMismatchError(
            f"{cfg.qualified_name}: field 'storage_root' is {cfg.storage_root} ({lay.root}), but the metastore "
            f"serves {base} from {loc} (commit {seq}), and {lay.commits} has no record of that commit. Nothing "
            f"was changed. Put storage_root back, or move the data: copy the whole old table root (base/, "
            f"_cdc/, incremental/, archive/, quarantine/) to {lay.root}, then run again"
        )
