"""Erase by predicate: remove every row matching a predicate from everywhere a table keeps rows (GDPR).

Where rows live (the *locations* of an erase)::

    live        the live version's files (data, tombstones, partitions)
    versions    every other directory under base/ (kept versions a rollback could bring back)
    pending     the landing area (increments not compacted yet)
    archive     archived increments (what a replay or rebuild reads)
    quarantine  refused rows and files
    changes     the change feed's partitions (``<t>_changes``, pipeline/changes.py)

The protocol, serialized with compactions by the table lease (:class:`lake.TableLease`):

1. Refuse while the live commit is not archived (its run is unfinished); roll forward (or discard)
   an earlier erase that did not finish (its journal says which).
2. Scan every Parquet file of every location with the predicate (pyarrow.compute, no Spark).
3. Write the journal ``_cdc/erase/<id>.json``: each matching file and the hidden name
   (``.<name>.erase-<id>``) its filtered rewrite gets beside it.  Readers skip hidden names.
4. Write the rewrites; when the live version holds matching rows, also a new version
   directory ``base/v<seq+1>-erase-<id>-a/`` with the live files, filtered.
5. The atomic decision: the erase commit record (``plan_id`` ``erase-<id>``, ``stats.kind`` ``erase``)
   when the live version changed, then the marker ``_cdc/erase/<id>.committed``.  Before it, a crash
   leaves only hidden files and an unreferenced directory, which the next erase discards.
6. After it: the pointer moves to the erase version; each rewrite replaces its original (an atomic
   copy over the same name: plans, manifests and archives name files by name, and the versions they
   belong to are no longer live -- the one documented exception to "never written again"), and the
   hidden rewrite is deleted.  Re-running the erase redoes whatever a crash left undone.
7. The audit record ``_cdc/erase/<id>.audit.json`` (who, when, predicate, rows removed per location,
   files rewritten -- never a row's values), then :func:`verify` re-reads every file and proves that
   nothing matches.

Keyless tables: the predicate also matches an event's before-image, and a version's watermark
(its tombstones file) is never rewritten.
"""

from __future__ import annotations

import getpass
import io
import json
import logging
import os
import posixpath
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cdc_compaction.exceptions import ConcurrentCommitError, ConcurrentRunError, EraseError, ErasePredicateError
from cdc_compaction.hive_types import arrow_type
from cdc_compaction.job.contract import TOMBSTONES_DIR
from cdc_compaction.job.faults import fault_point
from cdc_compaction.lake import Commit, Lake, TableLease
from cdc_compaction.registry import KeylessTable, TableConfig
from cdc_compaction.storage.base import FileInfo

log = logging.getLogger(__name__)

LOCATIONS = ("live", "versions", "pending", "archive", "quarantine", "changes")
#: How long an erase holds the table's lease; a crashed erase blocks compactions at most this long.
LEASE_TTL = timedelta(hours=1)


# ------------------------------------------------------------------------- the predicate
@dataclass(frozen=True)
class Predicate:
    """A validated erase predicate: its text, the registry columns it names and its Arrow expression."""

    text: str
    columns: tuple[str, ...]
    expression: Any  # pyarrow.compute.Expression: True where a row is to be erased


_COMPARISONS = {"EQ": "__eq__", "NEQ": "__ne__", "GT": "__gt__", "GTE": "__ge__", "LT": "__lt__", "LTE": "__le__"}


def parse_predicate(cfg: TableConfig, text: str) -> Predicate:
    """Parse ``text`` as a boolean expression over ``cfg``'s registry columns; refuse anything else.

    Allowed: column names of the registry, number/string/boolean literals, NULL, comparisons,
    AND/OR/NOT, IN (literals), IS [NOT] NULL, BETWEEN and parentheses.  Anything else (functions,
    subqueries, several statements, unknown columns) is refused naming the offending token: the text
    is never passed to an SQL engine, so it cannot inject anything.
    """
    import sqlglot
    from sqlglot import exp

    table = cfg.qualified_name

    def refuse(why: str) -> ErasePredicateError:
        return ErasePredicateError(
            f"{table}: erase --where {text!r}: {why}. Write a boolean expression over the registry columns "
            f"({', '.join(cfg.column_names)}) with literals, comparisons, AND/OR/NOT, IN, IS NULL, BETWEEN"
        )

    if not text.strip():
        raise refuse("the predicate is empty (to erase a whole table, delete it)")
    try:
        statements = sqlglot.parse(text, read="hive")
    except sqlglot.errors.ParseError as exc:
        raise refuse(f"it does not parse ({str(exc).splitlines()[0]})") from exc
    if len(statements) != 1 or statements[0] is None:
        raise refuse("it is not exactly one expression")
    tree = statements[0]
    by_lower = {c.name.lower(): c for c in cfg.columns}
    used: list[str] = []
    #: Column substitutions of the current pass (keyless tables: data column -> its before-image).
    swap: dict[str, Any] = {}

    def lookup(node: exp.Expression) -> Any:
        """The registry column a column reference names (Hive names are case-insensitive)."""
        if node.table:
            raise refuse(f"qualified column {node.sql()!r} (name the column alone)")
        col = by_lower.get(node.name.lower())
        if col is None:
            raise refuse(f"{node.name!r} is not a column of the registry")
        return col

    def column(node: exp.Expression) -> Any:
        col = lookup(node)
        col = swap.get(col.name, col)
        used.append(col.name)
        return col

    def literal(node: exp.Expression, like: Any = None) -> Any:
        import pyarrow as pa

        if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
            value: Any = -_number(node.this.this)
        elif isinstance(node, exp.Literal):
            value = node.this if node.is_string else _number(node.this)
        elif isinstance(node, exp.Boolean):
            value = bool(node.this)
        elif isinstance(node, exp.Null):
            value = None
        else:
            raise refuse(f"{node.sql()!r} is not a literal")
        if like is None:
            return pa.scalar(value)
        if value is None:
            return pa.scalar(None)
        target = arrow_type(like.type)
        try:
            # The literal takes the column's type ('2026-01-01' against a date column).
            return pa.scalar(value).cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
            if isinstance(value, str) and pa.types.is_timestamp(target) and target.tz is not None:
                # A timestamp without an offset is UTC, as the tables store timestamps.
                try:
                    return pa.scalar(value).cast(pa.timestamp(target.unit)).cast(target)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
                    pass
            raise refuse(f"literal {node.sql()} is not a {like.type} (column {like.name})") from exc

    def operand(node: exp.Expression, other: exp.Expression | None = None) -> Any:
        import pyarrow.compute as pc

        if isinstance(node, exp.Paren):
            return operand(node.this, other)
        if isinstance(node, exp.Column):
            return pc.field(column(node).name)
        while isinstance(other, exp.Paren):
            other = other.this
        return literal(node, lookup(other) if isinstance(other, exp.Column) else None)

    def build(node: exp.Expression) -> Any:
        import pyarrow.compute as pc

        kind = type(node).__name__
        if isinstance(node, exp.Paren):
            return build(node.this)
        if isinstance(node, exp.And):
            return build(node.this) & build(node.expression)
        if isinstance(node, exp.Or):
            return build(node.this) | build(node.expression)
        if isinstance(node, exp.Not):
            return ~build(node.this)
        if kind in _COMPARISONS:
            left, right = node.this, node.expression
            if not isinstance(left, exp.Column | exp.Paren) and not isinstance(right, exp.Column | exp.Paren):
                raise refuse(f"{node.sql()!r} compares no column")
            lhs, rhs = operand(left, right), operand(right, left)
            return getattr(lhs, _COMPARISONS[kind])(rhs)
        if isinstance(node, exp.Is):
            if not isinstance(node.this, exp.Column) or not isinstance(node.expression, exp.Null):
                raise refuse(f"{node.sql()!r}: only <column> IS [NOT] NULL is allowed")
            return pc.field(column(node.this).name).is_null()
        if isinstance(node, exp.In):
            if not isinstance(node.this, exp.Column) or node.args.get("query") or not node.expressions:
                raise refuse(f"{node.sql()!r}: only <column> IN (<literals>) is allowed")
            col = column(node.this)
            values = [literal(v, col) for v in node.expressions]
            import pyarrow as pa

            return pc.field(col.name).isin(pa.array([v.as_py() for v in values], type=arrow_type(col.type)))
        if isinstance(node, exp.Between):
            if not isinstance(node.this, exp.Column):
                raise refuse(f"{node.sql()!r}: only <column> BETWEEN <literal> AND <literal> is allowed")
            col = column(node.this)
            f = pc.field(col.name)
            return (f >= literal(node.args["low"], col)) & (f <= literal(node.args["high"], col))
        raise refuse(f"{node.sql()!r} ({kind}) is not allowed")

    expression = build(tree)
    if not used:
        raise refuse("it names no column")
    if isinstance(cfg, KeylessTable):
        # A keyless event carries the row's old values in its before-image columns: an update from
        # the erased person's row holds their data there, so the predicate is checked on both images.
        names = {c.name: c for c in cfg.columns}
        swap.update({d: names[b] for d, b in zip(cfg.data_columns, cfg.before_columns, strict=True)})
        import pyarrow.compute as pc

        # Only where there is a before-image (updates, deletes): copies and inserts leave it empty,
        # and "x IS NULL" must not match every one of them through it.
        has_before = pc.field(cfg.before_columns[0]).is_valid()
        for b in cfg.before_columns[1:]:
            has_before = has_before | pc.field(b).is_valid()
        expression = expression | (has_before & build(tree))
        used.extend(cfg.before_columns)  # read as NULL from files without them (a version's copies)
    return Predicate(text=text, columns=tuple(dict.fromkeys(used)), expression=expression)


def _number(text: str) -> int | float:
    return float(text) if any(ch in text for ch in ".eE") else int(text)


# ------------------------------------------------------------------------- files
@dataclass(frozen=True)
class Located:
    """One Parquet file of the lake and the location it belongs to."""

    location: str
    path: str
    size: int = 0


def _is_candidate(name: str, hidden: bool) -> bool:
    """Whether a file may hold rows: any data file (a sink may land Parquet without the suffix), and
    with ``hidden`` also hidden ones (an erase's rewrites, writers' temporaries); never the lake's
    JSON records, checksums or marker files."""
    if name.endswith((".json", ".crc")) or name.startswith("_"):
        return False
    return hidden or not name.startswith(".")


def _walk(lake: Lake, root: str, hidden: bool = False) -> Iterator[FileInfo]:
    """Every file under ``root`` that may hold rows (see :func:`_is_candidate`).

    A listing error propagates: an erase that cannot see an area must not report it clean.
    """
    for e in sorted(lake.storage.list_dir(root), key=lambda e: e.name):
        if e.is_dir:
            yield from _walk(lake, e.path, hidden)
        elif _is_candidate(e.name, hidden):
            yield e


def live_roots(lake: Lake, commit: Commit) -> list[str]:
    """The directories holding the live version's rows: its version directory and its partitions."""
    roots = [lake.layout.version_dir(commit.version)] if commit.seq else []
    for loc in (commit.partitions or {}).values():
        if not any(loc.startswith(r.rstrip("/") + "/") for r in roots):
            roots.append(loc)
    return roots


def lake_files(lake: Lake, commit: Commit, hidden: bool = False) -> list[Located]:
    """Every Parquet file the table keeps, each with its location (see the module docstring)."""
    live = live_roots(lake, commit)
    out: list[Located] = []
    seen: set[str] = set()
    for root in live:
        for f in _walk(lake, root, hidden):
            out.append(Located("live", f.path, f.size))
            seen.add(f.path)
    areas = (
        ("versions", lake.layout.base),
        ("pending", lake.layout.incremental),
        ("archive", lake.layout.archive),
        ("quarantine", lake.layout.quarantine),
        # <t>_changes's partitions (pipeline/changes.py) hold rows of the versions they diff.
        ("changes", posixpath.join(lake.layout.root, "changes")),
    )
    for location, root in areas:
        for f in _walk(lake, root, hidden):
            if f.path not in seen:
                out.append(Located(location, f.path, f.size))
                seen.add(f.path)
    return out


def _read(lake: Lake, path: str) -> Any:
    import pyarrow.parquet as pq

    with lake.storage.open_read(path) as fh:
        return pq.read_table(fh)


def _try_read(lake: Lake, path: str) -> Any | None:
    """The file's rows, or None when it is not readable Parquet (a refused file, a writer's partial
    temporary). Storage errors propagate: they may heal, and an erase must not skip a file it could read."""
    import pyarrow as pa

    try:
        return _read(lake, path)
    except pa.ArrowException as exc:
        log.warning("%s: %s is not readable Parquet (%s); listed as unreadable", lake.cfg.qualified_name, path, exc)
        return None


class _UnevaluableError(Exception):
    """A file whose columns cannot be read as the registry's types (a file refused for its schema)."""


def _with_columns(cfg: TableConfig, table: Any, columns: tuple[str, ...]) -> Any:
    """``table`` with every predicate column as its registry type: NULL where a file lacks it (a
    tombstone file), cast where a file has another type (INT96 timestamps; a quarantined file's
    ``'3'`` for an int). Raise :class:`_UnevaluableError` when a value does not convert."""
    import pyarrow as pa

    types = {c.name: arrow_type(c.type) for c in cfg.columns}
    for name in columns:
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, type=types[name]))
        elif table.schema.field(name).type != types[name]:
            i = table.column_names.index(name)
            try:
                table = table.set_column(i, name, table.column(i).cast(types[name]))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise _UnevaluableError(f"column {name} ({table.schema.field(name).type}): {exc}") from exc
    return table


def is_watermark_file(lake: Lake, path: str) -> bool:
    """A keyless version's tombstones file: its one row is the watermark (the greatest sequence
    applied), no row of the table. Erasing it would let the next compaction apply replays again."""
    return (
        isinstance(lake.cfg, KeylessTable)
        and path.startswith(lake.layout.base.rstrip("/") + "/")
        and TOMBSTONES_DIR in posixpath.relpath(path, lake.layout.base).split("/")[1:-1]
    )


def _filter(lake: Lake, pred: Predicate, path: str, table: Any) -> tuple[Any, int] | None:
    """The rows of the file ``path`` to keep and how many it holds that match; None when its
    columns cannot be compared with the predicate (logged; the caller names the file)."""
    if is_watermark_file(lake, path):
        return table, 0
    try:
        return _split(lake.cfg, pred, table)
    except _UnevaluableError as exc:
        log.warning("%s: cannot evaluate the erase predicate on %s (%s)", lake.cfg.qualified_name, path, exc)
        return None


def _split(cfg: TableConfig, pred: Predicate, table: Any) -> tuple[Any, int]:
    """The rows of ``table`` to keep and how many match the predicate."""
    import pyarrow.compute as pc

    if not table.num_rows:
        return table, 0
    import pyarrow as pa

    probe = _with_columns(cfg, table.select([n for n in table.column_names if n in pred.columns]), pred.columns)
    probe = probe.append_column("__erase_row", pa.array(range(table.num_rows), type=pa.int64()))
    try:
        # NOT COALESCE(p, false): a row whose predicate is NULL (unknown) is kept, as SQL's DELETE would.
        keep = probe.filter(pc.invert(pc.coalesce(pred.expression, False))).column("__erase_row")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _UnevaluableError(str(exc)) from exc
    # The kept rows exactly as the file had them (its own types and columns).
    return table.take(keep), table.num_rows - len(keep)


def scan(lake: Lake, pred: Predicate, hidden: bool = False) -> dict[str, Any]:
    """Matching rows per location and file, and the non-empty files no Parquet reader can read."""
    rows = dict.fromkeys(LOCATIONS, 0)
    matching: dict[str, int] = {}
    unreadable: list[str] = []
    files = lake_files(lake, lake.latest_commit(), hidden)
    for f in files:
        table = _try_read(lake, f.path)
        split = _filter(lake, pred, f.path, table) if table is not None else None
        if split is None:
            if f.size:
                unreadable.append(f.path)
            continue
        n = split[1]
        if n:
            rows[f.location] += n
            matching[f.path] = n
    return {"files_checked": len(files), "rows": rows, "matching": matching, "unreadable": unreadable}


def _write_options(lake: Lake, path: str) -> dict[str, Any]:
    """How to write a rewrite of ``path`` so that its readers read it as they read the original.

    Spark writes timestamps as INT96 by default; Arrow reads them as nanoseconds and would write
    INT64 nanoseconds back, which Spark refuses. So a file with INT96 columns is rewritten with INT96.
    """
    import pyarrow.parquet as pq

    with lake.storage.open_read(path) as fh:
        schema = pq.ParquetFile(fh).schema
        int96 = any(schema.column(i).physical_type == "INT96" for i in range(len(schema)))
    return {"use_deprecated_int96_timestamps": True} if int96 else {}


def _parquet_bytes(table: Any, options: dict[str, Any]) -> bytes:
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(table, buf, **options)
    return buf.getvalue()


# ------------------------------------------------------------------------- the journal
def erase_dir(lake: Lake) -> str:
    return posixpath.join(lake.layout.control, "erase")


def _journal_path(lake: Lake, erase_id: str) -> str:
    return posixpath.join(erase_dir(lake), f"{erase_id}.json")


def _committed_path(lake: Lake, erase_id: str) -> str:
    return posixpath.join(erase_dir(lake), f"{erase_id}.committed")


def audit_path(lake: Lake, erase_id: str) -> str:
    return posixpath.join(erase_dir(lake), f"{erase_id}.audit.json")


def temp_name(path: str, erase_id: str) -> str:
    """The hidden name a file's filtered rewrite gets beside it (readers skip hidden names)."""
    return posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.erase-{erase_id}")


def _is_committed(lake: Lake, journal: dict[str, Any]) -> bool:
    if lake.storage.exists(_committed_path(lake, journal["erase_id"])):
        return True
    seq = journal.get("commit_seq")
    if seq is None:
        return False
    commit = lake.read_commit(int(seq))
    return commit is not None and commit.plan_id == f"erase-{journal['erase_id']}"


# ------------------------------------------------------------------------- the erase
def erase(
    cfg: TableConfig,
    where: str,
    actor: str | None = None,
    now: datetime | None = None,
    lake: Lake | None = None,
) -> dict[str, Any]:
    """Erase every row matching ``where`` from every location; return the audit record (verified).

    The step a DAG or trigger calls; the CLI ``erase`` calls it too.  Raise
    :class:`ErasePredicateError` for a refused predicate (nothing was read),
    :class:`ConcurrentRunError` if a compaction holds the lease (nothing was changed) and
    :class:`EraseError` if the verification still finds a matching row.
    """
    pred = parse_predicate(cfg, where)
    lake = lake or Lake(cfg)
    actor = actor or _os_user()
    now = now or datetime.now(UTC)
    erase_id = f"e{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"
    owner = f"erase:{actor}:{erase_id}"
    lease = TableLease(lake)
    lease.acquire(owner, LEASE_TTL, now)
    try:
        finish_unfinished(lake)
        audit = _erase(lake, pred, erase_id, actor, now, owner)
    finally:
        lease.release(owner)
    problems = verify(lake, pred)
    audit["verified"] = {
        "files_checked": problems["files_checked"],
        "matching_files": problems["matching"],
        "unreadable_files": problems["unreadable"],
    }
    lake.storage.write_text(audit_path(lake, erase_id), json.dumps(audit, indent=1, sort_keys=True))
    if problems["matching"]:
        raise EraseError(
            f"{cfg.qualified_name}: erase {erase_id} ({where!r}) finished, but verification found matching rows "
            f"in {problems['matching']} (audit {audit_path(lake, erase_id)}). Run the erase again; if rows "
            "remain, a writer outside the pipeline is landing them"
        )
    return audit


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return os.environ.get("USER", "unknown")


def _erase(lake: Lake, pred: Predicate, erase_id: str, actor: str, now: datetime, owner: str) -> dict[str, Any]:
    cfg = lake.cfg
    table = cfg.qualified_name
    live = lake.latest_commit()
    if not lake.is_archived(live.seq):
        # Its increments are still in the landing area and named by its record only: an erase commit
        # on top would hide from the next plan that they are compacted already.
        raise EraseError(
            f"{table}: commit {live.seq} ({live.version}) is not archived yet, so its run has not finished "
            f"(or crashed). Nothing was erased: let the table's DAG run (its next plan finishes the archive) "
            "and run the erase again"
        )
    removed = dict.fromkeys(LOCATIONS, 0)
    entries: list[dict[str, Any]] = []
    new_files: dict[str, Any] = {}  # live file -> its filtered rows (the erase version gets every live file)
    unreadable: list[str] = []
    for f in lake_files(lake, live):
        data = _try_read(lake, f.path)
        split = _filter(lake, pred, f.path, data) if data is not None else None
        if split is None:
            if f.location == "live":
                raise EraseError(
                    f"{table}: {f.path} of the live version {live.version} is not readable Parquet of the registry's "
                    "types. Nothing was erased: restore the file (or run the table's DAG after fixing it) and run "
                    "the erase again"
                )
            if f.size:
                unreadable.append(f.path)
            continue
        kept, n = split
        if f.location == "live":
            new_files[f.path] = kept
        if n:
            removed[f.location] += n
            entries.append({"location": f.location, "path": f.path, "temp": temp_name(f.path, erase_id), "rows": n})
    live_changed = removed["live"] > 0
    seq = live.seq + 1 if live_changed else None
    version = f"v{live.seq + 1:08d}-erase-{erase_id}-a" if live_changed else None
    journal = {
        "erase_id": erase_id,
        "table": table,
        "actor": actor,
        "os_user": _os_user(),  # who ran it, beside who asked (--actor)
        "started_at": now.isoformat(),
        "predicate": pred.text,
        "parent_seq": live.seq,
        "commit_seq": seq,
        "version": version,
        "entries": entries,
        "rows_removed": removed,
        # Files no reader can read (refused, truncated): not erased, so named for a person to handle.
        "unreadable_files": unreadable,
    }
    lake.storage.write_text(_journal_path(lake, erase_id), json.dumps(journal, indent=1, sort_keys=True))
    # Hidden rewrites beside every matching file (the originals stay untouched until the decision).
    for i, e in enumerate(entries):
        split = _filter(lake, pred, e["path"], _read(lake, e["path"]))
        if split is None:  # it was evaluated a moment ago: something rewrote it meanwhile
            raise EraseError(f"{table}: {e['path']} changed during the erase; nothing was erased, run it again")
        kept = split[0]
        lake.storage.write_bytes(e["temp"], _parquet_bytes(kept, _write_options(lake, e["path"])))
        if i == 0:
            fault_point("erase.after_first_rewrite", table)
    commit = None
    if live_changed and version is not None and seq is not None:
        commit = _write_erase_version(lake, live, new_files, seq, version, erase_id, actor, now, removed["live"])
    fault_point("erase.before_commit", table)
    lease = TableLease(lake)
    if not lease.holds(owner, datetime.now(UTC)):
        # As publish does: an erase that outlived its lease may overlap a compaction; it must not decide.
        held = lease.current()
        raise ConcurrentRunError(
            f"{table}: erase {erase_id} lost the table's lease ({held.describe() if held else 'no lease'}) before "
            "its commit, so a compaction may have started. Nothing was erased; run the erase again (the lease "
            f"lasts {LEASE_TTL})"
        )
    if commit is not None:
        if not lake.try_commit(commit):
            raise ConcurrentCommitError(
                f"{table}: erase {erase_id} could not record commit {seq}: another run committed it first although "
                "the erase held the lease. Nothing was erased; run the erase again"
            )
        fault_point("erase.after_commit_record", table)
    lake.storage.write_text(_committed_path(lake, erase_id), now.isoformat())
    return _roll_forward(lake, journal)


def _write_erase_version(
    lake: Lake,
    live: Commit,
    new_files: dict[str, Any],
    seq: int,
    version: str,
    erase_id: str,
    actor: str,
    now: datetime,
    rows_removed: int,
) -> Commit:
    """Write the erase version (the live files, filtered, under a new name) and return its commit record."""
    old_dir = lake.layout.version_dir(live.version)
    new_dir = lake.layout.version_dir(version)
    data_dir = lake.layout.data_dir(version, live.layout)
    partitions: dict[str, str] | None = None
    if live.partitions is not None:
        # Every partition moves into the erase version: none of them is written again in place.
        partitions = {
            value: posixpath.join(data_dir, posixpath.basename(loc)) for value, loc in live.partitions.items()
        }
    visible = total = 0
    partition_rows: dict[str, int] = {}
    data_root = lake.data_location(live).rstrip("/") + "/"
    for path, kept in new_files.items():
        target = posixpath.join(new_dir, posixpath.relpath(path, old_dir))
        for value, loc in (live.partitions or {}).items():
            if partitions is not None and path.startswith(loc.rstrip("/") + "/"):
                target = posixpath.join(partitions[value], posixpath.relpath(path, loc))
                partition_rows[value] = partition_rows.get(value, 0) + kept.num_rows
                break
        total += kept.num_rows
        if target.startswith(posixpath.join(data_dir, "")) or path.startswith(data_root):
            visible += kept.num_rows
        lake.storage.makedirs(posixpath.dirname(target))
        lake.storage.write_bytes(target, _parquet_bytes(kept, _write_options(lake, path)))
    # Readers and the next compaction open these even when they hold no file.
    lake.storage.makedirs(data_dir)
    tomb = lake.layout.tombstones_dir(version, live.layout)
    if tomb is not None:
        lake.storage.makedirs(tomb)
    stats = dict(live.stats)
    # The counts the next compaction's validation checks its base read against.
    stats.update(
        {
            "kind": "erase",
            "erase_id": erase_id,
            "rows_erased": rows_removed,
            "output_rows": total,
            "output_visible_rows": visible,
            "output_tombstones": total - visible if live.layout >= 2 else live.stats.get("output_tombstones", 0),
        }
    )
    return Commit(
        seq=seq,
        version=version,
        plan_id=f"erase-{erase_id}",
        run_id=f"erase:{actor}",
        parent_seq=live.seq,
        files=[],
        increments=[],
        stats=stats,
        committed_at=now.isoformat(),
        partitions=partitions,
        partition_rows=(
            {v: partition_rows.get(v, 0) for v in partitions} if partitions is not None else live.partition_rows
        ),
        layout=live.layout,
        freshness=live.freshness,
        history=live.history,
        schema=live.schema,
    )


def _roll_forward(lake: Lake, journal: dict[str, Any]) -> dict[str, Any]:
    """After the decision: publish the pointer, replace each original by its rewrite, write the audit."""
    table = lake.cfg.qualified_name
    seq = journal.get("commit_seq")
    if seq is not None:
        commit = lake.read_commit(int(seq))
        if commit is None:
            raise EraseError(f"{table}: erase {journal['erase_id']} lost its commit record {seq}; restore it")
        lake.advance_pointer(commit)
        # Nothing to archive: an erase version takes no increments.
        lake.storage.write_text(lake.layout.archived_marker(int(seq)), "")
    rewritten = []
    pred: Predicate | None = None
    for i, e in enumerate(journal["entries"]):
        if lake.storage.exists(e["temp"]):
            # An original that is gone was moved meanwhile (a pending file archived by a run that came
            # after a crash): landing it again would compact it twice; its new place is scanned anew.
            if lake.storage.exists(e["path"]):
                lake.storage.copy(e["temp"], e["path"])  # atomic: the old content or the filtered one
            lake.storage.delete(e["temp"])
            if i == 0:
                fault_point("erase.after_first_swap", table)
        elif lake.storage.exists(e["path"]):
            # The rewrite is gone (swapped already, or removed by hand): filter the original itself
            # if it still matches, so a lost temporary can never leave an erased row behind.
            pred = pred or parse_predicate(lake.cfg, journal["predicate"])
            split = _filter(lake, pred, e["path"], _read(lake, e["path"]))
            if split is not None and split[1]:
                kept = split[0]
                lake.storage.write_bytes(e["path"], _parquet_bytes(kept, _write_options(lake, e["path"])))
        rewritten.append(e["path"])
    # Files were rewritten in place: a table format's metadata (sizes, column bounds) is derived, so it is
    # written anew from the kept commits rather than filtered (formats.is_metadata_path). Never raises.
    from cdc_compaction import formats

    formats.regenerate_formats(formats.runtime_for(lake.cfg, lake))
    fault_point("erase.before_audit", table)
    audit = {
        "erase_id": journal["erase_id"],
        "table": table,
        "actor": journal["actor"],
        "os_user": journal.get("os_user"),
        "started_at": journal["started_at"],
        "finished_at": datetime.now(UTC).isoformat(),
        "predicate": journal["predicate"],
        "rows_removed": journal["rows_removed"],
        "files_rewritten": rewritten,
        "unreadable_files": journal.get("unreadable_files", []),
        "commit_seq": seq,
        "version": journal.get("version"),
    }
    lake.storage.write_text(audit_path(lake, journal["erase_id"]), json.dumps(audit, indent=1, sort_keys=True))
    lake.storage.delete(_journal_path(lake, journal["erase_id"]))
    return audit


def finish_unfinished(lake: Lake) -> list[str]:
    """Roll forward every committed erase a crash interrupted; discard the uncommitted ones. Their ids."""
    done = []
    for f in lake.storage.list_dir(erase_dir(lake)):
        if not f.name.endswith(".json") or f.name.endswith(".audit.json"):
            continue
        journal = json.loads(lake.storage.read_text(f.path))
        if _is_committed(lake, journal):
            log.warning("%s: finishing erase %s a crash interrupted", lake.cfg.qualified_name, journal["erase_id"])
            _roll_forward(lake, journal)
        else:
            log.warning(
                "%s: discarding erase %s (it crashed before its commit)", lake.cfg.qualified_name, journal["erase_id"]
            )
            for e in journal["entries"]:
                if lake.storage.exists(e["temp"]):
                    lake.storage.delete(e["temp"])
            if journal.get("version"):
                lake.storage.delete_tree(lake.layout.version_dir(journal["version"]))
            lake.storage.delete(f.path)
        done.append(journal["erase_id"])
    return done


def verify(lake: Lake, pred: Predicate) -> dict[str, Any]:
    """Re-read every Parquet file of every location (hidden ones too) and list the ones that still match."""
    found = scan(lake, pred, hidden=True)
    return {"files_checked": found["files_checked"], "matching": found["matching"], "unreadable": found["unreadable"]}


def preview(cfg: TableConfig, where: str, lake: Lake | None = None) -> dict[str, Any]:
    """What an erase would remove (rows per location, matching files), changing nothing."""
    pred = parse_predicate(cfg, where)
    lake = lake or Lake(cfg)
    found = scan(lake, pred)
    return {
        "table": cfg.qualified_name,
        "predicate": where,
        "rows": found["rows"],
        "files": sorted(found["matching"]),
        "unreadable": found["unreadable"],
    }
