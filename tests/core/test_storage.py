"""LocalStorage: the file-system primitives the commit protocol relies on.

Atomic replace, create-if-absent under contention, complete-or-absent copies, sorted
listings and idempotent deletes.  No Spark here.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from conftest import race

from cdc_compaction.core.exceptions import PreconditionFailedError, StorageError
from cdc_compaction.core.storage import FileInfo, LocalStorage, storage_for


@pytest.fixture
def storage() -> LocalStorage:
    return LocalStorage()


def names_in(directory: Path) -> list[str]:
    """Every entry of ``directory`` (hidden ones included), sorted."""
    return sorted(os.listdir(directory))


def write_bytes(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# ----------------------------------------------------------------------------- write_text
def test_write_text_creates_parents_and_replaces_content_without_leftovers(
    storage: LocalStorage, tmp_path: Path
) -> None:
    target = tmp_path / "a" / "b" / "pointer.json"
    storage.write_text(str(target), '{"seq": 1}')
    assert target.read_text(encoding="utf-8") == '{"seq": 1}'

    big = "x" * 300_000 + "é-end"
    storage.write_text(str(target), big)

    assert storage.read_text(str(target)) == big
    assert names_in(target.parent) == ["pointer.json"]  # no .pointer.json.*.tmp left behind


def test_write_text_readers_see_old_or_new_content_never_a_mix(storage: LocalStorage, tmp_path: Path) -> None:
    target = str(tmp_path / "state.json")
    versions = ["A" * 200_000, "B" * 150_000]
    storage.write_text(target, versions[0])
    stop = threading.Event()
    seen: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            with open(target, encoding="utf-8") as fh:
                seen.append(fh.read())

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(60):
            storage.write_text(target, versions[i % 2])
    finally:
        stop.set()
        t.join()

    assert seen, "the reader never ran"
    torn = [len(s) for s in seen if s not in versions]
    assert torn == []
    assert names_in(tmp_path) == ["state.json"]


# ------------------------------------------------------------------------ create_exclusive
def test_create_exclusive_creates_once_then_refuses_without_touching_content(
    storage: LocalStorage, tmp_path: Path
) -> None:
    target = tmp_path / "commits" / "00000001.json"
    storage.create_exclusive(str(target), "first")
    assert target.read_text(encoding="utf-8") == "first"

    with pytest.raises(PreconditionFailedError, match="exists already"):
        storage.create_exclusive(str(target), "second")

    assert target.read_text(encoding="utf-8") == "first"
    assert names_in(target.parent) == ["00000001.json"]
    assert issubclass(PreconditionFailedError, StorageError)


def test_concurrent_create_exclusive_has_exactly_one_winner(storage: LocalStorage, tmp_path: Path) -> None:
    target = str(tmp_path / "commits" / "00000002.json")
    n = 8
    won, lost, other = race(n, lambda i: storage.create_exclusive(target, f"writer-{i}-" + "z" * 50_000))

    assert other == []
    assert len(won) == 1
    assert sorted(won + lost) == list(range(n))
    assert Path(target).read_text(encoding="utf-8") == f"writer-{won[0]}-" + "z" * 50_000
    assert names_in(tmp_path / "commits") == ["00000002.json"]


# ------------------------------------------------------------------------------------ upload
def test_upload_writes_a_local_files_bytes_whole_and_replaces(storage: LocalStorage, tmp_path: Path) -> None:
    data = os.urandom(3_000_000) + b"tail"
    local = write_bytes(tmp_path / "scratch" / "index.parquet", data)
    dst = tmp_path / "lake" / "index-ab12" / "part-00000.parquet"
    storage.upload(str(local), str(dst))
    assert dst.read_bytes() == data and names_in(dst.parent) == ["part-00000.parquet"]
    storage.upload(str(write_bytes(tmp_path / "scratch" / "b", b"short")), str(dst))
    assert dst.read_bytes() == b"short" and names_in(dst.parent) == ["part-00000.parquet"]


def test_upload_of_a_missing_local_file_raises_and_leaves_nothing(storage: LocalStorage, tmp_path: Path) -> None:
    dst = tmp_path / "lake" / "x.parquet"
    with pytest.raises(StorageError, match=r"cannot write .*x\.parquet from .*nope"):
        storage.upload(str(tmp_path / "nope"), str(dst))
    assert names_in(dst.parent) == []


# ------------------------------------------------------------------------------------ copy
def test_copy_produces_identical_bytes_and_no_temp_files(storage: LocalStorage, tmp_path: Path) -> None:
    data = os.urandom(1_500_000) + b"\x00\xff\xfe tail"
    src = write_bytes(tmp_path / "landing" / "increment_2026112200" / "part-00000.parquet", data)
    dst = tmp_path / "archive" / "increment_2026112200" / "part-00000.parquet"

    storage.copy(str(src), str(dst))

    assert dst.read_bytes() == data
    assert src.read_bytes() == data  # the source is untouched
    assert names_in(dst.parent) == ["part-00000.parquet"]
    assert storage.size(str(dst)) == len(data)


def test_copy_over_an_existing_destination_replaces_it(storage: LocalStorage, tmp_path: Path) -> None:
    src = write_bytes(tmp_path / "src.bin", b"new content")
    dst = write_bytes(tmp_path / "out" / "dst.bin", b"an older, longer content that must disappear")

    storage.copy(str(src), str(dst))

    assert dst.read_bytes() == b"new content"
    assert not [n for n in names_in(dst.parent) if n.endswith(".copying")]


def test_copy_of_a_missing_source_raises_storage_error_and_leaves_nothing(
    storage: LocalStorage, tmp_path: Path
) -> None:
    dst = tmp_path / "out" / "dst.bin"
    with pytest.raises(StorageError, match="cannot copy"):
        storage.copy(str(tmp_path / "nope.bin"), str(dst))
    assert names_in(dst.parent) == []


def test_copy_to_a_bare_file_name_in_the_working_directory(
    storage: LocalStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write_bytes(tmp_path / "src.bin", b"payload")
    storage.copy("src.bin", "dst.bin")
    assert (tmp_path / "dst.bin").read_bytes() == b"payload"


# -------------------------------------------------------------------------------- list_dir
def test_list_dir_returns_sorted_file_infos_with_sizes(storage: LocalStorage, tmp_path: Path) -> None:
    d = tmp_path / "increment_2026112200"
    write_bytes(d / "part-00001.parquet", b"12345")
    write_bytes(d / "part-00000.parquet", b"123")
    write_bytes(d / "_SUCCESS", b"")
    (d / "sub").mkdir()
    (d / "sub" / "inner.bin").write_bytes(b"ignored: not listed recursively")

    listing = storage.list_dir(str(d))

    assert [f.name for f in listing] == ["_SUCCESS", "part-00000.parquet", "part-00001.parquet", "sub"]
    assert all(isinstance(f, FileInfo) for f in listing)
    by_name = {f.name: f for f in listing}
    assert by_name["part-00000.parquet"].size == 3
    assert by_name["part-00001.parquet"].size == 5
    assert by_name["_SUCCESS"].size == 0
    assert by_name["sub"].is_dir is True
    assert by_name["sub"].size == 0
    assert by_name["part-00001.parquet"].is_dir is False
    assert by_name["part-00001.parquet"].path == str(d / "part-00001.parquet")
    assert by_name["part-00001.parquet"].mtime == pytest.approx((d / "part-00001.parquet").stat().st_mtime)


def test_list_dir_of_a_missing_directory_is_empty(storage: LocalStorage, tmp_path: Path) -> None:
    assert storage.list_dir(str(tmp_path / "never-created")) == []


def test_list_dir_of_a_regular_file_raises_storage_error(storage: LocalStorage, tmp_path: Path) -> None:
    f = write_bytes(tmp_path / "plain.txt", b"x")
    with pytest.raises(StorageError, match="cannot list"):
        storage.list_dir(str(f))


def test_list_dir_keeps_other_entries_when_one_vanishes_during_listing(storage: LocalStorage, tmp_path: Path) -> None:
    d = tmp_path / "increment_2026112200"
    write_bytes(d / "part-00000.parquet", b"data")
    os.symlink(d / "gone.tmp", d / "zz-vanished.tmp")  # stat() of this entry raises FileNotFoundError

    try:
        listing = storage.list_dir(str(d))
    except StorageError:
        return  # refusing loudly is acceptable too; silently reporting an empty directory is not
    assert "part-00000.parquet" in [f.name for f in listing]


# ------------------------------------------------------------------ read / size / delete
def test_read_text_and_size_of_a_missing_file_raise_storage_error(storage: LocalStorage, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.json")
    with pytest.raises(StorageError, match="cannot read"):
        storage.read_text(missing)
    with pytest.raises(StorageError, match="cannot stat"):
        storage.size(missing)
    assert storage.exists(missing) is False


def test_delete_removes_a_file_and_is_a_no_op_when_missing(storage: LocalStorage, tmp_path: Path) -> None:
    f = write_bytes(tmp_path / "plan.json", b"{}")
    storage.delete(str(f))
    assert not f.exists()
    storage.delete(str(f))  # second time: nothing to do, no error
    storage.delete(str(tmp_path / "never" / "existed.json"))
    assert names_in(tmp_path) == []


def test_delete_tree_removes_everything_and_ignores_missing(storage: LocalStorage, tmp_path: Path) -> None:
    root = tmp_path / "v00000001"
    write_bytes(root / "part-00000.parquet", b"a")
    write_bytes(root / "nested" / "deeper" / "x.bin", b"b")
    storage.delete_tree(str(root))
    assert not root.exists()
    storage.delete_tree(str(root))
    assert names_in(tmp_path) == []


def test_remove_dir_if_empty_only_removes_empty_directories(storage: LocalStorage, tmp_path: Path) -> None:
    full = tmp_path / "increment_2026112200"
    write_bytes(full / "part-00000.parquet", b"keep me")
    empty = tmp_path / "increment_2026112201"
    empty.mkdir()

    assert storage.remove_dir_if_empty(str(full)) is False
    assert (full / "part-00000.parquet").read_bytes() == b"keep me"
    assert storage.remove_dir_if_empty(str(empty)) is True
    assert not empty.exists()
    assert storage.remove_dir_if_empty(str(empty)) is False  # already gone
    assert names_in(tmp_path) == ["increment_2026112200"]


def test_makedirs_and_join(storage: LocalStorage, tmp_path: Path) -> None:
    d = storage.join(str(tmp_path), "a", "b")
    assert d == str(tmp_path / "a" / "b")
    storage.makedirs(d)
    storage.makedirs(d)  # idempotent
    assert Path(d).is_dir()


# ----------------------------------------------------------------------------- storage_for
@pytest.mark.parametrize("root", ["hdfs://namenode/lake", "gs://b"])
def test_storage_for_refuses_remote_schemes(root: str) -> None:
    with pytest.raises(StorageError, match="no storage implementation"):
        storage_for(root)


@pytest.mark.parametrize("root", ["/lake/t", "file:///lake/t"])
def test_storage_for_local_roots_is_local_storage(root: str) -> None:
    assert isinstance(storage_for(root), LocalStorage)
