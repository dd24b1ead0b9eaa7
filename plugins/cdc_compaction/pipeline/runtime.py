"""What every step of a run shares: the :class:`Runtime`, the clock, plan files, version names, the lease owner.

The names the compaction job writes (``META_COLUMNS``, ``STATS_FILE``, ``PARTITION_COLUMN``)
come from the job's contract (``cdc_compaction.job.contract``), where they are defined once.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cdc_compaction.core import sql
from cdc_compaction.core.deployment import deployment_id
from cdc_compaction.core.exceptions import PlanError
from cdc_compaction.core.lake import Lake, TableLease, version_dir_of
from cdc_compaction.core.ownership import claim
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.core.settings import MetastoreEndpoint
from cdc_compaction.integrations.engine import Engine

log = logging.getLogger(__name__)

#: ``v<seq>-<plan>`` or, since every compaction attempt writes its own directory, ``v<seq>-<plan>-<attempt>``.
VERSION_NAME = re.compile(r"^v(\d{8})-([0-9a-z]+(?:-[0-9a-z]+)?)$")


@dataclass
class Runtime:
    """Everything a step needs: the table, its lake, the metastore and a Spark engine."""

    cfg: TableConfig
    lake: Lake
    metastore: MetastoreEndpoint
    engine: Engine

    def __post_init__(self) -> None:
        # Every step sees the columns the source added or widened (``schema_changes: evolve``), kept in
        # the lake: the registry alone would name fewer columns than the tables have, and refuse them.
        from cdc_compaction.core.schema import effective_config

        self.cfg = effective_config(self.cfg, self.lake.storage)

    @property
    def names(self) -> dict[str, str]:
        return sql.table_names(self.cfg)


def utcnow() -> datetime:
    return datetime.now(UTC)


def read_json(rt: Runtime, path: str) -> dict[str, Any]:
    return json.loads(rt.lake.storage.read_text(path))


def load_plan(rt: Runtime, plan_path: str) -> dict[str, Any]:
    if not plan_path or not rt.lake.storage.exists(plan_path):
        raise PlanError(f"{rt.cfg.qualified_name}: plan file {plan_path!r} does not exist; clear the run's plan task")
    p = read_json(rt, plan_path)
    root = rt.lake.layout.root.rstrip("/") + "/"
    output = str(p.get("output_location") or root)
    if not output.startswith(root) and "seq" in p and rt.lake.read_commit(int(p["seq"])) is None:
        # A plan made before the lake was copied or moved names the old root's files: its job would write there.
        # (Once committed, the steps after publish read the commit record, whose paths follow the root.)
        raise PlanError(
            f"{rt.cfg.qualified_name}: plan file {plan_path} was made under another storage root (it writes to "
            f"{output}, not under {rt.lake.layout.root}): the lake was copied or moved while this run was in "
            "flight. Nothing was changed; clear the run's plan task, so that a new plan is made under this root"
        )
    return p


def not_compacting(rt: Runtime, p: dict[str, Any], step: str) -> dict[str, Any] | None:
    """``{"skipped": reason}`` if the plan ``p`` decided not to compact (README, "Compaction policy"), else None.

    The steps from ``compact`` to ``archive`` then do nothing: the increments stay pending and
    the views (``refresh_view``) show them.  Retrying such a step does nothing again.
    """
    from cdc_compaction.core.policy import deferred

    why = deferred(p)
    if why is None:
        return None
    log.info("%s: %s skips: %s", rt.cfg.qualified_name, step, why)
    return {"skipped": why}


def version_seq(location: str | None) -> int | None:
    """The commit sequence number of the version a base location lies in (None for other locations).

    Takes a version directory, its ``data``/``tombstones`` or a partition directory in them.
    """
    m = VERSION_NAME.match(posixpath.basename(version_dir_of(location or "")))
    return int(m.group(1)) if m else None


def lease_owner(run_id: str) -> str:
    """Who holds a table's lease during a run: this deployment and the Airflow run."""
    return f"{deployment_id()}/{run_id}"


def take_lease(rt: Runtime, owner: str, now: datetime | None = None) -> None:
    """Take or renew the table's lease for ``owner`` (see :class:`cdc_compaction.core.lake.TableLease`).

    First the root must be the table's (core/ownership.py): every task that writes the lake takes the
    lease, so a lake made before the ownership marker is adopted by whichever writes first.
    """
    claim(rt.lake)
    TableLease(rt.lake).acquire(owner, rt.cfg.lease_timeout, now or utcnow())
