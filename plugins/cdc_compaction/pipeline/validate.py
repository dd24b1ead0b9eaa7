"""The ``validate`` step: check the newest attempt at a plan before it may be published.

The job's counts must reconcile with themselves, with the plan (the planned files' footer
rows), with the parent version and with the Parquet footers of what is on storage; the
files must be the ones the job reported, with the expected schema, and nothing else where
readers glob.  The attempt that passed is recorded: ``publish`` commits exactly that one.
"""

from __future__ import annotations

import json
import logging
import posixpath
from collections.abc import Sequence
from typing import Any

from cdc_compaction.core.exceptions import CompactionError, ConcurrentCommitError, PublishValidationError
from cdc_compaction.core.inputs import parquet_footer
from cdc_compaction.core.lake import Commit
from cdc_compaction.core.mode import OutputDir, mode_named, mode_of
from cdc_compaction.core.storage import Storage, is_data_file
from cdc_compaction.integrations.metastore import connect
from cdc_compaction.job.contract import (
    CHANGE_TYPE,
    CHANGES_DIR,
    COMMIT_VERSION,
    DATA_DIR,
    FEED_CHANGE_TYPES,
    INDEX_DIR,
    LAYOUT,
    PARTITION_COLUMN,
    SEQ_COLUMN,
    STATS_FILE,
    TOMBSTONES_DIR,
    partition_dir_value,
)
from cdc_compaction.pipeline.runtime import Runtime, load_plan, not_compacting, read_json, utcnow

log = logging.getLogger(__name__)

_ARROW_TYPES = {
    "tinyint": "int8",
    "smallint": "int16",
    "int": "int32",
    "bigint": "int64",
    "float": "float",
    "double": "double",
    "string": "string",
    "boolean": "bool",
    "date": "date32[day]",
    "binary": "binary",
}


def _arrow_type_ok(hive_type: str, arrow_type: str) -> bool:
    if hive_type in _ARROW_TYPES:
        return _ARROW_TYPES[hive_type] == arrow_type
    if hive_type == "timestamp":
        return arrow_type.startswith("timestamp")
    if hive_type.startswith("decimal"):
        return arrow_type.startswith("decimal")
    if hive_type.startswith(("varchar", "char")):
        return arrow_type == "string"
    return False


def _footer(storage: Storage, path: str) -> tuple[int, Any]:
    meta = parquet_footer(storage, path)
    return meta.num_rows, meta.schema.to_arrow_schema()


def _output_files(storage: Storage, out: str, mode_dirs: Sequence[OutputDir] = ()) -> tuple[dict[str, int], list[str]]:
    """A layout-2 version directory's files: (data files by ``data/…``/``tombstones/…`` name, anything else).

    Partition directories' files are named ``data/<dir>/<file>``.  Anything else inside
    ``data/`` or ``tombstones/`` (a ``_SUCCESS`` marker, ``.crc`` checksums, a stray
    directory) is returned apart: a reader's glob of the location would pick it up.
    ``mode_dirs``: the table mode's own output directories (``TableMode.output_dirs``), read alike.
    """
    files: dict[str, int] = {}
    other: list[str] = []

    def walk(path: str, rel: str, partitions: bool, prefix: str = "") -> None:
        for e in storage.list_dir(path):
            name = f"{rel}/{e.name}"
            if not e.is_dir and is_data_file(e.name):
                files[name] = e.size
            elif e.is_dir and (
                (partitions and partition_dir_value(e.name) is not None) or (prefix and e.name.startswith(prefix))
            ):
                walk(e.path, name, False)
            else:
                other.append(name + ("/" if e.is_dir else ""))

    walk(posixpath.join(out, DATA_DIR), DATA_DIR, True)
    walk(posixpath.join(out, TOMBSTONES_DIR), TOMBSTONES_DIR, False)
    # Partitioned tables: the key index, index/cdc_partition=<v>/ (README, "Key index").
    walk(posixpath.join(out, INDEX_DIR), INDEX_DIR, True)
    # Tables with change_feed (cdc, keyless, snapshot): the commit's change, one file (README, "Change feed").
    walk(posixpath.join(out, CHANGES_DIR), CHANGES_DIR, False)
    # The mode's own outputs (snapshot: history/eff_start_date=<date>/).
    for d in mode_dirs:
        walk(posixpath.join(out, d.name), d.name, False, d.prefix)
    return files, other


def foreign_outputs(storage: Storage, out: str, mode_dirs: Sequence[OutputDir]) -> list[str]:
    """Subdirectories of a version directory holding data files that the table's mode does not write.

    (Another mode's output directory, a history/ in a cdc table's version.) Everything the
    table's mode writes lies in ``data/``, ``tombstones/``, ``index/`` or one of ``mode_dirs``.
    """
    known = {DATA_DIR, TOMBSTONES_DIR, INDEX_DIR, CHANGES_DIR, *(d.name for d in mode_dirs)}

    def holds_data(path: str) -> bool:
        return any((e.is_dir and holds_data(e.path)) or is_data_file(e.name) for e in storage.list_dir(path))

    return sorted(e.name for e in storage.list_dir(out) if e.is_dir and e.name not in known and holds_data(e.path))


def _partition_problems(p: dict[str, Any], stats: dict[str, Any], parent: Commit | None, out: str) -> list[str]:
    """A partitioned compaction's own checks: it read whole partitions and wrote only touched ones."""
    problems = []
    touched = set(stats.get("partitions_touched", []))
    parent_map = p.get("base_partitions") or {}
    parent_rows = sum(int(((parent.partition_rows if parent else None) or {}).get(v, 0)) for v in touched)
    # Layout 2 keeps a partitioned table's tombstones apart, and the job ranks all of them.
    if parent is not None and parent.layout >= 2:
        parent_rows += int(parent.stats.get("output_tombstones", 0))
    if stats["base_rows"] != parent_rows:
        problems.append(
            f"the job read {stats['base_rows']} base rows from the {len(touched & set(parent_map))} partitions it "
            f"touched and the tombstones, but they hold {parent_rows} in version {p['parent_version']}"
        )
    if int(p.get("base_layout", 1)) < 2 and not set(parent_map) <= touched:
        problems.append(
            f"the live version has layout 1 (tombstones inside its partitions), so every partition must be "
            f"rewritten once, but {sorted(set(parent_map) - touched)} were not"
        )
    written = stats.get("partitions", {})
    if not set(written) <= touched:
        problems.append(f"the job wrote partitions {sorted(set(written) - touched)} it did not report as touched")
    data = posixpath.join(out.rstrip("/"), DATA_DIR)
    outside = sorted(v for v, loc in written.items() if posixpath.dirname(loc.rstrip("/")) != data)
    if outside:
        problems.append(f"partitions {outside} were reported outside the new version's data directory {data}")
    if stats.get("partitions_reused") != len(set(parent_map) - touched):
        problems.append(
            f"the job reports {stats.get('partitions_reused')} reused partitions, "
            f"the plan leaves {len(set(parent_map) - touched)} untouched"
        )
    return problems


def index_problems(stats: dict[str, Any], out: str, index_files: dict[str, int]) -> list[str]:
    """A partitioned compaction's key index (README, "Key index"): one per written partition, whole and exact.

    ``index_files`` are the index's Parquet files (``index/<dir>/<file>``) and their footer rows.
    The job wrote the index of every partition it wrote, in this attempt's ``index/``; the rows
    of each partition's index files equal the partition's data rows (footers), and the job found
    no index row without its data row or the reverse (``index_mismatches``). A job from before
    the key index wrote none (no ``index`` in its stats): nothing to check, the next compactions
    read those partitions' key columns.
    """
    if stats.get("index") is None:
        return [f"the job wrote index files {sorted(index_files)} but reported no index"] if index_files else []
    problems = []
    index, data_rows = stats["index"], stats.get("partition_rows") or {}
    where = posixpath.join(out.rstrip("/"), INDEX_DIR)
    if sorted(index) != sorted(data_rows):
        problems.append(
            f"the key index covers partitions {sorted(index)}, the job wrote partitions {sorted(data_rows)}"
        )
    outside = sorted(v for v, loc in index.items() if posixpath.dirname(loc.rstrip("/")) != where)
    if outside:
        problems.append(f"the key index of partitions {outside} was reported outside the new version's {where}")
    by_partition: dict[str, int] = {}
    files_of: dict[str, list[str]] = {}
    for name, rows in sorted(index_files.items()):
        value = partition_dir_value(name.split("/")[1]) if name.count("/") > 1 else None
        by_partition[value or ""] = by_partition.get(value or "", 0) + rows
        files_of.setdefault(value or "", []).append(name)
    for value in sorted(set(by_partition) | set(data_rows)):
        if by_partition.get(value, 0) != int(data_rows.get(value, 0)):
            problems.append(
                f"partition {value!r}: its key index {files_of.get(value, ['(no file)'])} holds "
                f"{by_partition.get(value, 0)} rows in the Parquet footers, its data {data_rows.get(value, 0)}"
            )
    if stats.get("index_mismatches"):
        problems.append(
            f"{stats['index_mismatches']} keys differ between the key index and the data of the rewritten partitions"
        )
    return problems


def count_problems(p: dict[str, Any], stats: dict[str, Any], parent: Commit | None, out: str) -> list[str]:
    """What the job's counts (``stats``) contradict: themselves, the plan ``p`` and the ``parent`` version.

    No I/O: the plan's file rows are the footer counts ``plan`` recorded, the parent's rows
    its commit record's.  ``out`` is the attempt's version directory (partitioned tables:
    where the rewritten partitions must lie).  One line per problem, in a fixed order.
    """
    problems: list[str] = []
    if stats.get("plan_id") != p["plan_id"]:
        problems.append(f"stats belong to plan {stats.get('plan_id')}, not {p['plan_id']}")
    if stats.get("layout") != LAYOUT:
        problems.append(f"the job wrote layout {stats.get('layout', 1)}, this version of the package expects {LAYOUT}")
    # The counts the table mode's rule must add up to (keys, sides, rows in and out); plans made
    # before modes existed are cdc plans.
    problems += mode_named(p.get("mode")).count_problems(stats)
    # The job must have read the whole previous base (partitioned: all of each partition it
    # touched) and every planned file.
    if p.get("partition_by"):
        problems += _partition_problems(p, stats, parent, out)
    else:
        parent_rows = int(parent.stats.get("output_rows", 0)) if parent is not None else 0
        if stats["base_rows"] != parent_rows:
            problems.append(
                f"the job read {stats['base_rows']} base rows, but version {p['parent_version']} has {parent_rows}"
            )
    # Row counts the plan read from the footers: a file changed after planning shows up here.
    # JSON and Avro files: their records, of which tombstones, heartbeats and transaction records were
    # skipped (docs/concepts.md#input-formats), so the job's rows plus those skipped must make them up.
    planned_rows = sum(int(f["rows"]) for f in p["files"])
    skipped = int(stats.get("skipped_records") or 0)
    if planned_rows != stats["increment_rows"] + skipped:
        read = f"{stats['increment_rows']} increment rows" + (f" and skipped {skipped} records" if skipped else "")
        problems.append(f"the job read {read}, the planned files held {planned_rows}")
    return problems


def footer_problems(
    p: dict[str, Any], stats: dict[str, Any], footer_rows: dict[str, int], footer_rows_by_partition: dict[str, int]
) -> list[str]:
    """What the rows counted in the written files' Parquet footers contradict in the job's report.

    ``footer_rows`` by directory (``data``, ``tombstones``), ``footer_rows_by_partition`` by
    partition value (partitioned tables' ``data`` only).
    """
    problems: list[str] = []
    if footer_rows[DATA_DIR] != stats["output_visible_rows"]:
        problems.append(
            f"Parquet footers of {DATA_DIR}/ hold {footer_rows[DATA_DIR]} rows, "
            f"the job reported {stats['output_visible_rows']} visible rows"
        )
    if footer_rows[TOMBSTONES_DIR] != stats["output_tombstones"]:
        problems.append(
            f"Parquet footers of {TOMBSTONES_DIR}/ hold {footer_rows[TOMBSTONES_DIR]} rows, "
            f"the job reported {stats['output_tombstones']} tombstones"
        )
    if p.get("partition_by") and footer_rows_by_partition != stats.get("partition_rows"):
        problems.append(
            f"rows per partition in the Parquet footers {footer_rows_by_partition} differ from the job's "
            f"report {stats.get('partition_rows')}"
        )
    return problems


def attempts(rt: Runtime, p: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(version, stats) of every finished attempt at plan ``p``, oldest first.

    Every run of the compaction job writes its own ``<version>-<attempt>`` directory; an
    attempt has finished when its stats file is there (the job writes it last).
    """
    found = []
    for e in rt.lake.storage.list_dir(rt.lake.layout.base):
        if not e.is_dir or not (e.name == p["version"] or e.name.startswith(p["version"] + "-")):
            continue
        stats_path = posixpath.join(e.path, STATS_FILE)
        if not rt.lake.storage.exists(stats_path):
            continue  # killed or still running: not an attempt to publish
        try:
            stats = read_json(rt, stats_path)
        except ValueError:
            log.warning("%s: unreadable %s is skipped", rt.cfg.qualified_name, stats_path)
            continue
        if stats.get("plan_id") == p["plan_id"]:
            found.append((e.name, stats))
    return sorted(found, key=lambda a: (str(a[1].get("finished_at", "")), a[0]))


def _locations(rt: Runtime, version: str) -> dict[str, str]:
    lay = rt.lake.layout
    return {
        "version": version,
        "output_location": lay.version_dir(version),
        "quarantine_location": lay.quarantine_dir(version),
    }


def _committed(rt: Runtime, p: dict[str, Any]) -> Commit | None:
    """The commit of plan ``p`` if it was committed; raise if another plan took its number."""
    commit = rt.lake.read_commit(p["seq"])
    if commit is not None and commit.plan_id != p["plan_id"]:
        raise ConcurrentCommitError(
            f"{rt.cfg.qualified_name}: commit {commit.seq} was taken by plan {commit.plan_id} "
            f"(run {commit.run_id}); this run's plan {p['plan_id']} is stale and nothing of it is published. "
            "Nothing was changed: re-run the DAG"
        )
    return commit


def feed_problems(
    p: dict[str, Any], stats: dict[str, Any], feed_files: dict[str, int], parent: Commit | None
) -> list[str]:
    """What the job's change feed (stats ``change_feed``) contradicts; no row is read.

    ``feed_files``: the Parquet files in ``changes/`` and their footer rows. The plan's
    ``change_feed`` asks for exactly one file, of this commit, holding the rows the stats count;
    an update is a pair; and on an unpartitioned table the visible rows grew by inserts less deletes.
    """
    feed = stats.get("change_feed")
    if not p.get("change_feed"):
        if feed or feed_files:
            return [f"the job wrote a change feed ({sorted(feed_files)}) the plan did not ask for"]
        return []
    if not isinstance(feed, dict):
        return ["the plan asks for the change feed (registry change_feed) but the job's stats report none"]
    problems = []
    rows = {k: int((feed.get("rows") or {}).get(k, 0)) for k in FEED_CHANGE_TYPES}
    if sorted(feed_files) != [feed.get("file")]:
        problems.append(
            f"the change feed must be the one file {feed.get('file')}; {CHANGES_DIR}/ holds {sorted(feed_files)}"
        )
    elif feed_files[feed["file"]] != sum(rows.values()):
        problems.append(
            f"the Parquet footer of {feed['file']} holds {feed_files[feed['file']]} rows, "
            f"the job counted {sum(rows.values())} ({rows})"
        )
    if feed.get("seq") != p["seq"]:
        problems.append(f"the change feed is of commit {feed.get('seq')}, the plan's commit is {p['seq']}")
    if rows["update_before"] != rows["update_after"]:
        problems.append(f"the change feed's updates are not pairs: {rows}")
    if not p.get("primary_key") and (rows["update_before"] or rows["update_after"]):
        # A multiset (keyless) has no key to pair an old copy with a new one: its change is inserts and deletes.
        problems.append(f"the change feed of a table without a key holds updates: {rows}")
    # A layout-1 parent counted its tombstones among its rows: no visible count to hold the feed against.
    before = (parent.stats or {}).get("output_visible_rows") if parent is not None and parent.layout >= 2 else None
    if parent is not None and parent.seq == 0:
        before = 0
    if not p.get("partition_by") and before is not None:
        grown = int(stats["output_visible_rows"]) - int(before)
        if grown != rows["insert"] - rows["delete"]:
            problems.append(
                f"the visible rows went from {before} to {stats['output_visible_rows']}, but the change feed "
                f"has {rows['insert']} inserts and {rows['delete']} deletes"
            )
    return problems


def validate(rt: Runtime, plan_path: str) -> dict[str, Any]:
    """Check the newest attempt at the plan before it may be published; raise :class:`PublishValidationError`.

    Records which attempt passed (publish commits exactly that one). A plan that was
    committed already is not validated again: its commit's stats are returned.
    """
    cfg, lake = rt.cfg, rt.lake
    p = load_plan(rt, plan_path)
    skipped = not_compacting(rt, p, "validate")
    if skipped is not None:
        return skipped
    done = _committed(rt, p)
    if done is not None:
        log.info(
            "%s: plan %s is committed already as %s; nothing to validate",
            cfg.qualified_name,
            p["plan_id"],
            done.version,
        )
        return {**done.stats, **_locations(rt, done.version), "already_committed": True}
    tried = attempts(rt, p)
    if not tried:
        raise CompactionError(
            f"{cfg.qualified_name}: no attempt of the compaction job finished plan {p['plan_id']} (no "
            f"{STATS_FILE} in any {p['output_location']}-<attempt> directory). Clear the compact task to run it again"
        )
    version, stats = tried[-1]
    out = lake.layout.version_dir(version)
    parent = lake.read_commit(p["parent_seq"])
    problems = count_problems(p, stats, parent, out)
    # What is on storage must be what the job reported, with the expected schema, and nothing else
    # where readers glob: the data and tombstones directories hold Parquet data files only.
    mode = mode_named(p.get("mode"))
    mode_dirs = {d.name: d for d in mode.output_dirs(cfg)}
    on_disk, other = _output_files(lake.storage, out, list(mode_dirs.values()))
    if other:
        problems.append(f"{out} holds files that are not data files where readers read: {sorted(other)}")
    reported = {f["name"]: f["size"] for f in stats["output_files"]}
    if on_disk != reported:
        problems.append(
            f"output files differ from the job's report: on storage {sorted(on_disk)}, reported {sorted(reported)}"
        )
    footer_rows = {DATA_DIR: 0, TOMBSTONES_DIR: 0, **dict.fromkeys(mode_dirs, 0)}
    footer_rows_by_partition: dict[str, int] = {}
    # The rows of each mode output directory's partitions (snapshot: history rows by date).
    footer_rows_by_output: dict[str, dict[str, int]] = {name: {} for name in mode_dirs}
    # The mode's own output columns (snapshot: operation, eff_start_date, the hashes) follow the registry's.
    # The columns the plan read with (registry + evolved, schema_changes: evolve); older plans: the registry's.
    planned = p.get("columns") or [{"name": c.name, "type": c.type} for c in cfg.columns]
    columns = [(c["name"], c["type"]) for c in planned]
    want = (
        columns
        + mode_of(cfg).output_columns(cfg)
        + [
            ("_cdc_increment", "string"),
            ("_cdc_file", "string"),
            ("_cdc_pos", "bigint"),
            ("_cdc_ingested_at", "timestamp"),
        ]
    )
    # Tombstones keep their partition as a column; data files have it in their directory name.
    want_tomb = want + ([(PARTITION_COLUMN, "string")] if p.get("partition_by") else [])
    # A mode output directory's partition column is its directory's name, not a column of its files.
    want_output = {name: [c for c in want if c[0] != d.partition_column] for name, d in mode_dirs.items()}
    # The key index holds the key columns, in key order (its partition is its directory).
    types = dict(columns)
    want_index = [(k, types.get(k, "?")) for k in p.get("primary_key") or []]
    index_files: dict[str, int] = {}
    # The change feed: the registry's columns a feed row holds (keyless: the data columns), then the change's
    # (pipeline/changes.py feed_columns).
    not_in_feed = set(cfg.column_names) - set(mode_of(cfg).feed_columns(cfg))
    want_feed = [
        *(c for c in columns if c[0] not in not_in_feed),
        (CHANGE_TYPE, "string"),
        (COMMIT_VERSION, "bigint"),
        (SEQ_COLUMN, "int"),
    ]
    feed_files: dict[str, int] = {}
    for name in sorted(on_disk):
        rows, schema = _footer(lake.storage, posixpath.join(out, name))
        kind, _, rest = name.partition("/")
        if kind == CHANGES_DIR:
            feed_files[name] = rows
            got = [(f.name, str(f.type)) for f in schema]
            if [n for n, _ in got] != [n for n, _ in want_feed] or not all(
                _arrow_type_ok(h, a) for (_, h), (_, a) in zip(want_feed, got, strict=True)
            ):
                problems.append(f"{name} has schema {got}, expected {want_feed}")
                break
            continue
        if kind == INDEX_DIR:
            index_files[name] = rows
            got = [(f.name, str(f.type)) for f in schema]
            if [n for n, _ in got] != [n for n, _ in want_index] or not all(
                _arrow_type_ok(h, a) for (_, h), (_, a) in zip(want_index, got, strict=True)
            ):
                problems.append(f"{name} has schema {got}, expected the key columns {want_index}")
                break
            continue
        footer_rows[kind] += rows
        if kind == DATA_DIR and "/" in rest:
            value = partition_dir_value(rest.split("/", 1)[0]) or ""
            footer_rows_by_partition[value] = footer_rows_by_partition.get(value, 0) + rows
        if kind in mode_dirs:
            value = rest.split("/", 1)[0].removeprefix(mode_dirs[kind].prefix)
            by_value = footer_rows_by_output[kind]
            by_value[value] = by_value.get(value, 0) + rows
        expect = want_tomb if kind == TOMBSTONES_DIR else want_output.get(kind, want)
        got = [(f.name, str(f.type)) for f in schema]
        if [n for n, _ in got] != [n for n, _ in expect] or not all(
            _arrow_type_ok(h, a) for (_, h), (_, a) in zip(expect, got, strict=True)
        ):
            problems.append(f"{name} has schema {got}, expected {expect}")
            break
    problems += footer_problems(p, stats, footer_rows, footer_rows_by_partition)
    problems += feed_problems(p, stats, feed_files, parent)
    if p.get("partition_by"):
        problems += index_problems(stats, out, index_files)
    elif index_files:
        problems.append(f"{out} holds key index files {sorted(index_files)}, but the table is not partitioned")
    problems += mode.validate_outputs(cfg, stats, out, footer_rows_by_output)
    foreign = foreign_outputs(lake.storage, out, list(mode_dirs.values()))
    if foreign:
        problems.append(
            f"{out} holds data files in {[f'{name}/' for name in foreign]}, which a mode: {mode.name} "
            "compaction does not write"
        )
    if problems:
        raise PublishValidationError(
            f"{cfg.qualified_name}: version {version} failed validation and was not published: "
            + "; ".join(problems)
            + ". Nothing changed for readers; inspect the version directory and the compact task log, "
            "then clear the compact task (a new attempt writes a new directory)"
        )
    with connect(rt.metastore) as ms:
        # Let people inspect the staged output through the compactor table.
        ms.set_location(cfg.database, rt.names["compactor_table"], posixpath.join(out, DATA_DIR))
    marker = {"plan_id": p["plan_id"], "seq": p["seq"], "version": version, "validated_at": utcnow().isoformat()}
    lake.storage.write_text(lake.layout.validated_path(p["plan_id"]), json.dumps(marker, indent=1, sort_keys=True))
    log.info("%s: version %s validated (%d rows)", cfg.qualified_name, version, stats["output_rows"])
    return {**{k: v for k, v in stats.items() if k != "output_files"}, **_locations(rt, version)}
