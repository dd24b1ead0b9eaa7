"""How a plan sizes the output files (README, "Registry fields": ``spark.target_file_mb``).

"The job merges its output into ceil(input bytes / target) files and caps any file at
twice the target's rows", the rows estimated from the input's bytes per row.  Pure: no
storage, no Spark.
"""

from __future__ import annotations

import pytest

from cdc_compaction.pipeline.plan import sizing

MB = 2**20


@pytest.mark.parametrize(
    ("size", "files"),
    [
        pytest.param(1, 1, id="one-byte"),
        pytest.param(128 * MB, 1, id="exactly-the-target"),
        pytest.param(128 * MB + 1, 2, id="a-byte-over"),
        pytest.param(1000 * MB, 8, id="1000MB-in-128MB-files"),
    ],
)
def test_as_many_files_as_the_target_size_needs(size: int, files: int) -> None:
    assert sizing(size, 10_000, 128 * MB)["output_files"] == files


def test_a_file_holds_at_most_the_rows_of_twice_the_target() -> None:
    # 100 bytes a row: a 128 MB target holds 1,342,177 rows, twice that is the cap.
    rows = 5_000_000
    cap = sizing(rows * 100, rows, 128 * MB)["max_records_per_file"]
    assert cap == (2 * 128 * MB) // 100
    # A tiny table: the cap is still what twice the target would hold, never below one row.
    assert sizing(10 * 100, 10, 128 * MB)["max_records_per_file"] == (2 * 128 * MB) // 100
    assert sizing(10 * 1024 * MB, 1, 1 * MB)["max_records_per_file"] == 1


def test_no_rows_or_no_bytes_to_go_by_gives_one_file_without_a_cap() -> None:
    assert sizing(0, 0, 128 * MB) == {"output_files": 1, "max_records_per_file": 0}
    assert sizing(5 * MB, 0, 128 * MB) == {"output_files": 1, "max_records_per_file": 0}
    assert sizing(0, 7, 128 * MB) == {"output_files": 1, "max_records_per_file": 0}
