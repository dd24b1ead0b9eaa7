"""Operating a table's pipeline: pause, resume and delete (``cdc-compaction pause|resume|delete``).

Pause and resume flip Airflow's own pause flag (``DagModel.is_paused`` in the metadata
database, what ``airflow dags pause`` writes): the DAG stays, no new run is scheduled, a
running one finishes.  The registry's ``enabled: false`` is the lasting, reviewed form of
the same wish (README, "Pausing, resuming, deleting").

Delete removes a table's pipeline: its registry file is moved aside (so its DAG goes away
at the next parse and cannot recreate what follows), its tables and views are dropped from
the metastore (never their files), and its lake is deleted only with ``drop_data``: only in a
root the table owns (its marker, core/ownership.py), and only the files its records name
(pipeline/owned.py), never the root as a whole.  It refuses while a run holds the table's lease.
"""

from __future__ import annotations

import logging
import posixpath
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from cdc_compaction.core import settings
from cdc_compaction.core.exceptions import AirflowSetupError, ConcurrentRunError
from cdc_compaction.core.lake import Lake, TableLease
from cdc_compaction.core.ownership import Removal, remove_files, require_owner
from cdc_compaction.core.registry import TableConfig, dag_id_for
from cdc_compaction.core.settings import MetastoreEndpoint
from cdc_compaction.pipeline.owned import OwnedFiles

log = logging.getLogger(__name__)


def split_table(qualified: str) -> tuple[str, str]:
    """``db.table`` -> (db, table); a ValueError naming the expected form otherwise."""
    db, sep, table = qualified.partition(".")
    if not sep or not db or not table or "." in table:
        raise ValueError(f"{qualified!r}: name the table as DATABASE.TABLE, as in its registry file's name")
    return db, table


def require_airflow_home(qualified: str) -> str:
    """The metadata DB of a configured Airflow (its SQLAlchemy URL), or :class:`AirflowSetupError`.

    The Airflow of :func:`~cdc_compaction.operations.airflow_home.use_airflow` (the one ``status``
    reads: ``$AIRFLOW_HOME``, ``~/airflow``, else this project's local UI), whose environment is
    set in this process.  Checked before Airflow is imported: importing it without a home writes
    ``~/airflow/airflow.cfg`` and a new, empty ``airflow.db`` -- a pause there pauses nothing that
    runs.  A home is real when its ``airflow.cfg`` exists, and its metadata DB initialised when
    ``airflow db migrate`` left its ``alembic_version`` row there.
    """
    from cdc_compaction.operations.airflow_home import use_airflow
    from cdc_compaction.operations.status import read_metadata

    place = use_airflow()
    home, how, conn = place.home, place.how, place.conn
    if not place.config_file.is_file():
        raise AirflowSetupError(
            f"{qualified}: no Airflow here: {place.config_file} does not exist ({how}); nothing was changed. "
            "Start this project's local UI (make airflow-ui), or set AIRFLOW_HOME to the home of the Airflow "
            "that runs the DAGs (the directory of its airflow.cfg; with its AIRFLOW__DATABASE__SQL_ALCHEMY_CONN "
            "if it sets one), then run this again"
        )
    try:
        rows = read_metadata(conn, "SELECT version_num FROM alembic_version") if conn else None
    except Exception as exc:  # sqlite3's, the server's: not initialised, or not reachable; the message says which
        rows = None
        log.debug("metadata DB %s unreadable", conn, exc_info=True)
        why = f"{type(exc).__name__}: {exc}"
    else:
        why = "no alembic_version row" if conn else "no sql_alchemy_conn"
    if not rows:
        local = ""
        if home == settings.PROJECT_ROOT / ".airflow":
            local = " (is this project's local UI running? make airflow-ui starts its database)"
        raise AirflowSetupError(
            f"{qualified}: the Airflow home {home} ({how}) has no initialised metadata database "
            f"({conn or 'none configured'}: {why}){local}; nothing was changed. Point AIRFLOW_HOME / "
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN at the Airflow that runs the DAGs (`airflow db check`), or "
            "initialise this one with `airflow db migrate`"
        )
    return conn


def set_paused(qualified: str, paused: bool) -> bool | None:
    """Set Airflow's pause flag of the table's DAG; return what it was (None: already so).

    Raises :class:`AirflowSetupError` without a configured Airflow (:func:`require_airflow_home`),
    or when the metadata database does not know the DAG (the DAG processor has not parsed it
    yet, or ``AIRFLOW_HOME`` points elsewhere).
    """
    conn = require_airflow_home(qualified)
    try:
        from airflow.models.dag import DagModel
        from airflow.utils.session import create_session
        from sqlalchemy import select
        from sqlalchemy.exc import SQLAlchemyError
    except ImportError as exc:  # a database driver Airflow's configuration names, or Airflow itself
        missing = (exc.name or str(exc)).split(".")[0]
        raise AirflowSetupError(
            f"{qualified}: cannot use Airflow's metadata database {conn}: the Python module {missing!r} is "
            "missing; nothing was changed. Run this command with the project's environment (make install; "
            ".venv/bin/cdc-compaction), or install the driver that database URL names into this one"
        ) from exc

    dag_id = dag_id_for(*split_table(qualified))
    try:
        with create_session() as session:
            dag = session.scalar(select(DagModel).where(DagModel.dag_id == dag_id))
            if dag is None:
                raise AirflowSetupError(
                    f"{qualified}: Airflow's metadata database has no DAG {dag_id}: the DAG processor has not "
                    "parsed its registry file yet, or this shell's AIRFLOW_HOME / AIRFLOW__DATABASE__SQL_ALCHEMY_CONN "
                    "name another Airflow. Check `airflow dags list`, then run this again"
                )
            was = bool(dag.is_paused)
            if was == paused:
                return None
            dag.is_paused = paused
    except SQLAlchemyError as exc:
        raise AirflowSetupError(
            f"{qualified}: cannot use Airflow's metadata database ({type(exc).__name__}: {exc}); nothing was changed. "
            "Point AIRFLOW_HOME / AIRFLOW__DATABASE__SQL_ALCHEMY_CONN at your Airflow (`airflow db check`)"
        ) from exc
    log.info("%s: DAG %s %s", qualified, dag_id, "paused" if paused else "resumed")
    return was


def metastore_objects(cfg: TableConfig) -> list[str]:
    """Every table and view this package creates for ``cfg`` in the metastore: views first, then tables."""
    from cdc_compaction.core.dialects import view_names
    from cdc_compaction.core.mode import mode_of
    from cdc_compaction.core.sql import table_names

    names = table_names(cfg)
    views = [n for per_dialect in view_names(cfg).values() for n in per_dialect.values()]
    tables = [names[r] for r in ("base_table", "tombstones_table", "incremental_table", "compactor_table")]
    tables += [x.name for x in mode_of(cfg).extra_tables(cfg)]  # the mode's own (snapshot: <t>_history)
    if mode_of(cfg).has_change_feed:
        tables.append(f"{cfg.table}_changes")  # pipeline/changes.py: created by publish (cdc, keyless, snapshot)
    return list(dict.fromkeys([*views, *tables]))


@dataclass
class DeleteReport:
    """What ``delete`` did (or, unconfirmed, would do)."""

    dropped: list[str] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)
    registry_moved_to: str | None = None
    data_deleted: str | None = None
    #: How many files ``--drop-data`` deleted, and what under the root it left (not the table's), with why.
    files_deleted: int = 0
    data_left: list[str] = field(default_factory=list)
    data_kept: str | None = None

    def lines(self) -> list[str]:
        out = [f"dropped {n} (its files are untouched)" for n in self.dropped]
        out += [f"not in the metastore: {n}" for n in self.absent]
        if self.registry_moved_to:
            out.append(
                f"registry file moved to {self.registry_moved_to}: remove the file from your repository too, "
                "or the next deployment brings the table back"
            )
        if self.data_deleted:
            out.append(
                f"deleted the {self.files_deleted} files of the table's lake {self.data_deleted} that its records name"
            )
            out += [f"left {x}: delete it by hand if it may go" for x in self.data_left]
        if self.data_kept:
            out.append(f"kept the table's lake {self.data_kept} (delete it with --drop-data, or by hand)")
        return out


def refuse_if_leased(cfg: TableConfig, now: datetime | None = None) -> None:
    """Raise :class:`ConcurrentRunError` if a run holds the table's lease (a dead run's expired lease does not)."""
    held = TableLease(Lake(cfg)).current()
    if held is not None and not held.released and not held.expired(now or datetime.now(UTC)):
        raise ConcurrentRunError(
            f"{cfg.qualified_name}: refusing to delete while a run holds the table ({held.describe()}); nothing "
            "was changed. Pause the DAG and let the run finish, or if it is dead break its lease with "
            f"`cdc-compaction lease break {cfg.qualified_name}`, then delete again"
        )


def require_owned_root(cfg: TableConfig) -> None:
    """Raise :class:`OwnershipError` unless the table owns its storage root (its marker, no other table's above it)."""
    require_owner(Lake(cfg), "--drop-data")


def drop_lake(cfg: TableConfig, *, dry_run: bool = False) -> Removal:
    """Delete exactly what the table's records name (pipeline/owned.py), file by file, the marker last.

    Never the root as a whole: what the records do not name -- another table's files, a link, a FIFO,
    a directory holding another table's marker, anything put there by hand -- stays, in ``kept``.
    """
    lake = Lake(cfg)
    lay, st = lake.layout, lake.storage
    owned = OwnedFiles.read(lake)
    removal = remove_files(lake, lay.root, owned, dry_run=dry_run)
    removal.kept = [x for x in removal.kept if not x.startswith(f"{lay.owner} ")]  # the marker: deleted below
    removal.kept += [f"{what}: what it names stays" for what in owned.unread]
    if not dry_run:
        # The marker last: a delete that stops half-way can be run again (the root is still the table's).
        st.delete(lay.owner)
        for d in (lay.control, lay.root):
            st.remove_dir_if_empty(d)
    removal.removed.append(lay.owner)
    return removal


def delete_table(
    cfg: TableConfig,
    registry_file: Path,
    endpoint: MetastoreEndpoint,
    *,
    drop_data: bool = False,
    now: datetime | None = None,
) -> DeleteReport:
    """Remove the table's pipeline (see the module docstring); refuse while its lease is held."""
    from cdc_compaction.integrations.metastore import connect

    now = now or datetime.now(UTC)
    refuse_if_leased(cfg, now)
    if drop_data:
        # Before anything changes: only a root the table owns is touched, and only what its records name.
        require_owned_root(cfg)
    report = DeleteReport()
    # The registry file first: while it exists the DAG's next run would recreate the tables.
    if registry_file.exists():
        target = registry_file.with_name(f"{registry_file.name}.deleted-{now:%Y%m%dT%H%M%SZ}")
        registry_file.rename(target)
        report.registry_moved_to = str(target)
    with connect(endpoint) as ms:
        for name in metastore_objects(cfg):
            (report.dropped if ms.drop_table(cfg.database, name) else report.absent).append(f"{cfg.database}.{name}")
    root = Lake(cfg).layout.root
    if drop_data:
        removal = drop_lake(cfg)
        report.data_deleted = root
        report.files_deleted = len(removal.removed)
        report.data_left = removal.kept
    else:
        report.data_kept = root
    log.info("%s: deleted (%s)", cfg.qualified_name, "; ".join(report.lines()))
    return report


def planned_deletion(cfg: TableConfig, registry_file: Path, drop_data: bool) -> list[str]:
    """What :func:`delete_table` would do, for the confirmation."""
    lay = Lake(cfg).layout
    lines = [
        f"move {registry_file} aside (its DAG {cfg.dag_id} disappears at the next parse)",
        *[f"drop {cfg.database}.{n} from the metastore (not its files)" for n in metastore_objects(cfg)],
    ]
    if not drop_data:
        return [*lines, f"keep the lake {lay.root}"]
    removal = drop_lake(cfg, dry_run=True)
    return [
        *lines,
        f"delete the {len(removal.removed)} files under {lay.root} that the table's records name (its marker last)",
        *[f"leave {x}" for x in removal.kept],
    ]


def registry_file_of(directory: Path, qualified: str) -> Path:
    """The registry file of ``db.table`` (``.yaml`` or ``.yml``), as the registry names it."""
    from cdc_compaction.core.registry import registry_files

    for p in registry_files(directory):
        if posixpath.splitext(p.name)[0] == qualified:
            return p
    return directory / f"{qualified}.yaml"
