"""Places a table's local storage root may not be (docs/registry.md, ``storage_root``).

A storage root is where a table's files are written, archived, rolled back and, by ``delete
--drop-data``, removed. Anything the system, a user, Airflow or this deployment keeps there
would be read as the table's, or destroyed with it. So the registry refuses a root (after
:func:`~cdc_compaction.core.settings.resolve_storage_root`: relative roots under
``$CDC_LAKE_BASE``, ``file://``, ``//``, ``.``, trailing slashes and symbolic links resolved) that is:

* a system tree or anything inside one (:data:`SYSTEM_TREES`, and every top-level ``/lib*``);
* a shared system directory itself (:data:`SYSTEM_DIRS`): a table's directory *below* ``/tmp``,
  ``/var/tmp``, ``/opt``, ``/srv`` or ``/var/lib`` is fine, the shared directory is not;
* a home directory (every user's of the password database, and ``$HOME``) or an ancestor of one;
* the project root or an ancestor of it; the Airflow home or an ancestor of it;
* a registry directory, the Airflow dags or plugins folder: the directory itself, an ancestor of
  it, or anything inside it.

Each place is compared as written and as its own symbolic links resolve (``/lib`` may be
``/usr/lib``, ``/var/run`` is ``/run``).
"""

from __future__ import annotations

import functools
import os
import pwd
from collections.abc import Iterable
from pathlib import Path

from cdc_compaction.core import settings

#: Refused with everything under them: what the system owns, or empties at boot.
SYSTEM_TREES: dict[str, str] = {
    "/bin": "system programs",
    "/boot": "the boot loader and kernels",
    "/dev": "device files",
    "/etc": "the system's configuration",
    "/proc": "the kernel's process file system",
    "/run": "run-time state, emptied at every boot",
    "/sbin": "system programs",
    "/sys": "the kernel's device file system",
    "/usr": "installed software",
    "/var/cache": "system caches, cleaned by the system",
    "/var/log": "system logs, rotated away by the system",
    "/var/mail": "mailboxes",
    "/var/spool": "system queues",
}
#: Refused themselves (a table's own directory below them is fine): directories many share.
SYSTEM_DIRS: dict[str, str] = {
    "/": "the file system root",
    "/home": "the directory of every user's home",
    "/media": "removable media mount points",
    "/mnt": "mount points",
    "/opt": "add-on software packages",
    "/root": "the superuser's home",
    "/srv": "the data of every service",
    "/tmp": "the shared temporary directory",
    "/var": "the system's variable data",
    "/var/backups": "system backups",
    "/var/lib": "every service's state",
    "/var/local": "local variable data",
    "/var/opt": "add-on packages' variable data",
    "/var/tmp": "the shared temporary directory",
}
_HINT = (
    "give the table a directory of its own, e.g. /srv/lake/<database>/<table>, or a relative root "
    "(under $CDC_LAKE_BASE, default the project root)"
)


@functools.lru_cache(maxsize=512)
def _forms(place: str | Path) -> frozenset[str]:
    """``place`` as written (made absolute) and with its symbolic links resolved."""
    p = os.path.abspath(os.fspath(place))
    return frozenset({p, os.path.realpath(p)})


def _under(path: str, place: str) -> bool:
    return place == "/" or path.startswith(place.rstrip("/") + "/")


#: The environment the places below are read from: the cache of :func:`_places` is keyed on it.
_PLACE_ENV = (
    "HOME",
    "AIRFLOW_HOME",
    "AIRFLOW__CORE__DAGS_FOLDER",
    "AIRFLOW__CORE__PLUGINS_FOLDER",
    "CDC_REGISTRY_DIR",
    settings.OTHER_REGISTRY_DIRS_ENV,
)
#: One place: every spelling of it, what it is called, and whether what is inside it is refused too.
Place = tuple[frozenset[str], str, bool]


@functools.lru_cache(maxsize=8)
def _places(
    env: tuple[str | None, ...], project_root: str
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[Place, ...]]:
    """Homes, project-root spellings and the Airflow and registry places, worked out once per environment
    (the password database and ``realpath`` cost ~0.4 ms a root, 500 roots at every DAG file parse)."""
    del env, project_root  # the cache key: what the places below are read from
    homes = {p.pw_dir for p in pwd.getpwall() if p.pw_dir.startswith("/")}
    homes |= {h for h in (os.environ.get("HOME"), os.path.expanduser("~")) if h and h.startswith("/")}
    places: list[Place] = []
    for name, where in settings.airflow_places().items():
        places.append((_forms(where), name, name != "the Airflow home"))  # a lake may live there
    for where in [settings.registry_dir(), *settings.other_registry_dirs()]:
        places.append((_forms(where), "a registry directory", True))
    return (
        tuple(sorted(f for h in homes for f in _forms(h))),
        tuple(sorted(_forms(settings.PROJECT_ROOT))),
        tuple(places),
    )


@functools.lru_cache(maxsize=1)
def _system() -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    trees = tuple((f, p) for p in SYSTEM_TREES for f in sorted(_forms(p)))
    dirs = tuple((f, p) for p in SYSTEM_DIRS for f in sorted(_forms(p)))
    return trees, dirs


def refusal(resolved: str, registry_dirs: Iterable[str | Path] = ()) -> str | None:
    """Why the resolved local root ``resolved`` may not be a table's storage root, or None when it may.

    ``registry_dirs`` are registry directories besides the configured ones (``$CDC_REGISTRY_DIR`` and
    ``$CDC_OTHER_REGISTRY_DIRS``, always checked): the directory being loaded.
    """
    path = os.path.normpath(resolved)
    trees, dirs = _system()
    for form, place in trees:
        if path == form or _under(path, form):
            return f"is {path}, inside {place} ({SYSTEM_TREES[place]}); {_HINT}"
    top = path.split("/")[1] if path != "/" else ""
    if top.startswith("lib"):
        return f"is {path}, inside /{top} (shared libraries); {_HINT}"
    for form, place in dirs:
        if path == form:
            what = "the file system root" if place == "/" else f"{place} itself ({SYSTEM_DIRS[place]})"
            return f"is {what}; {_HINT}"
    homes, project, places = _places(tuple(os.environ.get(k) for k in _PLACE_ENV), str(settings.PROJECT_ROOT))
    for home in homes:
        if path == home or _under(home, path):
            what = "a home directory" if path == home else f"an ancestor of the home directory {home}"
            return f"is {path}, {what}; a home holds a user's files, never only a table's: {_HINT}"
    if any(path == p or _under(p, path) for p in project):
        what = "the project root" if path in project else f"an ancestor of the project root {settings.PROJECT_ROOT}"
        return f"is {path}, {what}; put the table below it (e.g. ./.lake/<database>/<table>)"
    extra = [(_forms(d), "a registry directory", True) for d in registry_dirs]
    for forms, name, inside in (*places, *extra):
        for form in sorted(forms):
            if path == form or _under(form, path) or (inside and _under(path, form)):
                relation = "is" if path == form else "is inside" if _under(path, form) else "is an ancestor of"
                return (
                    f"is {path}, which {relation} {name} {form}; a table's files there would be taken for, "
                    f"or delete, what {name} holds: {_HINT}"
                )
    return None
