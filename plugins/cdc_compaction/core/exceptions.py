"""Project-specific exceptions.

Every error raised on purpose by this package derives from :class:`CdcCompactionError`
and carries a message that says what failed, for which table / file / row, and what
to do about it.
"""

from __future__ import annotations


class CdcCompactionError(Exception):
    """Base class of every error this package raises on purpose."""


class RegistryError(CdcCompactionError):
    """A registry file is missing, unreadable or invalid."""

    def __init__(
        self, file: str, table: str | None, problems: list[str], locations: list[str | None] | None = None
    ) -> None:
        self.file = file
        self.table = table
        self.problems = problems
        #: ``file:line:column`` of each problem (None where it has no place in a file, e.g. an unreadable file).
        self.locations = list(locations or [])
        where = f"{file} (table {table})" if table else file
        super().__init__(f"invalid registry entry {where}: " + "; ".join(self.lines()))

    def lines(self) -> list[str]:
        """Each problem, led by its ``file:line:column`` where it has one (the form editors jump to)."""
        padded = self.locations + [None] * (len(self.problems) - len(self.locations))
        return [f"{loc}: {p}" if loc else p for p, loc in zip(self.problems, padded, strict=False)]


class IdentifierError(CdcCompactionError, ValueError):
    """A database, table or column name is not a safe SQL identifier."""


class StorageError(CdcCompactionError):
    """A lake storage operation failed."""


class CommitLogError(StorageError):
    """The commit log disagrees with what readers were shown (a record removed or truncated)."""


class PreconditionFailedError(StorageError):
    """A conditional write lost: the object exists already or changed meanwhile."""


class OwnershipError(CdcCompactionError):
    """A table does not own its storage root (no ownership marker, another table's marker, or a root
    nested in another table's): nothing may be created or destroyed there until a person decides."""


class MetastoreError(CdcCompactionError):
    """A Hive metastore call failed or returned something unexpected."""


class PlanError(CdcCompactionError):
    """The set of pending increments could not be planned safely."""


class CompactionError(CdcCompactionError):
    """The Spark compaction job failed or left no usable output."""


class PermanentCompactionError(CompactionError):
    """The compaction can never succeed as planned (a stale plan): retrying cannot help."""


class SparkConnectLostError(CdcCompactionError):
    """The Spark Connect server went away (gRPC UNAVAILABLE, or it restarted): transient, a retry may succeed.

    Not a :class:`CompactionError` (those fail the task at once): Airflow's retries apply.
    """


class PublishValidationError(CdcCompactionError):
    """The new base version did not pass the checks that gate publishing."""


class ConcurrentCommitError(CdcCompactionError):
    """Another run committed a version for the same table first."""


class ArchiveError(CdcCompactionError):
    """Processed increments could not be archived safely."""


class SchemaChangeError(CdcCompactionError):
    """The registry schema changed in a way that cannot be applied automatically."""


class ConcurrentRunError(CdcCompactionError):
    """Another run holds the table's lease: it is being compacted right now."""


class DeploymentConflictError(CdcCompactionError):
    """Two Airflow deployments use one deployment id: their leases would not keep each other out."""


class StorageRootMismatchError(PlanError):
    """The metastore shows data under another storage root than the registry's, with no commit log here."""


class BadInputError(PlanError):
    """A landed file cannot be compacted (unreadable, or its schema does not fit the registry)."""


class QuarantineError(CdcCompactionError):
    """A quarantine entry cannot be listed or re-ingested."""


class AirflowSetupError(CdcCompactionError):
    """The project-local Airflow could not be prepared (e.g. ``airflow db migrate`` failed)."""


class TimeTravelError(CdcCompactionError):
    """A version cannot be read, diffed or rolled back to (not kept, wrong mode, bad range)."""


class LineageError(CdcCompactionError):
    """The OpenLineage facets of a run cannot be built (logged and counted; never fails a task)."""


class ErasePredicateError(CdcCompactionError, ValueError):
    """An erase predicate is not a plain boolean expression over the table's registry columns."""


class EraseError(CdcCompactionError):
    """An erase could not finish, or its verification found a matching row still stored."""


def is_permanent(exc: BaseException) -> bool:
    """True for errors a retry of the same task cannot heal: fail them at once, alert the owner.

    Bad input, an invalid plan or registry, a schema conflict, a version that failed
    validation, a plan another run overtook, a damaged commit log, two deployments sharing
    one deployment id: each needs a person
    (or a new run) first.  Everything else -- storage, the metastore, Spark, a lease held by
    a live run -- may heal, so Airflow's retries with backoff apply.
    """
    return isinstance(
        exc,
        PlanError
        | RegistryError
        | IdentifierError
        | SchemaChangeError
        | PublishValidationError
        | ConcurrentCommitError
        | CommitLogError
        | CompactionError
        | DeploymentConflictError
        | ErasePredicateError
        | OwnershipError,
    )


class RebuildError(CdcCompactionError):
    """A rebuild cannot replay the table's history (an archived file missing, an unsupported mode)."""


class KeyIndexError(CdcCompactionError):
    """A partitioned table's key index cannot be verified or rebuilt (no partition_by, nothing compacted yet)."""


class FormatError(CdcCompactionError):
    """A table format's metadata (Delta, Iceberg) could not be written; derived data, never fatal to a publish."""
