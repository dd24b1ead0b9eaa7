"""The change feed of the keyless and snapshot modes (docs/data.md, "Change feed"; issue 38 item 1).

``mode: keyless``: a table's rows are a multiset, so a commit's feed is the multiset difference of its
version and its parent: one ``delete`` row per copy removed and one ``insert`` row per copy added (no
update pairs), rows equal column by column (NULL equal to NULL) being copies of one row.  The job writes
it in the same pass as the version; ``publish`` copies it to ``changes/c<seq>.parquet``; a commit without
it gets it from the fallback diff.  The expectation is a multiset difference written here from the
scenario's expected rows before and after each compaction (the contract's, never the project's diff).

``mode: snapshot``: the feed is the per-key change between consecutive current tables (the registry's
columns; ``operation`` and ``eff_start_date`` are the mode's bookkeeping): ``insert`` (a key only the new
one holds), ``delete`` (only the old one), ``update_before`` + ``update_after`` (both, any column
differing; NULL equal to NULL, NULL not equal to '').
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from cdc_compaction.core.lake import Lake
from cdc_compaction.core.registry import parse_table
from cdc_compaction.devtools import conformance as conf
from cdc_compaction.operations.travel import change_feed
from cdc_compaction.pipeline.changes import write_feed

from .test_change_feed_job import _committed_steps, _feed_on

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

SCENARIO_DIR = Path(__file__).resolve().parents[1] / "scenarios"
#: NULLs matched null-safely and a removal that finds no copy (unmatched: no change); copies of one row
#: removed one at a time over three commits.
KEYLESS = [
    SCENARIO_DIR / "keyless" / f"{n}.json" for n in ("null_values_match_null_safely", "delete_one_of_two_copies")
]


#: A NULL compared with '' and an unchanged key (update_nochange_delete_insert); a deleted key coming back and
#: a delta export's keys not supplied (deleted_key_comes_back, delta_not_supplied).
SNAPSHOT = [
    SCENARIO_DIR / "snapshot" / f"{n}.json"
    for n in ("update_nochange_delete_insert", "deleted_key_comes_back", "delta_not_supplied")
]


def _norm(v: Any) -> Any:
    return "NaN" if isinstance(v, float) and math.isnan(v) else v


def multiset_change(cols: list[str], before: list[dict], after: list[dict]) -> list[tuple[str, tuple]]:
    """The contract's change of a multiset: per distinct row (NULL a value), the newer version's surplus
    copies inserted and the older one's deleted."""
    old = Counter(tuple(_norm(r.get(c)) for c in cols) for r in before)
    new = Counter(tuple(_norm(r.get(c)) for c in cols) for r in after)
    out = [("insert", r) for r, n in (new - old).items() for _ in range(n)]
    out += [("delete", r) for r, n in (old - new).items() for _ in range(n)]
    return sorted(out, key=repr)


def _rows(table: Any, cols: list[str]) -> list[tuple[str, tuple]]:
    return sorted(((r["_change_type"], tuple(_norm(r[c]) for c in cols)) for r in table.to_pylist()), key=repr)


#: make test runs each mode's first scenario; the others repeat its checks on other streams (extended tier).
def _first_in_make_test(paths: list[Path]) -> list[Any]:
    return [p if i == 0 else pytest.param(p, id=p.stem, marks=pytest.mark.extended) for i, p in enumerate(paths)]


def _run(
    path: Path, suffix: str, inprocess: conf.InProcessRunner, readers: Any, tmp_path: Path
) -> tuple[Any, Lake, list[list[dict]]]:
    """The scenario with the feed on, through the real task functions; its table, lake and committed states."""
    scn = _feed_on(path)
    result = conf.run_scenario(scn, inprocess, readers, tmp_path / "lake", suffix=suffix)
    assert result.ok, "\n".join(result.failures)
    cfg = parse_table(conf.registry_doc(scn, tmp_path / "lake", suffix))
    lake = Lake(cfg)
    afters = _committed_steps(scn)
    assert lake.latest_commit().seq == len(afters)
    return cfg, lake, afters


def _published_feed(lake: Lake, seq: int) -> tuple[Any, dict, Path]:
    """Commit ``seq``, the feed its job recorded, and the published file, checked to be a copy of the job's."""
    commit = lake.read_commit(seq)
    feed = commit.stats.get("change_feed")
    assert feed, f"commit {seq}: the job wrote no change feed (stats {sorted(commit.stats)})"
    job_file = Path(lake.layout.version_dir(commit.version)) / feed["file"]
    published = Path(lake.layout.root) / "changes" / f"c{seq:08d}.parquet"
    assert published.read_bytes() == job_file.read_bytes()  # publish copied the job's file
    return commit, feed, published


@pytest.mark.parametrize("path", _first_in_make_test(KEYLESS), ids=lambda p: p.stem)
def test_the_job_writes_each_keyless_commits_multiset_change(
    path: Path, inprocess: conf.InProcessRunner, readers: Any, tmp_path: Path
) -> None:
    cfg, lake, afters = _run(path, "_kf", inprocess, readers, tmp_path)
    data = list(cfg.data_columns)  # type: ignore[attr-defined]
    before: list[dict] = []
    for seq, after in enumerate(afters, 1):
        commit, feed, published = _published_feed(lake, seq)
        table = pq.read_table(published)
        # The data columns (no op, position or before-image: they are empty in every copy), then the change's.
        assert table.column_names == [*data, "_change_type", "_commit_version", "_commit_seq"]
        assert set(table.column("_commit_seq").to_pylist()) <= {seq}
        assert set(table.column("_commit_version").to_pylist()) <= {seq}
        counts = Counter(table.column("_change_type").to_pylist())
        assert {k: v for k, v in feed["rows"].items() if v} == dict(counts), (seq, feed, counts)
        expected = multiset_change(data, before, after)
        assert _rows(table, data) == expected, f"commit {seq}"
        # The fallback (a commit without the job's file: a rollback's, an erase's) writes the same change.
        published.unlink()
        assert write_feed(lake, commit)
        assert _rows(pq.read_table(published), data) == expected, f"commit {seq}, the fallback"
        before = after
    # `changes --from N --to M`: the net multiset difference, each row with the last commit that changed its count.
    states, last = [[], *afters], len(afters)
    for start in range(last):
        net = change_feed(lake, start, last)
        assert net.column_names == [*data, "_change_type", "_commit_version"]
        got = sorted(
            ((r["_change_type"], tuple(_norm(r[c]) for c in data), r["_commit_version"]) for r in net.to_pylist()),
            key=repr,
        )

        def last_change(row: tuple, start: int = start) -> int:
            counts = [Counter(tuple(_norm(r.get(c)) for c in data) for r in v)[row] for v in states]
            return max(s for s in range(start + 1, last + 1) if counts[s] != counts[s - 1])

        want = sorted(((k, r, last_change(r)) for k, r in multiset_change(data, states[start], afters[-1])), key=repr)
        assert got == want, f"changes --from {start} --to {last}"
    # The <t>_changes table over them, through the metastore.
    got = inprocess.spark.table(f"{cfg.database}.{cfg.table}_changes").collect()
    assert len(got) == sum(len(multiset_change(data, b, a)) for b, a in zip([[], *afters], afters, strict=False))


def per_key_change(key: list[str], cols: list[str], before: list[dict], after: list[dict]) -> list[tuple[str, tuple]]:
    """The contract's per-key change: rows paired by key; insert / delete / update_before + update_after where
    any of ``cols`` differs (NULL equal to NULL only)."""
    old = {tuple(r.get(c) for c in key): tuple(_norm(r.get(c)) for c in cols) for r in before}
    new = {tuple(r.get(c) for c in key): tuple(_norm(r.get(c)) for c in cols) for r in after}
    out: list[tuple[str, tuple]] = []
    for k in set(old) | set(new):
        o, n = old.get(k), new.get(k)
        if o is None:
            out.append(("insert", n))
        elif n is None:
            out.append(("delete", o))
        elif o != n:
            out += [("update_before", o), ("update_after", n)]
    return sorted(out, key=repr)


@pytest.mark.parametrize("path", _first_in_make_test(SNAPSHOT), ids=lambda p: p.stem)
def test_the_job_writes_each_snapshot_commits_per_key_change(
    path: Path, inprocess: conf.InProcessRunner, readers: Any, tmp_path: Path
) -> None:
    cfg, lake, afters = _run(path, "_sf", inprocess, readers, tmp_path)
    cols, key = list(cfg.column_names), list(cfg.primary_key)  # type: ignore[attr-defined]
    before: list[dict] = []
    for seq, after in enumerate(afters, 1):
        commit, feed, published = _published_feed(lake, seq)
        table = pq.read_table(published)
        assert table.column_names == [*cols, "_change_type", "_commit_version", "_commit_seq"]
        counts = Counter(table.column("_change_type").to_pylist())
        assert {k: v for k, v in feed["rows"].items() if v} == dict(counts), (seq, feed, counts)
        expected = per_key_change(key, cols, before, after)
        assert _rows(table, cols) == expected, f"commit {seq}"
        # The fallback diff of the two versions (a commit without the job's file) writes the same change.
        published.unlink()
        assert write_feed(lake, commit)
        assert _rows(pq.read_table(published), cols) == expected, f"commit {seq}, the fallback"
        before = after
    # `changes --from 0 --to <last>`: the net change, per key.
    net = change_feed(lake, 0, len(afters))
    assert _rows(net, cols) == per_key_change(key, cols, [], afters[-1])
