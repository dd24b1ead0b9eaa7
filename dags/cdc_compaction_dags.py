"""One CDC compaction Airflow DAG per table of the registry (include/registry/*.yaml).

Thin on purpose: the ``cdc_compaction`` package (under plugins/) reads and validates
the registry once per process and builds every DAG.  A bad registry file never makes
this file an import error (that would mark every table's DAG stale): its table gets an
unscheduled DAG that shows the error in its docs and fails its only task with it.
"""

from __future__ import annotations

from airflow.sdk import get_parsing_context

from cdc_compaction.factory import build_dags
from cdc_compaction.registry import load_registry
from cdc_compaction.settings import ERASE_DAG_ID, VIEW_REFRESH_DAG_ID, registry_dir

# When a task runs, Airflow parses this file for that task's DAG only: build just that one
# (the DAG processor's full parse has no DAG id here and builds every table's DAG, plus the
# view refresher and the erase DAG, which cover every table). The entry gets the full parse's
# verdict: load_registry still checks it against every other file.
_wanted = get_parsing_context().dag_id
_entries = load_registry(registry_dir(), dag_id=None if _wanted in (VIEW_REFRESH_DAG_ID, ERASE_DAG_ID) else _wanted)
_dags = build_dags(
    _entries,
    view_refresher=_wanted in (None, VIEW_REFRESH_DAG_ID),
    eraser=_wanted in (None, ERASE_DAG_ID),
    # An erase task needs its own DAG only (built over every table), not one DAG per table.
    tables=_wanted != ERASE_DAG_ID,
)
for _dag_id, _dag in sorted(_dags.items()):
    globals()[_dag_id] = _dag
