"""What a table mode supplies, and how the package finds the modes: the seam between the shared steps and the modes.

A *mode* is how a table's change files are turned into the table: ``cdc`` (the latest event
per key wins), ``keyless`` (a multiset of rows changed one copy at a time), ``snapshot``
(exports of the whole table, compared with the current table) and ``append`` (every event is a
row, once). Everything that differs between modes goes through :class:`TableMode`: its registry
model, the rendering context its SQL templates see (``include/sql/modes/<mode>/``), the rule the
Spark job applies (the ``rule`` of the plan), what else the plan carries, how ``validate``
reconciles the job's counts, the extra outputs it owns, and the rows of the DAG's documentation.
The pipeline's steps, the storage layout, the commit protocol and the metastore handling are the
same for every mode and know nothing of a mode's rule.

Modes are found, not listed: every module of :mod:`cdc_compaction.modes` that defines ``MODE``
(a :class:`TableMode`) is one, and so is every ``cdc_compaction.modes`` entry point of an
installed distribution. The core layer therefore imports no mode: a new mode is new files only
(docs, "Architecture"). The job side has a module of its own per mode
(``cdc_compaction.job.modes.<mode>``), which reads what :meth:`TableMode.plan_fields` and
:meth:`TableMode.rule_sql` put into the plan.
"""

from __future__ import annotations

import functools
import importlib
import logging
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, ClassVar

from cdc_compaction.core.exceptions import CdcCompactionError

if TYPE_CHECKING:
    from cdc_compaction.core.lake import Commit
    from cdc_compaction.core.registry import TableConfig

log = logging.getLogger(__name__)

#: The package whose modules are the built-in modes, and the entry-point group of further ones.
MODES_PACKAGE = "cdc_compaction.modes"
ENTRY_POINT_GROUP = "cdc_compaction.modes"
#: The mode of an entry without ``mode:``, and of plans and commits made before modes existed.
DEFAULT_MODE = "cdc"


@dataclass(frozen=True)
class TableContext:
    """What every mode's templates see as ``t``; each mode's context adds its rule's parameters."""

    database: str
    table: str
    qualified_name: str
    columns: list[Any]
    column_names: list[str]
    base_table: str
    tombstones_table: str
    incremental_table: str
    compactor_table: str
    view_name: str
    rejects_view: str
    fingerprint: str
    #: The mode's rule macros (``include/sql/modes/<mode>/_rule.sql.j2``), for templates the modes share.
    rule_template: str
    partition_by: Any


@dataclass(frozen=True)
class OutputDir:
    """A subdirectory of a version the mode's job writes besides ``data/`` and ``tombstones/``.

    Its files lie in Hive-style partition directories ``<partition_column>=<value>/``, and hold
    every column of the version's data files except ``partition_column`` (the directory names it).
    ``validate`` reads their Parquet footers and hands the rows per value to
    :meth:`TableMode.validate_outputs`.
    """

    name: str
    partition_column: str

    @property
    def prefix(self) -> str:
        """The start of its partition directories' names."""
        return f"{self.partition_column}="


@dataclass(frozen=True)
class ExtraTable:
    """A metastore table the mode's outputs add besides the base, tombstones, incremental and compactor tables.

    ``ensure_tables`` renders ``template`` (below ``include/sql``, the mode's own directory) with
    ``location`` = the table's ``base/`` directory and checks its columns and fingerprint as the
    base table's; ``publish`` registers the partitions the commit's outputs name under
    ``partitions_key`` (``Commit.outputs[partitions_key]``: {value: location}); ``delete`` drops it.
    """

    name: str
    template: str
    #: (name, Hive type, comment) of every column, the partition column last (lineage reports them).
    columns: tuple[tuple[str, str, str], ...]
    #: The key of :attr:`Commit.outputs` holding its partitions; None: publish registers none.
    partitions_key: str | None = None


@dataclass(frozen=True)
class ColumnUse:
    """How a change-file column feeds the table, for lineage (an OpenLineage column-lineage transformation).

    ``kind`` ``DIRECT``: an output column's value is computed from ``source``; ``INDIRECT``:
    ``source`` decides which rows the table holds (the rule's key, order, deletes).
    """

    source: str
    kind: str
    subtype: str
    description: str | None = None
    masking: bool = False


class TableMode(ABC):
    """One table mode, as the Airflow side sees it. Stateless: one instance per mode."""

    #: The registry's ``mode`` value.
    name: ClassVar[str]
    #: The registry model of the mode's entries (a :class:`~cdc_compaction.core.registry.TableConfig`).
    model: ClassVar[type[TableConfig]]
    #: What the mode's tables hold, in a few words (the registry schema's description of ``mode``).
    summary: ClassVar[str]
    #: Templates this mode must provide under ``include/sql/modes/<name>/``.
    TEMPLATES: ClassVar[tuple[str, ...]] = ("_rule.sql.j2", "view_query.sql.j2")
    #: Whether the mode's tables may set registry ``change_feed`` (docs/data.md#change-feed): the job then
    #: writes each commit's change (plan ``change_feed``) and publish fills ``<t>_changes``. A mode
    #: without one refuses the field in its registry model, saying why.
    has_change_feed: ClassVar[bool] = False

    def common_context(self, cfg: TableConfig, fingerprint: str) -> dict[str, Any]:
        """The :class:`TableContext` fields of ``cfg``, for the mode's own context class."""
        from cdc_compaction.core.names import table_names

        return {
            "database": cfg.database,
            "table": cfg.table,
            "qualified_name": cfg.qualified_name,
            "columns": list(cfg.columns),
            "column_names": cfg.column_names,
            "fingerprint": fingerprint,
            "rule_template": self.template("_rule.sql.j2"),
            "partition_by": cfg.partition_by,
            **table_names(cfg),
        }

    def template(self, name: str) -> str:
        """The path (below ``include/sql``) of this mode's template ``name``."""
        return f"modes/{self.name}/{name}"

    @abstractmethod
    def rule_context(self, cfg: TableConfig, fingerprint: str) -> Any:
        """What the SQL templates see as ``t`` (immutable; names, columns and the rule's parameters)."""

    @abstractmethod
    def fingerprint_doc(self, cfg: TableConfig) -> dict[str, Any]:
        """Everything of the mode that shapes its tables and views (hashed into ``cdc.fingerprint``)."""

    @abstractmethod
    def rule_sql(self, cfg: TableConfig) -> dict[str, str]:
        """The rule as SQL expressions, rendered from the mode's ``_rule.sql.j2``: the plan's ``rule``."""

    @abstractmethod
    def plan_fields(self, cfg: TableConfig, parent: Commit) -> dict[str, Any]:
        """The mode's own entries of a plan (its key, ordering, anything carried over from the ``parent`` commit)."""

    def plan_increments(self, cfg: TableConfig, increments: list[str]) -> dict[str, Any]:
        """The mode's entries of a plan that depend on the increments it takes (none unless the mode says)."""
        return {}

    @abstractmethod
    def count_problems(self, stats: Mapping[str, Any]) -> list[str]:
        """Why the job's counts of one attempt do not add up (empty when they do).

        ``validate`` refuses to publish a version with any problem; the checks every mode
        shares (rows read against the parent and the planned files, the Parquet footers
        against the reported rows, the schema) are made by ``validate`` itself.
        """

    @abstractmethod
    def column_roles(self, cfg: TableConfig) -> dict[str, list[str]]:
        """Column name -> its roles in the rule (``key``, ``order 1``, ``op`` …), for the DAG's docs."""

    @abstractmethod
    def doc_lines(self, cfg: TableConfig) -> list[str]:
        """The mode's lines of the DAG's documentation (key, order, op codes …), as Markdown list items."""

    def output_columns(self, cfg: TableConfig) -> list[tuple[str, str]]:
        """(name, Hive type) of the columns the mode's outputs add after the registry's (before the metadata)."""
        return []

    def view_columns(self, cfg: TableConfig) -> list[tuple[str, str]]:
        """(name, Hive type) of the columns ``<t>_view`` shows: every registry column unless the mode says."""
        return [(c.name, c.type) for c in cfg.columns]

    def warnings(self, cfg: TableConfig) -> list[str]:
        """Doubts about an entry that validates (``registry validate`` prints them as WARN lines)."""
        return []

    # -- the mode's own outputs (none unless the mode says) ---------------------------------------
    def extra_tables(self, cfg: TableConfig) -> list[ExtraTable]:
        """The metastore tables the mode's outputs add (``ensure_tables`` creates them, ``delete`` drops them)."""
        return []

    def output_dirs(self, cfg: TableConfig) -> list[OutputDir]:
        """The subdirectories of a version the mode's job writes besides ``data/``, ``tombstones/`` and ``index/``."""
        return []

    def commit_outputs(self, cfg: TableConfig, parent: Commit, stats: Mapping[str, Any]) -> dict[str, Any] | None:
        """The mode's own entries of the new commit record (:attr:`Commit.outputs`), from the job's ``stats``.

        ``parent`` is the commit the version was planned on; None: the record has no ``outputs``.
        Raise :class:`~cdc_compaction.core.exceptions.PublishValidationError` when the stats would make
        the commit reference something already referenced (nothing is published then).
        """
        return None

    def validate_outputs(
        self, cfg: TableConfig, stats: Mapping[str, Any], out: str, footer_rows: Mapping[str, Mapping[str, int]]
    ) -> list[str]:
        """Why the job's report of the mode's own outputs is wrong (empty when it is right).

        ``out`` is the attempt's version directory; ``footer_rows`` is, per :meth:`output_dirs`
        name, the rows of its Parquet footers per partition value (only values with a file).
        """
        return []

    def referenced_locations(self, cfg: TableConfig, commit: Commit) -> list[str]:
        """Locations in version directories that ``commit``'s own outputs name: retention keeps them.

        Each is a partition directory inside one of :meth:`output_dirs` of some version; that
        version's directory stays (with only these of its partitions) while a kept commit names one.
        """
        return []

    def lineage_columns(self, cfg: TableConfig) -> dict[str, list[ColumnUse]]:
        """The mode's own output columns (:meth:`output_columns`) -> the change-file columns they are computed from."""
        return {}

    def lineage_influences(self, cfg: TableConfig) -> list[ColumnUse]:
        """The change-file columns that decide which rows the table holds (``INDIRECT``: key, order, deletes)."""
        return []

    def erase_images(self, cfg: TableConfig) -> dict[str, str]:
        """Column -> another column of the same row holding an older value of it (keyless: its before-image).

        ``erase`` checks its predicate on those too, where any of them is set: an event that carries
        an erased person's old row must go as well.
        """
        return {}

    def erase_keeps(self, cfg: TableConfig) -> tuple[str, ...]:
        """Subdirectories of a version whose files hold the mode's bookkeeping, no row of the table.

        ``erase`` never rewrites them (keyless: ``tombstones/``, whose one row is the watermark the
        next compaction recognises replays by).
        """
        return ()

    def feed_key(self, cfg: TableConfig) -> list[str] | None:
        """What pairs two versions' rows in the change feed: the primary key, or None for a multiset
        (``keyless``: a commit's change is one ``delete`` per copy removed, one ``insert`` per copy added)."""
        return list(getattr(cfg, "primary_key", None) or ()) or None

    def feed_columns(self, cfg: TableConfig) -> list[str]:
        """The registry columns a change-feed row holds (keyless: its data columns; the op, position and
        before-image columns are empty in every stored copy)."""
        return list(cfg.column_names)

    def changes_kept_in(self, cfg: TableConfig) -> str | None:
        """Where the mode's own outputs keep every change already (snapshot: its history table), named
        when the change feed (a diff of versions) is refused; None: they keep none."""
        return None

    def rollback_refusal(self, cfg: TableConfig) -> str | None:
        """Why the table's versions cannot be rolled back (its own outputs cannot follow); None: they can."""
        return None

    def extra_rows(self, cfg: TableConfig, commit: Commit) -> dict[str, int]:
        """Rows ``commit``'s version wrote to each of :meth:`extra_tables` (by table name), for lineage."""
        return {}

    @functools.cached_property
    def _macros(self) -> Any:
        from cdc_compaction.core.templates import template_module

        return template_module(self.template("_rule.sql.j2"))

    def macros(self) -> Any:
        """The macros of this mode's ``_rule.sql.j2``, callable from Python."""
        return self._macros


class UnknownModeError(CdcCompactionError):
    """A plan, commit or entry names a mode no installed module provides."""


@functools.cache
def table_modes() -> dict[str, TableMode]:
    """Every table mode, by name: ``cdc`` first (the default), then the others alphabetically."""
    found: dict[str, TableMode] = {}
    package = importlib.import_module(MODES_PACKAGE)
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{MODES_PACKAGE}.{info.name}")
        mode = getattr(module, "MODE", None)
        if isinstance(mode, TableMode):
            found[mode.name] = mode
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in found:
            continue  # a built-in mode of that name wins: an installed plugin cannot replace it
        mode = ep.load()
        if not isinstance(mode, TableMode):
            raise UnknownModeError(f"entry point {ep.value!r} ({ENTRY_POINT_GROUP}) is not a TableMode instance")
        found[mode.name] = mode
    order = sorted(found, key=lambda n: (n != DEFAULT_MODE, n))
    return {n: found[n] for n in order}


def mode_named(name: str | None) -> TableMode:
    """The mode a registry entry, plan or commit names (``None``: made before modes existed, so ``cdc``)."""
    modes = table_modes()
    try:
        return modes[name or DEFAULT_MODE]
    except KeyError:
        raise UnknownModeError(
            f"mode {name!r} is not installed (installed: {', '.join(modes)}); install the package that provides it"
        ) from None


def mode_of(cfg: TableConfig) -> TableMode:
    """The mode of a validated registry table."""
    return mode_named(cfg.mode)
