"""Fixtures every mode's scenario tests share."""

from __future__ import annotations

from typing import Any

import pytest

from cdc_compaction.devtools import conformance as conf


@pytest.fixture(scope="module")
def readers(spark: Any) -> list[conf.Reader | conf.DuckDBReader]:
    """The readers a scenario's expectations are checked through: Spark over the metastore, DuckDB over the files."""
    return [conf.Reader(spark), conf.DuckDBReader()]
