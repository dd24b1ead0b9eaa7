"""The Jinja environment of the SQL templates in ``include/sql``: loading, quoting and literals, for any table or none.

:mod:`cdc_compaction.core.sql` renders a table's templates through its mode; this module knows no
table and no mode, so the mode interface (:mod:`cdc_compaction.core.mode`) can load its rule
macros without a cycle.
"""

from __future__ import annotations

import functools
from typing import Any

import jinja2

from cdc_compaction.core import settings
from cdc_compaction.core.identifiers import quote


def sql_literal(value: object) -> str:
    """A single-quoted SQL string literal with backslashes and quotes escaped."""
    s = str(value)
    if "\x00" in s:
        raise ValueError("NUL bytes cannot appear in SQL literals")
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(settings.SQL_DIR)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # SQL, not HTML: every value goes through q or lit instead
        trim_blocks=False,
        keep_trailing_newline=False,
    )
    env.filters["q"] = quote
    env.filters["lit"] = sql_literal
    return env


def template_module(name: str) -> Any:
    """The macros of template ``name`` (below ``include/sql``), callable from Python."""
    return _env().get_template(name).make_module({})
