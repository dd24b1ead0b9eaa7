"""The KRaft cluster id the Debezium stack formats Kafka's storage with.

A clean-clone CI run failed once in 64 starts: ``base64`` of 16 random bytes starts with ``-``
when the first six bits are ``111110``, and ``kafka-storage format -t -x…`` reads the id as an option
("argument --cluster-id/-t: expected one argument").  Kafka's own ``Uuid.randomUuid`` draws again
in that case; so does :func:`kafka_cluster_id`.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_compaction.devtools import jars
from cdc_compaction.devtools.debezium import format_kafka_storage, kafka_cluster_id, kafka_server_properties
from cdc_compaction.devtools.local_services import ServiceError

# 0xF8 = 0b11111000: the first base64 character is index 62, which the URL-safe alphabet writes as ``-``.
_DASH_FIRST = bytes([0xF8]) + bytes(15)
_UNDERSCORE_FIRST = bytes([0xFC]) + bytes(15)  # index 63: ``_``, an ordinary first character for the CLI


def _draws(*values: bytes) -> Iterator[bytes]:
    yield from values


def test_an_id_that_would_start_with_a_dash_is_drawn_again() -> None:
    draws = _draws(_DASH_FIRST, _DASH_FIRST, _UNDERSCORE_FIRST)
    cluster_id = kafka_cluster_id(lambda: next(draws))
    assert cluster_id == base64.urlsafe_b64encode(_UNDERSCORE_FIRST).decode().rstrip("=")
    assert next(draws, None) is None, "a draw was skipped or taken twice"


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=16, max_size=16))
def test_every_id_is_22_url_safe_characters_that_do_not_start_with_a_dash(raw: bytes) -> None:
    draws = _draws(raw, _UNDERSCORE_FIRST)
    cluster_id = kafka_cluster_id(lambda: next(draws))
    assert len(cluster_id) == 22
    assert not cluster_id.startswith("-")
    assert set(cluster_id) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    # Reference: the id is the draw itself, in base64, unless the draw's text starts with a dash.
    expected_raw = _UNDERSCORE_FIRST if raw[0] >> 2 == 62 else raw
    assert base64.urlsafe_b64decode(cluster_id + "==") == expected_raw


@pytest.mark.slow
@pytest.mark.skipif(
    not jars.is_current(jars.jars_dir()), reason="the jars of jars.lock are not cached: run `make jars`"
)
@pytest.mark.parametrize("raw", [_UNDERSCORE_FIRST, bytes(range(16))], ids=["underscore_first", "plain"])
def test_kafka_formats_its_storage_with_the_id(tmp_path: Path, raw: bytes) -> None:
    """The real ``kafka-storage format`` takes the id and writes it to ``meta.properties``."""
    cluster_id = kafka_cluster_id(lambda: raw)
    config = tmp_path / "server.properties"
    properties = kafka_server_properties(tmp_path / "data", 9092, 9093)
    config.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
    format_kafka_storage(jars.classpath("kafka"), config, cluster_id)
    meta = (tmp_path / "data" / "meta.properties").read_text()
    assert f"cluster.id={cluster_id}\n" in meta


@pytest.mark.slow
@pytest.mark.skipif(
    not jars.is_current(jars.jars_dir()), reason="the jars of jars.lock are not cached: run `make jars`"
)
def test_a_refused_format_names_kafkas_reason(tmp_path: Path) -> None:
    config = tmp_path / "server.properties"
    config.write_text("process.roles=broker,controller\n")  # no node.id, no listeners: Kafka refuses it
    with pytest.raises(ServiceError, match=r"formatting Kafka's storage failed \(exit \d+\)"):
        format_kafka_storage(jars.classpath("kafka"), config, kafka_cluster_id())
    assert (tmp_path / "format.log").read_text().strip()
