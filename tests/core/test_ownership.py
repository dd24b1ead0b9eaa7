"""Ownership markers and deleting by ownership, on local storage and on S3 (moto).

The expectations are listings taken here (``os.walk``, or the bucket's keys through boto3), not the
project's ownership code; the project's code only runs what is tested (claim, ``drop_lake``).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import student_doc

from cdc_compaction.core.exceptions import OwnershipError
from cdc_compaction.core.lake import Commit, Lake
from cdc_compaction.core.ownership import claim
from cdc_compaction.core.registry import parse_table
from cdc_compaction.operations.ops import drop_lake


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def base(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the test's roots live: a local directory, or a fresh bucket on moto."""
    if request.param == "local":
        return str(tmp_path)
    request.getfixturevalue("aws_default")
    from cdc_compaction.core.storage.s3 import S3Storage

    bucket = f"own-{uuid.uuid4().hex[:16]}"
    S3Storage().client.create_bucket(Bucket=bucket)
    return f"s3://{bucket}"


def table(base: str, name: str, root: str) -> Any:
    return parse_table(student_doc(Path("/unused"), name, storage_root=f"{base}/{root}"))


def put(lake: Lake, rel: str, text: str = "x") -> None:
    lake.storage.write_text(f"{lake.layout.root}/{rel}", text)


def listing(base: str) -> set[str]:
    """Every file under ``base``, relative to it (the bucket's keys on S3)."""
    if base.startswith("s3://"):
        from cdc_compaction.core.storage.s3 import S3Storage

        bucket = base[len("s3://") :]
        pages = S3Storage().client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        return {o["Key"] for page in pages for o in page.get("Contents", [])}
    return {os.path.relpath(os.path.join(d, n), base) for d, _, names in os.walk(base) for n in names}


def test_claim_writes_the_marker_once_and_refuses_other_tables_and_nested_roots(base: str) -> None:
    a = Lake(table(base, "a", "lake/a"))
    assert claim(a, "reg/tests.a.yaml") is True and claim(a) is False
    doc = json.loads(a.storage.read_text(a.layout.owner))
    assert doc["table"] == "tests.a" and doc["registry_file"] == "reg/tests.a.yaml" and doc["deployment"]

    same = Lake(table(base, "other", "lake/a"))
    with pytest.raises(OwnershipError, match=r"belongs to table tests\.a .*Nothing was changed"):
        claim(same)
    nested = Lake(table(base, "inner", "lake/a/inner"))
    with pytest.raises(OwnershipError, match=r"lies inside the root of table tests\.a"):
        claim(nested)
    holder = Lake(table(base, "outer", "lake"))
    with pytest.raises(OwnershipError, match=r"holds the root of table tests\.a"):
        claim(holder)
    assert listing(base) == {"lake/a/_cdc/owner.json"}, "the refusals wrote nothing"


def test_drop_lake_deletes_what_the_records_name_and_leaves_the_rest(base: str) -> None:
    cfg = table(base, "d", "lake/d")
    lake = Lake(cfg)
    claim(lake, "")
    version = "v00000001-abc123-a1"
    files = [{"increment": "increment_2026112200", "name": "part-00000.parquet", "path": "x", "size": 1, "rows": 1}]
    commit = Commit(1, version, "abc123", "run", 0, files, ["increment_2026112200"])
    assert lake.try_commit(commit)
    own = [
        f"base/{version}/data/part-00000-1.parquet",
        f"base/{version}/tombstones/part-00000-2.parquet",
        f"base/{version}/_cdc_stats.json",
        "archive/c00000001/increment_2026112200/part-00000.parquet",
        "changes/c00000001.parquet",
        "incremental/increment_2026112201/part-00000.parquet",
        "_cdc/pointer.json",
    ]
    theirs = [
        f"base/{version}/data/_notes.txt",
        "archive/c00000001/increment_2026112200/extra.parquet",  # no record names it
        "base/v00000009-zzz-a1/data/part-00000.parquet",  # a version no record of d names
        "incremental/README",
        "docs/manual.txt",
        "nested/_cdc/owner.json",  # another table's root: never entered
        "nested/base/v00000001-abc123-a1/_cdc_stats.json",
    ]
    for rel in own + theirs:
        put(lake, rel, json.dumps({"table": "other.t"}) if rel.endswith("owner.json") else "x")

    removal = drop_lake(cfg)
    left = listing(base)
    assert left == {f"lake/d/{rel}" for rel in theirs}
    assert len(removal.removed) == len(own) + 2, "and the commit record, and the marker"
    assert any("nested (the root of table other.t)" in k for k in removal.kept)


def test_drop_lake_never_follows_a_link_out_of_the_root(tmp_path: Path) -> None:
    cfg = table(str(tmp_path), "l", "lake/l")
    lake = Lake(cfg)
    claim(lake, "")
    outside = tmp_path / "outside"
    (outside / "data").mkdir(parents=True)
    (outside / "data" / "part-00000.parquet").write_text("someone else's")
    (outside / "pointer.json").write_text("{}")
    root = Path(lake.layout.root)
    (root / "base").mkdir()
    (root / "base" / "v00000000-empty").symlink_to(outside)  # a name the layout knows, pointing out
    (root / "_cdc" / "link.json").symlink_to(outside / "pointer.json")
    drop_lake(cfg)
    assert sorted(listing(str(outside))) == ["data/part-00000.parquet", "pointer.json"]
    assert (root / "base" / "v00000000-empty").is_symlink() and (root / "_cdc" / "link.json").is_symlink()
