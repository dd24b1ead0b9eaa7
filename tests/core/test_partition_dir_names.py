"""Partition directory names: ``cdc_partition=<v>`` since issue 37, ``_cdc_partition=<v>`` before.

Hadoop's ``FileInputFormat`` (Hive's reader) skips every path whose name starts with ``_``, so a
partition directory named ``_cdc_partition=<v>`` reads as empty through Hive.  Versions written
since are named ``cdc_partition=<v>``; versions written before keep their names and must stay
readable, so every place that recognises a partition directory by its name takes both.  Pure:
names by hand.
"""

from __future__ import annotations

import pytest

from cdc_compaction.core.inputs import partition_dir_name
from cdc_compaction.core.lake import version_dir_of
from cdc_compaction.job.compact import partition_dir_value as job_partition_dir_value
from cdc_compaction.job.contract import partition_dir_value
from cdc_compaction.job.files import _is_partition_dir
from cdc_compaction.job.modes.cdc import _written_partitions
from cdc_compaction.operations.erase import _component_value, _partition_of
from cdc_compaction.pipeline.retention import partition_dir_value as retention_partition_dir_value
from cdc_compaction.pipeline.validate import partition_dir_value as validate_partition_dir_value

V1 = "/lake/t/base/v00000001-a"
#: Every function that reads a partition directory's value from its name (the job's, validate's,
#: retention's and erase's are the shared one in job/contract.py, imported as they import it).
PARSERS = (
    partition_dir_value,
    job_partition_dir_value,
    validate_partition_dir_value,
    retention_partition_dir_value,
    _component_value,
)
BOTH = pytest.mark.parametrize("prefix", ["cdc_partition=", "_cdc_partition="], ids=["new", "old"])


@BOTH
def test_every_parser_reads_the_value_of_either_name(prefix: str) -> None:
    name = f"{prefix}a%3Ab"
    for parse in PARSERS:
        assert parse(name) == "a:b", parse
    assert _is_partition_dir(name)


@pytest.mark.parametrize("name", ["part-0.parquet", "x_cdc_partition=a", "Cdc_partition=a", "__cdc_partition=a"])
def test_other_names_are_no_partition_directory(name: str) -> None:
    for parse in PARSERS:
        assert parse(name) is None, parse
    assert not _is_partition_dir(name)


@BOTH
def test_a_partition_directory_lies_in_its_version_directory(prefix: str) -> None:
    for kind in ("data", "tombstones", "index", "index-1a2b3c4d"):
        assert version_dir_of(f"{V1}/{kind}/{prefix}EU") == V1
        assert version_dir_of(f"{V1}/{kind}/{prefix}EU/") == V1


@BOTH
def test_erase_finds_the_partition_of_a_file_under_either_name(prefix: str) -> None:
    assert _partition_of(f"{V1}/data/{prefix}a%3Ab/part-0.parquet") == (f"{V1}/data/{prefix}a%3Ab", "a:b", False)
    assert _partition_of(f"{V1}/index/{prefix}EU/part-0.parquet") == (f"{V1}/index/{prefix}EU", "EU", True)
    assert _partition_of(f"{V1}/data/part-0.parquet") is None


@BOTH
def test_the_job_maps_the_partitions_it_wrote_under_either_name(prefix: str) -> None:
    files = [{"name": f"data/{prefix}EU/part-0.parquet"}, {"name": f"data/{prefix}a%3Ab/part-1.parquet"}]
    assert _written_partitions(files, f"{V1}/data") == {
        "EU": f"{V1}/data/{prefix}EU",
        "a:b": f"{V1}/data/{prefix}a%3Ab",
    }


def test_new_directories_are_named_without_the_leading_underscore() -> None:
    assert partition_dir_name("a:b") == "cdc_partition=a%3Ab"


@pytest.mark.parametrize("name", ["cdc_partition", "CDC_Partition"])
def test_a_new_column_named_like_the_directories_cannot_become_a_table_column(name: str) -> None:
    from cdc_compaction.core.schema import column_name_problem

    assert "reserved for the package" in (column_name_problem(name) or "")
    assert column_name_problem("cdc_partitions") is None
