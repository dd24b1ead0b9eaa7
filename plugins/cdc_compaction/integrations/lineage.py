"""OpenLineage facets of a compaction run: which increments went into which table, column by column.

The ``publish`` task reports them (``factory.LineagePythonOperator``) through the Airflow
OpenLineage provider, which sends them wherever ``[openlineage] transport`` says (Marquez, a
file, ...; README, "Lineage (OpenLineage)").  Everything that decides *what* is reported is a
pure function of the registry entry, the commit record and the metastore endpoint
(:func:`operator_lineage`); only :func:`publish_lineage` reads the lake.

Lineage is a side channel: :func:`publish_lineage` never raises.  A failure is logged and
counted (``cdc_compaction.lineage_failed``); the run and its data are unaffected.

Imported only when a task runs (the DAG file must not load the OpenLineage client at parse time).
"""

from __future__ import annotations

import collections
import logging
import os
import posixpath
from collections.abc import Mapping
from typing import Any

import attr
from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.facet_v2 import (
    BaseFacet,
    RunFacet,
    column_lineage_dataset,
    input_statistics_input_dataset,
    output_statistics_output_dataset,
    schema_dataset,
)

from cdc_compaction.core import sidechannel
from cdc_compaction.core.docs import doc_ref
from cdc_compaction.core.exceptions import LineageError
from cdc_compaction.core.lake import Commit, Layout
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.core.settings import MetastoreEndpoint
from cdc_compaction.job.contract import META_COLUMNS, PARTITION_COLUMN, STATS_FILE

log = logging.getLogger(__name__)

#: Airflow metric counted when the lineage of a run could not be built (tags: table).
LINEAGE_FAILED_METRIC = "cdc_compaction.lineage_failed"
#: Failed lineage builds of this process, by table (for the logs and tests; the metric is what ops watch).
LINEAGE_FAILURES: collections.Counter[str] = collections.Counter()
#: The run facet's key in an event's ``run.facets``.
RUN_FACET = "cdcCompaction"
#: The types of the metadata columns the compaction adds (``include/sql/_columns.sql.j2``).
META_TYPES = {"_cdc_increment": "string", "_cdc_file": "string", "_cdc_pos": "bigint", "_cdc_ingested_at": "timestamp"}


@attr.define
class CdcCompactionRunFacet(RunFacet):
    """What the commit of this run counted (``_cdc_stats.json``): events in, refused, rows out."""

    seq: int
    version: str
    planId: str  # noqa: N815 - OpenLineage facets use camelCase keys
    increments: int
    #: Events of the planned files, and those refused (kept in quarantine).
    eventsIn: int  # noqa: N815
    eventsRejected: int  # noqa: N815
    #: Rows the new version holds: visible rows plus tombstones, and each of them.
    eventsOut: int  # noqa: N815
    visibleRows: int  # noqa: N815
    tombstones: int

    @staticmethod
    def _get_schema() -> str:
        # The spec wants a URL of the facet's JSON schema: the CDC tables plugin serves it (RUN_FACET_SCHEMA).
        return run_facet_schema_url()


#: Where the CDC tables plugin (``cdc_compaction.airflow.ui``, mounted at ``/cdc``) serves :data:`RUN_FACET_SCHEMA`.
RUN_FACET_SCHEMA_PATH = "/cdc/openlineage/CdcCompactionRunFacet.json"
_COUNT = {"type": "integer", "minimum": 0}
#: The JSON schema of :class:`CdcCompactionRunFacet` (version 1), by the OpenLineage spec's rules for
#: custom facets: a ``$defs`` entry that extends the spec's ``RunFacet``.
RUN_FACET_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$defs": {
        "CdcCompactionRunFacet": {
            "allOf": [
                {"$ref": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunFacet"},
                {
                    "type": "object",
                    "description": "What the commit of a CDC compaction run counted (_cdc_stats.json).",
                    "properties": {
                        "seq": _COUNT,
                        "version": {"type": "string"},
                        "planId": {"type": "string"},
                        "increments": _COUNT,
                        "eventsIn": _COUNT,
                        "eventsRejected": _COUNT,
                        "eventsOut": _COUNT,
                        "visibleRows": _COUNT,
                        "tombstones": _COUNT,
                    },
                    "required": ["seq", "version", "planId", "increments", "eventsIn", "eventsRejected", "eventsOut"],
                },
            ]
        }
    },
    "type": "object",
    "properties": {"cdcCompaction": {"$ref": "#/$defs/CdcCompactionRunFacet"}},
}


def run_facet_schema_url() -> str:
    """The https URL of :data:`RUN_FACET_SCHEMA` as Airflow's api-server serves it (``[api] base_url``).

    ``$AIRFLOW__API__BASE_URL`` (or ``airflow.cfg``'s) is the address users reach Airflow at;
    without one, Airflow's own default address.
    """
    base = os.environ.get("AIRFLOW__API__BASE_URL", "")
    if not base:
        try:
            from airflow.configuration import conf

            base = str(conf.get("api", "base_url", fallback="") or "")
        except Exception:  # outside Airflow: its default address below
            log.debug("no [api] base_url readable", exc_info=True)
    base = (base or "http://localhost:8080").rstrip("/")
    return f"{base}{RUN_FACET_SCHEMA_PATH}#/$defs/CdcCompactionRunFacet"


def storage_dataset(path: str) -> tuple[str, str]:
    """(namespace, name) of a lake path by the OpenLineage naming spec: ``s3://bucket`` + key, or ``file`` + path."""
    for scheme in ("s3://", "s3a://"):
        if path.startswith(scheme):
            bucket, _, key = path[len(scheme) :].partition("/")
            return f"s3://{bucket}", key.rstrip("/")
    return "file", path.removeprefix("file://").rstrip("/") or "/"


def table_dataset(endpoint: MetastoreEndpoint, database: str, table: str, region: str | None = None) -> tuple[str, str]:
    """(namespace, name) of a metastore table: ``hive://host:port`` + ``db.table``, or the Glue ARN style.

    Glue's naming needs the region and the account (the connection's ``catalog_id``); without
    both it is ``glue://<catalog>`` + ``db.table``, so the event still names the table.
    """
    if endpoint.kind == "glue":
        if region and endpoint.catalog_id:
            return f"arn:aws:glue:{region}:{endpoint.catalog_id}", f"table/{database}/{table}"
        return endpoint.uri, f"{database}.{table}"
    return f"hive://{endpoint.host}:{endpoint.port}", f"{database}.{table}"


def _schema(columns: list[tuple[str, str, str]]) -> schema_dataset.SchemaDatasetFacet:
    return schema_dataset.SchemaDatasetFacet(
        fields=[
            schema_dataset.SchemaDatasetFacetFields(name=n, type=t, description=d or None, ordinal_position=i)
            for i, (n, t, d) in enumerate(columns, 1)
        ]
    )


def output_columns(cfg: TableConfig) -> list[tuple[str, str, str]]:
    """(name, type, comment) of the base table's columns: the registry's, the mode's, the metadata, the partition."""
    from cdc_compaction.core.mode import mode_of

    cols = [(c.name, c.type, c.comment) for c in cfg.columns]
    cols += [(n, t, "") for n, t in mode_of(cfg).output_columns(cfg)]
    cols += [(n, META_TYPES[n], "") for n in META_COLUMNS]
    if cfg.partition_by is not None:
        cols.append((PARTITION_COLUMN, "string", ""))
    return cols


def _t(
    kind: str, subtype: str, description: str | None, masking: bool = False
) -> column_lineage_dataset.Transformation:
    return column_lineage_dataset.Transformation(type=kind, subtype=subtype, description=description, masking=masking)


def _identity() -> column_lineage_dataset.Transformation:
    """A column copied as it is."""
    return _t("DIRECT", "IDENTITY", None)


def column_sources(cfg: TableConfig) -> dict[str, list[tuple[str, column_lineage_dataset.Transformation]]]:
    """Table column -> the change-file columns its values come from, with how (DIRECT transformations).

    Registry columns are copied (the winning event's value).  The metadata columns come from
    where an event was found and when it was compacted, not from a column: they have no entry.
    """
    from cdc_compaction.core.mode import mode_of

    out: dict[str, list[tuple[str, column_lineage_dataset.Transformation]]] = {
        c.name: [(c.name, _identity())] for c in cfg.columns
    }
    # The mode's own output columns (snapshot: operation, eff_start_date, the hashes).
    for column, uses in mode_of(cfg).lineage_columns(cfg).items():
        out[column] = [(u.source, _t(u.kind, u.subtype, u.description, u.masking)) for u in uses]
    if cfg.partition_by is not None:
        p = cfg.partition_by
        how = _identity() if p.transform == "identity" else _t("DIRECT", "TRANSFORMATION", f"{p.transform}({p.column})")
        out[PARTITION_COLUMN] = [(p.column, how)]
    return out


def dataset_influences(cfg: TableConfig) -> list[tuple[str, column_lineage_dataset.Transformation]]:
    """The change-file columns that decide which rows the table holds (INDIRECT: the rule's key, order, deletes)."""
    from cdc_compaction.core.mode import mode_of

    return [(u.source, _t(u.kind, u.subtype, u.description, u.masking)) for u in mode_of(cfg).lineage_influences(cfg)]


def input_datasets(cfg: TableConfig, commit: Commit) -> list[InputDataset]:
    """One dataset per compacted increment directory, with the registry schema and its files' rows/bytes/count."""
    incremental = Layout.for_table(cfg).incremental
    schema = _schema([(c.name, c.type, c.comment) for c in cfg.columns])
    by_inc: dict[str, list[Mapping[str, Any]]] = {inc: [] for inc in commit.increments}
    for f in commit.files:
        by_inc.setdefault(str(f["increment"]), []).append(f)
    out = []
    for inc, files in by_inc.items():
        ns, name = storage_dataset(posixpath.join(incremental, inc))
        stats = input_statistics_input_dataset.InputStatisticsInputDatasetFacet(
            rowCount=sum(int(f.get("rows", 0)) for f in files),
            size=sum(int(f.get("size", 0)) for f in files),
            fileCount=len(files),
        )
        out.append(InputDataset(ns, name, facets={"schema": schema}, inputFacets={"inputStatistics": stats}))
    return out


def output_dataset(
    cfg: TableConfig,
    endpoint: MetastoreEndpoint,
    commit: Commit,
    inputs: list[InputDataset],
    output_files: list[Mapping[str, Any]] | None = None,
    region: str | None = None,
) -> OutputDataset:
    """The base table, with its schema, column lineage from ``inputs`` and the rows the commit wrote."""
    from cdc_compaction.core.sql import table_names

    ns, name = table_dataset(endpoint, cfg.database, table_names(cfg)["base_table"], region)
    stats = commit.stats
    written = [f for f in (output_files or []) if not str(f.get("name", "")).startswith("tombstones/")]
    out_stats = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
        rowCount=int(stats.get("output_visible_rows", 0)),
        size=sum(int(f.get("size", 0)) for f in written) if output_files is not None else None,
        fileCount=len(written) if output_files is not None else None,
    )
    return OutputDataset(
        ns,
        name,
        facets={
            "schema": _schema(output_columns(cfg)),
            "columnLineage": _column_lineage(column_sources(cfg), dataset_influences(cfg), inputs),
        },
        outputFacets={"outputStatistics": out_stats},
    )


def extra_datasets(
    cfg: TableConfig, endpoint: MetastoreEndpoint, commit: Commit, inputs: list[InputDataset], region: str | None = None
) -> list[OutputDataset]:
    """The tables the mode's outputs add (``TableMode.extra_tables``; snapshot: ``<t>_history``, the net
    changes of the applied exports, one partition per date), with the rows the commit wrote to each."""
    from cdc_compaction.core.mode import mode_of

    mode = mode_of(cfg)
    rows = mode.extra_rows(cfg, commit)
    out = []
    for x in mode.extra_tables(cfg):
        ns, name = table_dataset(endpoint, cfg.database, x.name, region)
        held = {n for n, _, _ in x.columns}
        sources = {k: v for k, v in column_sources(cfg).items() if k != PARTITION_COLUMN and k in held}
        out.append(
            OutputDataset(
                ns,
                name,
                facets={
                    "schema": _schema(list(x.columns)),
                    "columnLineage": _column_lineage(sources, dataset_influences(cfg), inputs),
                },
                outputFacets={
                    "outputStatistics": output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                        rowCount=rows.get(x.name, 0)
                    )
                },
            )
        )
    return out


def _column_lineage(
    sources: Mapping[str, list[tuple[str, column_lineage_dataset.Transformation]]],
    influences: list[tuple[str, column_lineage_dataset.Transformation]],
    inputs: list[InputDataset],
) -> column_lineage_dataset.ColumnLineageDatasetFacet:
    """The facet: each output column from its source columns in every input, and the dataset-wide influences."""

    def fields(col: str, how: column_lineage_dataset.Transformation) -> list[column_lineage_dataset.InputField]:
        return [
            column_lineage_dataset.InputField(namespace=i.namespace, name=i.name, field=col, transformations=[how])
            for i in inputs
        ]

    return column_lineage_dataset.ColumnLineageDatasetFacet(
        fields={
            out: column_lineage_dataset.Fields(inputFields=[f for col, how in cols for f in fields(col, how)])
            for out, cols in sources.items()
        },
        dataset=[f for col, how in influences for f in fields(col, how)],
    )


def run_facet(commit: Commit) -> CdcCompactionRunFacet:
    """The counts of the commit (``_cdc_stats.json`` as recorded in the commit record)."""
    s = commit.stats
    return CdcCompactionRunFacet(
        seq=commit.seq,
        version=commit.version,
        planId=commit.plan_id,
        increments=len(commit.increments),
        eventsIn=int(s.get("increment_rows", 0)),
        eventsRejected=int(s.get("rejected_rows", 0)),
        eventsOut=int(s.get("output_rows", 0)),
        visibleRows=int(s.get("output_visible_rows", 0)),
        tombstones=int(s.get("output_tombstones", 0)),
    )


def operator_lineage(
    cfg: TableConfig,
    endpoint: MetastoreEndpoint,
    commit: Commit,
    output_files: list[Mapping[str, Any]] | None = None,
    region: str | None = None,
) -> Any:
    """The provider's ``OperatorLineage`` of the run that committed ``commit``."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    inputs = input_datasets(cfg, commit)
    facets: dict[str, BaseFacet] = {RUN_FACET: run_facet(commit)}
    outputs = [output_dataset(cfg, endpoint, commit, inputs, output_files, region)]
    outputs += extra_datasets(cfg, endpoint, commit, inputs, region)
    return OperatorLineage(inputs=inputs, outputs=outputs, run_facets=facets)


def compact_lineage(plan: Mapping[str, Any]) -> Any:
    """The provider's ``OperatorLineage`` of the ``compact`` task, from its plan alone (nothing else is read).

    Inputs: each planned increment directory (schema, and the planned files' rows, bytes and
    count) and the live version the job merges them into; output: the new version directory it
    writes (``output_location``), with the columns it holds.  Publish later makes it the table.
    """
    from airflow.providers.openlineage.extractors import OperatorLineage

    columns = [(str(c["name"]), str(c["type"]), "") for c in plan.get("columns") or []]
    schema = _schema(columns)
    by_dir: dict[str, list[Mapping[str, Any]]] = {}
    for f in plan.get("files") or []:
        by_dir.setdefault(posixpath.dirname(str(f["path"])), []).append(f)
    inputs = []
    for directory, files in sorted(by_dir.items()):
        ns, name = storage_dataset(directory)
        stats = input_statistics_input_dataset.InputStatisticsInputDatasetFacet(
            rowCount=sum(int(f.get("rows", 0)) for f in files),
            size=sum(int(f.get("size", 0)) for f in files),
            fileCount=len(files),
        )
        inputs.append(InputDataset(ns, name, facets={"schema": schema}, inputFacets={"inputStatistics": stats}))
    if int(plan.get("parent_seq") or 0) > 0 and plan.get("base_location"):
        ns, name = storage_dataset(str(plan["base_location"]))
        inputs.append(InputDataset(ns, name, facets={"schema": schema}))
    ns, name = storage_dataset(str(plan["output_location"]))
    meta = [(n, META_TYPES[n], "") for n in META_COLUMNS]
    outputs = [OutputDataset(ns, name, facets={"schema": _schema(columns + meta)})]
    return OperatorLineage(inputs=inputs, outputs=outputs)


def compact_lineage_of(plan_path: str | None, storage_conn_id: str, table: str) -> Any:
    """:func:`compact_lineage` of the plan at ``plan_path``; empty (logged, counted) when it cannot be read."""
    import json

    from airflow.providers.openlineage.extractors import OperatorLineage

    try:
        if not plan_path:
            raise LineageError(f"{table}: the compact task has no plan path; no lineage is reported for it")
        from cdc_compaction.core.storage import storage_for

        return compact_lineage(json.loads(storage_for(plan_path, storage_conn_id).read_text(plan_path)))
    except Exception:
        log.exception("%s: the compact task's OpenLineage facets could not be built; the run goes on", table)
        count_failure(table)
        return OperatorLineage()


def _glue_region(endpoint: MetastoreEndpoint) -> str | None:
    """The AWS region of a Glue catalog: its connection's ``region_name``, else ``$AWS_DEFAULT_REGION``."""
    if endpoint.kind != "glue":
        return None
    try:
        from airflow.sdk import BaseHook

        extra = BaseHook.get_connection(endpoint.aws_conn_id).extra_dejson or {}
        if extra.get("region_name"):
            return str(extra["region_name"])
    except Exception:  # no such connection: the environment may still say
        log.debug("no region in connection %s", endpoint.aws_conn_id, exc_info=True)
    return os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION")


def count_failure(table: str) -> None:
    sidechannel.count_failure(LINEAGE_FAILURES, table, LINEAGE_FAILED_METRIC, {"table": table})


def publish_lineage(rt: Any, result: Mapping[str, Any] | None) -> Any:
    """The lineage of the run whose ``publish`` returned ``result``; empty (and logged, counted) on any failure."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    cfg = rt.cfg
    try:
        if not result or "seq" not in result:
            raise LineageError(
                f"{cfg.qualified_name}: task publish returned {result!r}, not a commit; no lineage is reported. "
                "Nothing to do unless this repeats (then report it)"
            )
        commit = rt.lake.read_commit(int(result["seq"]))
        if commit is None:
            raise LineageError(
                f"{cfg.qualified_name}: commit record {rt.lake.layout.commit_path(int(result['seq']))} is missing; "
                "no lineage is reported for this run. Check the commit log "
                f"({doc_ref('crash-safety', 'recovering-from-a-failed-run')})"
            )
        output_files = _output_files(rt, commit)
        return operator_lineage(cfg, rt.metastore, commit, output_files, _glue_region(rt.metastore))
    except Exception:
        log.exception("%s: the OpenLineage facets could not be built; the run goes on without them", cfg.qualified_name)
        count_failure(cfg.qualified_name)
        return OperatorLineage()


def _output_files(rt: Any, commit: Commit) -> list[Mapping[str, Any]] | None:
    """The files the version wrote (its stats file), or None if it cannot be read: the sizes are optional."""
    import json

    path = posixpath.join(rt.lake.layout.version_dir(commit.version), STATS_FILE)
    try:
        return list(json.loads(rt.lake.storage.read_text(path)).get("output_files") or [])
    except Exception:
        log.warning("%s: could not read %s; lineage without output sizes", rt.cfg.qualified_name, path, exc_info=True)
        return None
