"""Where things are: project directories and the run-time service endpoints.

Paths are computed from this file's location so that the package works from a
clone without installation.  Every setting can be overridden with an environment
variable, which is how tests, the demo and real deployments point it elsewhere.

Installed (``pip install`` of the wheel) there is no clone around the package: the files it
reads at run time (SQL templates, spark-submit main files) come with it as
``cdc_compaction/resources``, and the project root (``.run``, ``.lake``, relative storage
roots, ``include/registry``) is ``$CDC_PROJECT_ROOT`` or the working directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The clone this file sits in (``<clone>/plugins/cdc_compaction/core/settings.py``), if it is one.
_CLONE = Path(__file__).resolve().parents[3]
#: The run-time files of an installed package (setup.py maps include/ and dags/ there).
PACKAGED_RESOURCES = Path(__file__).resolve().parents[1] / "resources"
INSTALLED = not (_CLONE / "include" / "sql").is_dir() and PACKAGED_RESOURCES.is_dir()

PROJECT_ROOT = Path(os.environ.get("CDC_PROJECT_ROOT") or (Path.cwd() if INSTALLED else _CLONE))
INCLUDE_DIR = Path(
    os.environ.get("CDC_INCLUDE_DIR")
    or (PROJECT_ROOT / "include" if (PROJECT_ROOT / "include" / "sql").is_dir() else None)
    or (PACKAGED_RESOURCES if INSTALLED else _CLONE / "include")
)
SQL_DIR = INCLUDE_DIR / "sql"
SPARK_JOBS_DIR = INCLUDE_DIR / "spark_jobs"

#: Connection ids used at task run time (never at parse time).
METASTORE_CONN_ID = "metastore_default"
DEFAULT_METASTORE_URI = "thrift://127.0.0.1:9083"


#: The DAG that keeps every table's views fresh between compactions (README, "Readers").
VIEW_REFRESH_DAG_ID = "cdc__views_refresh"
#: The manual-only DAG that erases rows by predicate from any registry table (README, "Erasing personal data").
ERASE_DAG_ID = "cdc__erase"


def view_refresh_schedule() -> str | None:
    """How often the view refresher runs: ``$CDC_VIEW_REFRESH_SCHEDULE`` (cron or preset; ``none`` turns it off)."""
    value = os.environ.get("CDC_VIEW_REFRESH_SCHEDULE", "*/5 * * * *").strip()
    return None if value.lower() in ("", "none", "off") else value


def registry_dir() -> Path:
    """The registry directory: ``$CDC_REGISTRY_DIR`` or ``include/registry`` of the project root."""
    return Path(os.environ.get("CDC_REGISTRY_DIR", PROJECT_ROOT / "include" / "registry"))


def registry_dir_source() -> str:
    """How :func:`registry_dir` was chosen, in the words a log line shows (which variable, or none set)."""
    if "CDC_REGISTRY_DIR" in os.environ:
        return "$CDC_REGISTRY_DIR"
    if os.environ.get("CDC_PROJECT_ROOT"):
        return "include/registry under $CDC_PROJECT_ROOT"
    if INSTALLED:
        return "include/registry under the working directory: neither CDC_REGISTRY_DIR nor CDC_PROJECT_ROOT is set"
    return "include/registry of the clone: CDC_REGISTRY_DIR is not set"


#: Other registry directories whose tables share this deployment's lake (``os.pathsep``-separated): a table
#: here may not take a storage root overlapping one of theirs (docs/registry.md, ``storage_root``).
OTHER_REGISTRY_DIRS_ENV = "CDC_OTHER_REGISTRY_DIRS"


def other_registry_dirs() -> list[Path]:
    """``$CDC_OTHER_REGISTRY_DIRS``: the other registry directories sharing the lake, in the order written."""
    value = os.environ.get(OTHER_REGISTRY_DIRS_ENV, "")
    return [Path(p) for p in value.split(os.pathsep) if p.strip()]


def airflow_places() -> dict[str, Path]:
    """Airflow's own directories, as this process's environment names them (never Airflow's config: the
    registry is also read where Airflow is not installed): its home, its dags and its plugins folder."""
    home = Path(os.environ.get("AIRFLOW_HOME") or Path.home() / "airflow")
    return {
        "the Airflow home": home,
        "the Airflow dags folder": Path(os.environ.get("AIRFLOW__CORE__DAGS_FOLDER") or home / "dags"),
        "the Airflow plugins folder": Path(os.environ.get("AIRFLOW__CORE__PLUGINS_FOLDER") or home / "plugins"),
    }


def resolve_storage_root(root: str) -> str:
    """Absolute local path for a registry ``storage_root`` (relative ones hang off the project root).

    Symbolic links are resolved and the spelling normalised: ``file://``, ``.`` segments, trailing
    slashes, and leading ``//`` (POSIX leaves two leading slashes to the implementation, so pathlib
    keeps them; Linux means ``/``). S3 roots (``s3://`` or ``s3a://``) are returned as written, without
    a trailing slash.
    """
    if root.startswith(("s3://", "s3a://")):
        return root.rstrip("/")
    if root.startswith("file://"):
        root = root[len("file://") :]
    p = Path(root)
    if not p.is_absolute():
        p = Path(os.environ.get("CDC_LAKE_BASE", PROJECT_ROOT)) / p
    resolved = str(p.resolve())
    return "/" + resolved.lstrip("/") if resolved.startswith("//") else resolved


def metastore_hosts(
    host: str | None, port: int | None, where: str = "the metastore URI"
) -> tuple[tuple[str, ...], int]:
    """The Thrift hosts and their one port, from a host written as ``h``, ``h:9083``, ``thrift://h:9083``
    or a comma-separated list of those (``h1,h2``: tried in order, as Hive's ``hive.metastore.uris``).

    ``port`` (a connection's Port field) is the default for hosts written without one. Both the
    provider's ``HiveMetastoreHook`` and this package try every host on a single port, so hosts
    written with different ports are refused rather than silently reached on the wrong one.
    """
    from cdc_compaction.core.exceptions import MetastoreError

    hosts: list[str] = []
    ports: set[int] = set()
    for item in (host or "").split(","):
        item = item.strip().rstrip("/")
        if "://" in item:
            scheme, _, item = item.partition("://")
            if scheme.lower() != "thrift":
                raise MetastoreError(
                    f"{where}: host {host!r} uses the scheme {scheme!r}; a Hive metastore is reached over "
                    "thrift://host:port (or write just host:port)"
                )
        if not item:
            continue
        name, written_port = item, ""
        if item.count(":") == 1:  # host:port (a bare IPv6 address has several colons and no port)
            name, _, written_port = item.partition(":")
        if written_port:
            if not written_port.isdigit():
                raise MetastoreError(f"{where}: {item!r} in host {host!r} has no numeric port; write host:9083")
            ports.add(int(written_port))
        hosts.append(name)
    if port:
        ports.add(int(port))
    if len(ports) > 1:
        raise MetastoreError(
            f"{where}: host {host!r} (port {port}) names the ports {sorted(ports)}; every metastore host is "
            "tried on one port: run them on the same port, or set the connection's Port and drop the others"
        )
    return (tuple(hosts) or ("127.0.0.1",)), (ports.pop() if ports else 9083)


@dataclass(frozen=True)
class MetastoreEndpoint:
    """Which catalog the tables live in: a Hive metastore's Thrift service, or the AWS Glue Data Catalog."""

    #: One host, or several comma-separated (tried in order, all on ``port``).
    host: str = "127.0.0.1"
    port: int = 9083
    kind: str = "thrift"  # "thrift" | "glue"
    aws_conn_id: str = "aws_default"
    catalog_id: str | None = None
    #: The Airflow connection this endpoint came from: the metastore is then reached through the
    #: apache-hive provider's ``HiveMetastoreHook`` (its SASL/Kerberos settings apply).
    conn_id: str | None = None

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(h for h in self.host.split(",") if h)

    @property
    def uri(self) -> str:
        if self.kind == "glue":
            return f"glue://{self.catalog_id or 'default'}"
        # Comma-separated URIs: the form Hive's (and Spark's) hive.metastore.uris takes for failover.
        return ",".join(f"thrift://{h}:{self.port}" for h in self.hosts)

    @classmethod
    def parse(cls, uri: str) -> MetastoreEndpoint:
        if uri.startswith("glue://"):
            catalog = uri[len("glue://") :].strip("/")
            return cls(kind="glue", catalog_id=None if catalog in ("", "default") else catalog)
        hosts, port = metastore_hosts(uri, None, f"metastore URI {uri!r}")
        return cls(",".join(hosts), port)

    @classmethod
    def from_connection(cls, conn: Any) -> MetastoreEndpoint:
        """The ``metastore_default`` connection: host/port of a Thrift metastore, or extra ``catalog: glue``.

        Host may be written ``h``, ``h:9083``, ``thrift://h:9083`` or ``h1,h2`` (see :func:`metastore_hosts`).
        """
        extra = conn.extra_dejson or {}
        if extra.get("catalog") == "glue":
            return cls(
                kind="glue", aws_conn_id=extra.get("aws_conn_id", "aws_default"), catalog_id=extra.get("catalog_id")
            )
        conn_id = getattr(conn, "conn_id", None)
        hosts, port = metastore_hosts(conn.host, conn.port, f"Airflow connection {conn_id!r}, field host/port")
        return cls(",".join(hosts), port, conn_id=conn_id)


def metastore_from_env() -> MetastoreEndpoint:
    """Metastore endpoint outside Airflow (CLI, in-process runner): ``$CDC_METASTORE_URI``."""
    return MetastoreEndpoint.parse(os.environ.get("CDC_METASTORE_URI", DEFAULT_METASTORE_URI))


def metastore_from_airflow(conn_id: str = METASTORE_CONN_ID) -> MetastoreEndpoint:
    """Metastore endpoint inside a task: the ``metastore_default`` connection."""
    from airflow.sdk import BaseHook

    return MetastoreEndpoint.from_connection(BaseHook.get_connection(conn_id))
