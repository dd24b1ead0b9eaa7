"""One CDC compaction Airflow DAG per table of the registry (include/registry/*.yaml).

Thin on purpose: the ``cdc_compaction`` package (under plugins/) reads and validates
the registry once per process and builds every DAG.  A bad registry file shows up as
an import error for its own table only.
"""

from __future__ import annotations

from cdc_compaction.factory import build_dags
from cdc_compaction.registry import load_registry
from cdc_compaction.settings import registry_dir

for _dag_id, _dag in sorted(build_dags(load_registry(registry_dir())).items()):
    globals()[_dag_id] = _dag
