"""Storage roots that cannot be wrong (issue 35): places no table may take, other registry directories
sharing the lake, and registry paths that are not regular files.

The expectations are the documented rules (docs/registry.md, ``storage_root``), written here from
that page: the forbidden places are spelled out in this file, never taken from the package.
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import STUDENT_COLUMNS, fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from cdc_compaction.core import registry
from cdc_compaction.core.exceptions import RegistryError
from cdc_compaction.core.registry import PARSE_CACHE_ENV, load_registry, parse_table
from cdc_compaction.core.settings import PROJECT_ROOT


def doc(database: str, table: str, root: str) -> dict[str, Any]:
    return {
        "database": database,
        "table": table,
        "columns": [dict(c) for c in STUDENT_COLUMNS],
        "primary_key": ["id"],
        "order_by": ["ts_ms"],
        "storage_root": root,
    }


def write(directory: Path, database: str, table: str, root: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{database}.{table}.yaml"
    path.write_text(yaml.safe_dump(doc(database, table, root), sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture
def reg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A registry directory of its own (the lake beside it, never inside), no other registry directories."""
    monkeypatch.delenv("CDC_OTHER_REGISTRY_DIRS", raising=False)
    monkeypatch.delenv("CDC_LAKE_BASE", raising=False)
    registry._load_cached.cache_clear()
    yield tmp_path / "registry"
    registry._load_cached.cache_clear()


def verdict(directory: Path, name: str) -> RegistryError | None:
    entries = {e.path.name: e for e in load_registry(directory)}
    return entries[name].error


def refused_root(directory: Path, root: str, fragment: str) -> str:
    """``root`` is refused at its storage_root line, naming the file and field, with ``fragment``."""
    path = write(directory, "t", "one", root)
    error = verdict(directory, path.name)
    assert error is not None, f"{root!r} was accepted"
    lines = error.lines()
    line_no = len(path.read_text().splitlines())  # storage_root is written last
    assert any(
        line.startswith(f"{path}:{line_no}:") and "field 'storage_root'" in line and fragment in line for line in lines
    ), lines
    return str(error)


# -- places no table may take ------------------------------------------------------------

SYSTEM = [
    ("/", "file system root"),
    ("//", "file system root"),
    ("/.", "file system root"),
    ("///", "file system root"),
    ("file:///", "file system root"),
    ("file:////", "file system root"),
    ("/usr", "/usr"),
    ("/usr/share/doc", "/usr"),
    ("/usr/share/doc/", "/usr"),
    ("/usr/local/lake/t", "/usr"),
    ("file:////etc/./x", "/etc"),
    ("/etc", "/etc"),
    ("/proc/1", "/proc"),
    ("/sys/kernel", "/sys"),
    ("/dev/shm/lake", "/dev"),
    ("/boot/lake", "/boot"),
    ("/bin", "/bin"),
    ("/sbin/x", "/sbin"),
    ("/lib/lake", "/lib"),
    ("/lib64", "/lib"),
    ("/libx32/t", "/lib"),
    ("/run/lake/t", "/run"),
    ("/opt", "/opt"),
    ("/srv", "/srv"),
    ("/root", "/root"),
    ("/home", "/home"),
    ("/tmp", "/tmp"),
    ("/tmp/", "/tmp"),
    ("/tmp/.", "/tmp"),
    ("/var", "/var"),
    ("/var/tmp", "/var/tmp"),
    ("/var/lib", "/var/lib"),
    ("/var/log/lake", "/var/log"),
    ("/var/cache/lake", "/var/cache"),
    ("/var/spool/x", "/var/spool"),
    ("/var/mail", "/var/mail"),
]


@pytest.mark.parametrize(("root", "fragment"), SYSTEM)
def test_a_system_place_is_refused(reg: Path, root: str, fragment: str) -> None:
    refused_root(reg, root, fragment)


@pytest.mark.parametrize(
    "root",
    ["/tmp/lake/t", "/var/tmp/lake/t", "/opt/lake/t", "/srv/lake/shop/orders", "/var/lib/cdc-lake/t", "/lake/t"],
)
def test_a_table_directory_below_a_shared_place_is_fine(reg: Path, root: str) -> None:
    path = write(reg, "t", "one", root)
    assert verdict(reg, path.name) is None


def test_the_tests_and_demo_roots_stay_valid(reg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(reg, "t", "tmp", str(tmp_path / "lake" / "t" / "tmp"))  # pytest's tmp_path, under /tmp
    write(reg, "t", "demo", "./.lake/t/demo")  # the demo's, under the project root
    write(reg, "t", "rel", "lake/t/rel")
    assert [e.error for e in load_registry(reg)] == [None, None, None]
    monkeypatch.setenv("CDC_LAKE_BASE", str(tmp_path / "base"))
    registry._load_cached.cache_clear()
    assert [e.error for e in load_registry(reg)] == [None, None, None]


def test_a_relative_root_resolving_to_a_system_place_is_refused(reg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_LAKE_BASE", "/")
    refused_root(reg, "etc/lake", "/etc")
    registry._load_cached.cache_clear()
    refused_root(reg, "./.", "file system root")


def test_a_symlink_to_a_system_place_is_refused(reg: Path, tmp_path: Path) -> None:
    (tmp_path / "doc-link").symlink_to("/usr/share/doc")
    text = refused_root(reg, str(tmp_path / "doc-link"), "/usr")
    assert "/usr/share/doc" in text  # what it resolves to is named
    (tmp_path / "root-link").symlink_to("/")
    registry._load_cached.cache_clear()
    refused_root(reg, f"file://{tmp_path}/root-link/", "file system root")


def test_a_home_directory_or_its_ancestor_is_refused(
    reg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "homes" / "alice"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    refused_root(reg, str(home), "home")
    registry._load_cached.cache_clear()
    refused_root(reg, str(tmp_path / "homes"), "home")
    registry._load_cached.cache_clear()
    path = write(reg, "t", "one", str(home / "lake" / "t"))  # inside a home: a directory of its own
    assert verdict(reg, path.name) is None


def test_every_users_home_is_refused(reg: Path) -> None:
    homes = sorted({p.pw_dir for p in pwd.getpwall() if p.pw_dir not in ("", "/") and Path(p.pw_dir).is_absolute()})
    assert homes
    for home in homes:
        registry._load_cached.cache_clear()
        path = write(reg, "t", "one", home)
        error = verdict(reg, path.name)
        assert error is not None and "field 'storage_root'" in str(error), home


def test_the_registry_directory_its_ancestors_and_inside_are_refused(reg: Path, tmp_path: Path) -> None:
    for root in (reg, tmp_path, reg / "lake" / "t", reg / "t"):
        registry._load_cached.cache_clear()
        text = refused_root(reg, str(root), "registry directory")
        assert str(reg) in text


def test_the_configured_and_other_registry_directories_are_refused(
    reg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    configured = tmp_path / "configured"
    other = tmp_path / "other"
    monkeypatch.setenv("CDC_REGISTRY_DIR", str(configured))
    monkeypatch.setenv("CDC_OTHER_REGISTRY_DIRS", str(other))
    for root in (configured, configured / "x", other, other / "x"):
        registry._load_cached.cache_clear()
        refused_root(reg, str(root), "registry directory")


def test_airflow_places_are_refused(reg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "af"
    monkeypatch.setenv("AIRFLOW_HOME", str(home))
    monkeypatch.setenv("AIRFLOW__CORE__DAGS_FOLDER", str(tmp_path / "dags"))
    monkeypatch.setenv("AIRFLOW__CORE__PLUGINS_FOLDER", str(tmp_path / "plugins"))
    for root, fragment in [
        (home, "Airflow home"),
        (tmp_path / "dags", "dags folder"),
        (tmp_path / "dags" / "lake" / "t", "dags folder"),
        (tmp_path / "plugins", "plugins folder"),
        (tmp_path / "plugins" / "t", "plugins folder"),
    ]:
        registry._load_cached.cache_clear()
        refused_root(reg, str(root), fragment)
    monkeypatch.delenv("AIRFLOW_HOME")
    registry._load_cached.cache_clear()
    refused_root(reg, str(Path.home() / "airflow"), "Airflow home")


def test_the_project_root_and_its_ancestors_are_refused(reg: Path) -> None:
    for root in (PROJECT_ROOT, PROJECT_ROOT.parent, "."):
        registry._load_cached.cache_clear()
        refused_root(reg, str(root), "project root")


def test_an_s3_bucket_root_is_still_refused(reg: Path) -> None:
    refused_root(reg, "s3://bucket-a/", "must name a prefix inside the bucket")


# Spellings of forbidden places: extra slashes, '.' segments, trailing slashes, file://, a symlink.
_PLACES = ["/", "/usr", "/usr/share/doc", "/etc", "/etc/x", "/proc/self", "/boot", "/sys", "/dev", "/tmp", "/var"]


@st.composite
def forbidden_spelling(draw: st.DrawFn) -> tuple[str, str]:
    place = draw(st.sampled_from(_PLACES))
    parts = [p for p in place.split("/") if p]
    spelled: list[str] = []
    for part in parts:
        spelled += ["."] * draw(st.integers(0, 2))
        spelled.append(part)
    spelled += ["."] * draw(st.integers(0, 2))
    lead = "/" * draw(st.integers(1, 4))
    text = lead + "/".join(spelled) + "/" * draw(st.integers(0, 3))
    if draw(st.booleans()):
        text = "file://" + text
    return place, text


@pytest.fixture(scope="module")
def links(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("links")
    for i, place in enumerate(_PLACES):
        (d / f"l{i}").symlink_to(place)
    return d


@fuzz_settings(300)
@given(spelling=forbidden_spelling(), via_link=st.booleans())
def test_every_spelling_of_a_forbidden_place_is_refused(
    links: Path, spelling: tuple[str, str], via_link: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    place, text = spelling
    if via_link:
        text = str(links / f"l{_PLACES.index(place)}") + "/" * text.endswith("/")
    with pytest.raises(ValidationError) as info:
        parse_table(doc("t", "one", text))
    assert "storage_root" in str(info.value), (text, str(info.value))


# -- other registry directories sharing the lake -----------------------------------------


def test_a_root_overlapping_a_table_of_another_registry_directory_is_refused(
    reg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other, third = tmp_path / "other", tmp_path / "third"
    lake = tmp_path / "lake"
    theirs = write(other, "o", "outer", str(lake / "shared"))
    write(third, "x", "far", str(lake / "far"))
    (third / "x.broken.yaml").write_text("database: [\n")  # an invalid file there breaks nothing here
    write(third, "x", "bad", str(lake / "mine" / "in"))  # invalid (no columns) although its root overlaps
    bad = yaml.safe_load((third / "x.bad.yaml").read_text())
    (third / "x.bad.yaml").write_text(yaml.safe_dump({**bad, "columns": []}))
    nested = write(reg, "m", "nested", str(lake / "shared" / "t"))
    mine = write(reg, "m", "mine", str(lake / "mine"))
    assert verdict(reg, nested.name) is None  # not known yet: no other directory configured
    monkeypatch.setenv("CDC_OTHER_REGISTRY_DIRS", os.pathsep.join([str(other), str(third), str(tmp_path / "gone")]))
    entries = {e.path.name: e for e in load_registry(reg)}
    error = entries[nested.name].error
    assert error is not None
    assert any(
        line.startswith(f"{nested}:{len(nested.read_text().splitlines())}:")
        and "field 'storage_root'" in line
        and str(theirs) in line
        for line in error.lines()
    ), error.lines()
    assert entries[mine.name].error is None
    # The task process of the table's DAG reaches the same verdict.
    registry._load_cached.cache_clear()
    (only,) = load_registry(reg, dag_id="cdc__m__nested")
    assert only.error is not None and str(theirs) in str(only.error)


def test_a_change_in_another_registry_directory_is_seen(
    reg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "parse-cache"
    monkeypatch.setenv(PARSE_CACHE_ENV, str(cache))
    other = tmp_path / "other"
    lake = tmp_path / "lake"
    theirs = write(other, "o", "outer", str(lake / "elsewhere"))
    write(reg, "m", "mine", str(lake / "mine"))
    monkeypatch.setenv("CDC_OTHER_REGISTRY_DIRS", str(other))
    assert [e.error for e in load_registry(reg)] == [None]
    assert list(cache.glob("*.pickle"))  # kept for the next process
    # Same size and mtime kept apart by content: the other file now takes a root around this table's.
    theirs.write_text(theirs.read_text().replace(str(lake / "elsewhere"), str(lake / "mine" / "in")))
    (entry,) = load_registry(reg)  # this process
    assert entry.error is not None and str(theirs) in str(entry.error)
    registry._load_cached.cache_clear()  # a fresh process, with the parse cache
    (entry,) = load_registry(reg)
    assert entry.error is not None and str(theirs) in str(entry.error)


# -- registry paths that are not regular files -------------------------------------------


def load(directory: Path) -> list[Any]:
    """:func:`load_registry` in a thread, failing (instead of hanging the run) if it blocks: opening a FIFO does."""
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(load_registry(directory)), daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the load blocked (a FIFO was opened?)"
    assert out, "the load raised"
    return out[0]


def _make(kind: str, path: Path, tmp_path: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    elif kind == "link-to-directory":
        (tmp_path / "a-dir").mkdir()
        path.symlink_to(tmp_path / "a-dir")
    elif kind == "link-to-fifo":
        os.mkfifo(tmp_path / "a-fifo")
        path.symlink_to(tmp_path / "a-fifo")
    elif kind == "dangling-link":
        path.symlink_to(tmp_path / "nowhere.yaml")


KINDS = {
    "fifo": "is a FIFO",
    "directory": "is a directory",
    "socket": "is a socket",
    "link-to-directory": "which is a directory",
    "link-to-fifo": "which is a FIFO",
    "dangling-link": "which cannot be opened",
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_registry_path_that_is_not_a_regular_file_is_an_error(reg: Path, tmp_path: Path, kind: str) -> None:
    good = write(reg, "school", "pupil", str(tmp_path / "lake" / "pupil"))
    odd = reg / "school.odd.yaml"
    _make(kind, odd, tmp_path)
    entries = {e.path.name: e for e in load(reg)}
    assert set(entries) == {good.name, odd.name}
    assert entries[good.name].error is None
    error = entries[odd.name].error
    assert error is not None and str(odd) in str(error) and KINDS[kind] in str(error), error
    assert entries[odd.name].dag_id == "cdc__school__odd"


def test_a_symlink_to_a_regular_file_stays_valid(reg: Path, tmp_path: Path) -> None:
    real = write(tmp_path / "elsewhere", "school", "pupil", str(tmp_path / "lake" / "pupil"))
    reg.mkdir()
    (reg / real.name).symlink_to(real)
    (entry,) = load_registry(reg)
    assert entry.error is None and entry.config is not None


def test_a_defaults_file_that_is_a_fifo_is_an_error_of_its_database(reg: Path, tmp_path: Path) -> None:
    write(reg, "school", "pupil", str(tmp_path / "lake" / "pupil"))
    (reg / "school").mkdir()
    os.mkfifo(reg / "school" / "_database.yaml")
    (entry,) = load(reg)
    assert entry.error is not None and "is a FIFO" in str(entry.error), entry.error


def test_a_fifo_in_another_registry_directory_breaks_nothing_here(
    reg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    os.mkfifo(other / "o.fifo.yaml")
    (other / "o.dir.yaml").mkdir()
    monkeypatch.setenv("CDC_OTHER_REGISTRY_DIRS", str(other))
    write(reg, "m", "mine", str(tmp_path / "lake" / "mine"))
    assert [e.error for e in load(reg)] == [None]


def test_the_dag_file_shows_an_error_dag_for_a_fifo_and_keeps_the_other_tables(reg: Path, tmp_path: Path) -> None:
    """The real DAG file through Airflow's DagBag, in a process of its own (a FIFO must not hang it)."""
    write(reg, "school", "pupil", str(tmp_path / "lake" / "pupil"))
    os.mkfifo(reg / "school.fifo.yaml")
    code = (
        "import json\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(PROJECT_ROOT / 'dags')!r})\n"
        "fifo = bag.dags.get('cdc__school__fifo')\n"
        "print(json.dumps({'errors': len(bag.import_errors), 'ids': sorted(bag.dag_ids),"
        " 'fifo_tasks': sorted(t.task_id for t in fifo.tasks) if fifo else None,"
        " 'fifo_doc': fifo.doc_md if fifo else None,"
        " 'pupil_tasks': len(bag.dags['cdc__school__pupil'].tasks)}))\n"
    )
    env = {**os.environ, "CDC_REGISTRY_DIR": str(reg), "CDC_PARSE_CACHE_DIR": "off"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errors"] == 0
    assert {"cdc__school__fifo", "cdc__school__pupil"} <= set(result["ids"])
    assert result["fifo_tasks"] == ["registry_error"]
    assert "is a FIFO" in result["fifo_doc"] and str(reg / "school.fifo.yaml") in result["fifo_doc"]
    assert result["pupil_tasks"] > 1
