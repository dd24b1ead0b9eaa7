"""Which state a rebuild's replay continues from at a rollback commit: no Spark, no metastore.

The replay keeps its result after each commit; a rollback commit to N continues from the
result as of N; when the replay started after N (``--since``) the rollback's own kept version
stands in, and when that is gone too the rebuild is refused, naming the commit and the way out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_compaction.core.exceptions import RebuildError
from cdc_compaction.core.lake import Commit, Lake
from cdc_compaction.pipeline.rebuild import rolled_back_state


def _rollback_commit(seq: int, to_seq: int) -> Commit:
    return Commit(
        seq=seq,
        version=f"v{seq:08d}-rb{to_seq}-abcd1234",
        plan_id="rollback-abcd1234",
        run_id="rollback:test:abcd1234",
        parent_seq=seq - 1,
        files=[],
        increments=[],
        stats={"output_rows": 7, "output_tombstones": 1},
        rollback={"to_seq": to_seq, "to_version": f"v{to_seq:08d}-p", "by": "test"},
    )


def test_rollback_continues_from_the_replay_as_of_its_target(make_cfg) -> None:
    lake = Lake(make_cfg())
    replayed_1 = {"seq": 1, "version": "v00000001-p-a", "data": "/r/v1/data", "rows": 3, "written": True}
    replayed_2 = {"seq": 2, "version": "v00000002-p-a", "data": "/r/v2/data", "rows": 5, "written": True}
    commit = _rollback_commit(4, 1)
    state = rolled_back_state(lake, commit, {1: replayed_1, 2: replayed_2}, "owner")
    # Commit 1's replayed files, now as the state after commit 4.
    assert (state["data"], state["rows"], state["written"]) == ("/r/v1/data", 3, True)
    assert (state["seq"], state["commit"]) == (4, commit)


def test_rollback_before_the_replay_start_uses_its_kept_version_or_is_refused(make_cfg) -> None:
    cfg = make_cfg()
    lake = Lake(cfg)
    commit = _rollback_commit(4, 1)
    with pytest.raises(RebuildError) as err:
        rolled_back_state(lake, commit, {3: {"seq": 3}}, "owner")
    text = str(err.value)
    assert cfg.qualified_name in text and "commit 4 rolls back to version 1" in text
    assert commit.version in text and "without --since" in text

    Path(lake.data_location(commit)).mkdir(parents=True)  # the rollback's own version is kept
    state = rolled_back_state(lake, commit, {3: {"seq": 3}}, "owner")
    assert state["data"] == lake.data_location(commit) and state["seq"] == 4
    assert (state["rows"], state["tombstone_rows"]) == (7, 1) and not state.get("written")
