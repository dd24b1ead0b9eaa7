"""The landing consumer's layout rules, without Kafka (tests/integrations/test_debezium_stack.py runs it for real)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_compaction.devtools import kafka_landing as kl


def test_file_names_carry_topic_partition_and_first_offset() -> None:
    assert kl.file_name("cdc.public.accounts", 3, 42) == "cdc.public.accounts+3+0000000042.json"
    assert kl.parse_file_name("cdc.public.accounts+3+0000000042.json") == ("cdc.public.accounts", 3, 42)


def test_the_hour_is_the_records_kafka_time_in_utc(tmp_path: Path) -> None:
    route = kl.Route("t", tmp_path, prefix="increment_", time_format="%Y%m%d%H")
    # 2026-11-22 10:59:59.999 UTC and 11:00:00.000 UTC
    assert route.increment(1_795_345_199_999) == "increment_2026112210"
    assert route.increment(1_795_345_200_000) == "increment_2026112211"


def test_a_tombstone_is_the_line_null_and_a_value_with_a_line_break_is_refused() -> None:
    assert kl._line("t", 0, 7, None) == b"null"
    assert kl._line("t", 0, 7, b'{"op":"c"}') == b'{"op":"c"}'
    with pytest.raises(kl.LandingError, match=r"t partition 0 offset 7: the value holds a line break"):
        kl._line("t", 0, 7, b'{\n"op":"c"}')


def test_files_appear_whole_under_their_name(tmp_path: Path) -> None:
    path = tmp_path / "increment_2026112210" / kl.file_name("t", 0, 0)
    kl.write_atomically(path, kl.write_lines([b"null", b'{"op":"d"}']))
    assert path.read_bytes() == b'null\n{"op":"d"}\n'
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
