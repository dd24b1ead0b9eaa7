"""The registry parse cache: a fresh process reuses what an earlier one validated from the same bytes.

The DAG processor parses the DAG file every 30 s in a fresh process; validating 500 registry
files is a quarter of that parse. These tests load real registry files from disk, with the
cache in a private directory of their own, and stand in for "a fresh process" by clearing the
in-process cache.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import student_doc

from cdc_compaction.core import registry
from cdc_compaction.core.registry import PARSE_CACHE_ENV, load_registry


def _write(directory: Path, lake: Path, name: str, **overrides: Any) -> Path:
    doc = student_doc(lake, name, **overrides)
    path = directory / f"{doc['database']}.{doc['table']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "parse-cache"
    monkeypatch.setenv(PARSE_CACHE_ENV, str(d))
    registry._load_cached.cache_clear()
    yield d
    registry._load_cached.cache_clear()


def _fresh_process_load(directory: Path) -> list[Any]:
    registry._load_cached.cache_clear()  # what a new process starts with
    return load_registry(directory)


def _refuse_to_validate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make validating any file fail loudly: a load that still succeeds came from the cache."""

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("validated again instead of using the parse cache")

    monkeypatch.setattr(registry, "parse_entry", boom)


def test_a_fresh_process_reuses_the_validated_registry(tmp_path: Path, cache: Path, monkeypatch: Any) -> None:
    reg = tmp_path / "registry"
    reg.mkdir()
    _write(reg, tmp_path / "lake", "alpha")
    _write(reg, tmp_path / "lake", "beta")
    first = _fresh_process_load(reg)
    assert [e.error for e in first] == [None, None]
    assert len(list(cache.glob("*.pickle"))) == 1
    _refuse_to_validate(monkeypatch)
    again = _fresh_process_load(reg)
    assert [(e.path, e.config) for e in again] == [(e.path, e.config) for e in first]


def test_an_edit_is_seen_even_with_the_same_size_and_modification_time(
    tmp_path: Path, cache: Path, monkeypatch: Any
) -> None:
    reg = tmp_path / "registry"
    reg.mkdir()
    path = _write(reg, tmp_path / "lake", "alpha", owner="team-a")
    assert _fresh_process_load(reg)[0].config.owner == "team-a"
    st = path.stat()
    path.write_text(path.read_text().replace("team-a", "team-b"), encoding="utf-8")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # a copy that kept the old time: only the bytes differ
    assert path.stat().st_size == st.st_size
    assert _fresh_process_load(reg)[0].config.owner == "team-b"


def test_an_invalid_registry_is_not_kept_and_a_changed_environment_is_another_key(
    tmp_path: Path, cache: Path, monkeypatch: Any
) -> None:
    reg = tmp_path / "registry"
    reg.mkdir()
    bad = _write(reg, tmp_path / "lake", "alpha", retries="many")
    assert _fresh_process_load(reg)[0].error is not None
    assert not list(cache.glob("*.pickle")), "an entry with an error is re-explained every time, never cached"
    bad.unlink()
    _write(reg, Path("lake-rel"), "beta")  # a relative storage root: it hangs off $CDC_LAKE_BASE
    for base in ("one", "two"):
        monkeypatch.setenv("CDC_LAKE_BASE", str(tmp_path / base))
        assert _fresh_process_load(reg)[0].error is None
    assert len(list(cache.glob("*.pickle"))) == 2, "one validated registry per environment"


def test_a_cache_directory_others_can_write_is_not_read(tmp_path: Path, cache: Path, monkeypatch: Any) -> None:
    reg = tmp_path / "registry"
    reg.mkdir()
    _write(reg, tmp_path / "lake", "alpha")
    _fresh_process_load(reg)
    cache.chmod(0o777)  # anyone could have planted a pickle here
    _refuse_to_validate(monkeypatch)
    (entry,) = _fresh_process_load(reg)
    assert entry.config is None and "validated again" in str(entry.error)


def test_the_cache_can_be_turned_off(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv(PARSE_CACHE_ENV, "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    reg = tmp_path / "registry"
    reg.mkdir()
    _write(reg, tmp_path / "lake", "alpha")
    assert _fresh_process_load(reg)[0].error is None
    assert not (tmp_path / "xdg").exists() and not (tmp_path / "home").exists()
