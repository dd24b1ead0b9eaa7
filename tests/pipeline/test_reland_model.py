"""Random landings, re-landings, compactions and archives against a model of the contract (issue 35).

The steps run the DAG's task functions on real storage, metastore and Spark: land an increment,
re-land a compacted one under its old names (the archived bytes copied back, or new content), run
``plan`` .. ``publish`` with or without ``archive``, and look at the views.  After every step the
Spark view and the DuckDB view, and after a compaction the base table, must equal what the model
says.  The model is the contract's rule (/work/shared/conformance/README.md) written here: the
table holds, for each key, the greatest of every event ever landed by (order_by, increment, file,
row), absent if that is a delete; the view shows, at every moment, what a compaction would produce.
"""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from cdc_compaction.devtools.conformance import DuckDBReader, Reader, land
from cdc_compaction.pipeline.archive import archive
from cdc_compaction.pipeline.plan import plan
from cdc_compaction.pipeline.publish import publish
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.validate import validate
from cdc_compaction.pipeline.views import refresh_view

from .helpers import run_job

pytestmark = [pytest.mark.spark, pytest.mark.metastore]

Event = tuple[int, str, str, int]  # id, full_name, op, ts_ms


# ------------------------------------------------------------------ the model (the contract alone)
@dataclass
class Model:
    """Every event ever landed, with where it was: (increment, file, row) -> event, a multiset over landings."""

    seen: list[tuple[str, str, int, Event]] = field(default_factory=list)

    def land(self, increment: str, files: list[list[Event]]) -> None:
        for i, rows in enumerate(files):
            self.seen += [(increment, f"part-{i:05d}.parquet", pos, ev) for pos, ev in enumerate(rows)]

    def table(self) -> dict[int, tuple[str, int]]:
        """Each key's winner by (order_by, increment, file, row); a delete winner hides the key."""
        best: dict[int, tuple[tuple[int, str, str, int], Event]] = {}
        for inc, name, pos, ev in self.seen:
            rank = (ev[3], inc, name, pos)
            if ev[0] not in best or rank > best[ev[0]][0]:
                best[ev[0]] = (rank, ev)
        return {k: (ev[1], ev[3]) for k, (_, ev) in best.items() if ev[2] != "d"}


# ------------------------------------------------------------------ the steps
@st.composite
def streams(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    """land / reland_same / reland_new / compact (archive or not) / archive / view, each possible when drawn."""
    ts = iter(range(1, 10_000))  # order_by values never tie between different events (the rule leaves that open)

    def files() -> list[list[Event]]:
        out = []
        for _ in range(draw(st.integers(1, 2))):
            rows = draw(st.lists(st.tuples(st.integers(1, 4), st.sampled_from("cud")), min_size=1, max_size=3))
            # Later events may carry earlier order_by values: only order_by decides, not the landing order.
            out.append([(k, f"n{next(ts)}", op, draw(st.integers(0, 5)) * 100 + next(ts)) for k, op in rows])
        return out

    actions: list[tuple[Any, ...]] = []
    pending: set[str] = set()  # landed, not taken by a compaction yet
    compacted: set[str] = set()  # every file taken by a compaction, still in the landing area
    archived: set[str] = set()  # taken and archived (gone from the landing area)
    unarchived = False
    n = 0
    # Every stream starts with a compacted increment, so that re-landing is possible from the first step.
    first = ["land", "compact"]
    for step in range(draw(st.integers(4, 8)) + len(first)):
        kinds = ["land", "compact", "compact", "view"]
        # Twice as likely as the others: re-landing is what this test is about.
        kinds += ["reland_same"] * 2 if archived else []
        kinds += ["reland_new"] * 2 if archived or compacted else []
        kinds += ["archive"] if unarchived else []
        kind = first[step] if step < len(first) else draw(st.sampled_from(kinds))
        if kind == "land":
            inc = f"increment_{2026112200 + n}"
            n += 1
            actions.append(("land", inc, files()))
            pending.add(inc)
        elif kind in ("reland_same", "reland_new"):
            pool = sorted(archived) if kind == "reland_same" else sorted(archived | compacted)
            inc = draw(st.sampled_from(pool))
            actions.append((kind, inc, files()) if kind == "reland_new" else (kind, inc))
            archived.discard(inc)
            compacted.discard(inc)
            pending.add(inc)
        elif kind == "compact":
            keep = draw(st.booleans())  # archive in the same run, or leave it to the next run's plan
            actions.append(("compact", keep))
            if unarchived:  # the plan finishes the last archive first
                archived |= compacted
                compacted = set()
            if pending:
                (archived if keep else compacted).update(pending)
                pending = set()
                unarchived = not keep
        elif kind == "archive":
            actions.append(("archive",))
            archived |= compacted
            compacted, unarchived = set(), False
        else:
            actions.append(("view",))
    return [*actions, ("view",), ("compact", True)]


@dataclass
class Table:
    """The table under test, driven through the task functions."""

    rt: Any
    spark: Any
    model: Model = field(default_factory=Model)
    #: increment -> the last content landed under its name (what a re-land of the same bytes copies back).
    contents: dict[str, list[list[Event]]] = field(default_factory=dict)
    last_plan: str = ""
    runs: int = 0

    def land(self, increment: str, files: list[list[Event]]) -> None:
        rows = [[{"id": k, "full_name": name, "op": op, "ts_ms": ts} for k, name, op, ts in f] for f in files]
        # Under a compacted increment's name: the sink lands the hour again, over the same file names.
        land(self.rt.cfg, increment, rows)
        self.contents[increment] = files
        self.model.land(increment, files)

    def reland_same(self, increment: str) -> None:
        """docs/data.md's re-land: copy the increment's newest archived directory back under its name."""
        archive_root = Path(self.rt.lake.layout.archive)
        src = max((p for p in archive_root.glob(f"c*/{increment}") if p.is_dir()), key=lambda p: p.parent.name)
        dst = Path(self.rt.lake.layout.incremental, increment)
        dst.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            shutil.copy2(f, dst / f.name)  # bytes and mtime as archived
        self.model.land(increment, self.contents[increment])

    def compact(self, archive_too: bool) -> None:
        self.runs += 1
        # One DAG run id for every run of this table: a run that did not archive still holds the lease,
        # as a DAG run would until its archive task ran, and the next plan finishes that archive first.
        path = plan(self.rt, "model-run")
        if not path:
            return
        run_job(self.rt, path)
        validate(self.rt, path)
        publish(self.rt, path)
        self.last_plan = path
        if archive_too:
            archive(self.rt, path)

    def archive(self) -> None:
        archive(self.rt, self.last_plan)


def _rows(rows: list[dict[str, Any]]) -> dict[int, tuple[str, int]]:
    return {r["id"]: (r["full_name"], r["ts_ms"]) for r in rows}


def _landed_data(t: Table) -> list[str]:
    root = Path(t.rt.lake.layout.incremental)
    return sorted(str(p.relative_to(root)) for p in root.rglob("part-*.parquet")) if root.exists() else []


def test_random_relandings_follow_the_contract(make_cfg, runtime, spark, tmp_path, request, capsys) -> None:
    counts: Counter[str] = Counter()
    duck = DuckDBReader()

    @fuzz_settings(test_examples=6)
    @given(actions=streams())
    def body(actions: list[tuple[Any, ...]]) -> None:
        counts["examples"] += 1
        rt = runtime(make_cfg(views={"duckdb": str(tmp_path / f"duck{counts['examples']}" / "views.sql")}))
        ensure_tables(rt)
        t = Table(rt, spark)
        reader = Reader(spark)
        for i, a in enumerate(actions):
            counts[a[0]] += 1
            if a[0] in ("land", "reland_new"):
                t.land(a[1], a[2])
            elif a[0] == "reland_same":
                t.reland_same(a[1])
            elif a[0] == "compact":
                t.compact(a[1])
                want = t.model.table()
                assert _rows(reader.visible_base(rt.cfg)) == want, f"base after action {i}: {actions[: i + 1]}"
                if a[1]:
                    # Everything landed before the run was taken and archived: nothing is left behind.
                    assert _landed_data(t) == [], f"left in the landing area after action {i}: {actions[: i + 1]}"
            elif a[0] == "archive":
                t.archive()
            else:
                refresh_view(rt)  # as the view refresher does between runs
                want = t.model.table()
                assert _rows(reader.view(rt.cfg)) == want, f"Spark view after action {i}: {actions[: i + 1]}"
                assert _rows(duck.view(rt.cfg)) == want, f"DuckDB view after action {i}: {actions[: i + 1]}"
        counts["commits"] += len(list(Path(rt.lake.layout.commits).glob("*.json")))

    try:
        body()
    finally:
        with capsys.disabled():
            print(f"\n{request.node.name}: {dict(counts)}")
