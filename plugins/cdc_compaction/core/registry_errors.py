"""Where a registry mistake is, and how to fix it.

The registry (:mod:`cdc_compaction.core.registry`) validates plain data with pydantic, which knows
nothing of the YAML text the data came from. This module keeps that link: :func:`load_located`
parses a file into its data *and* the line and column of every key and value (refusing a key
written twice, which YAML would otherwise let the last one win silently), and :func:`explain`
turns pydantic's errors into ``file:line:column`` locations plus a hint that says what to do: a
did-you-mean for a misspelt field, value, type, preset or duration, and, for a field the author
did not write, where its value came from (the source preset, the database's defaults file, or
the field's own default).

It never imports :mod:`cdc_compaction.core.registry` at module level (that module imports this one);
the registry passes in what is needed (the model of the entry, the preset's values).
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from cdc_compaction.core.exceptions import RegistryError
from cdc_compaction.core.hive_types import hive_type_for

#: A path into a document, as pydantic's error ``loc`` names it: mapping keys and list indexes.
Path_ = tuple[Any, ...]
#: A position in a file: 1-based line and column (what editors and compilers print).
Pos = tuple[int, int]

_MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class Located:
    """One YAML document's data, with where each of its keys and values starts in ``file``."""

    file: str
    data: Any
    #: path -> position of the key that names it (mapping entries only).
    keys: dict[Path_, Pos] = field(default_factory=dict)
    #: path -> position of the value; ``()`` is the document itself.
    values: dict[Path_, Pos] = field(default_factory=dict)

    def at(self, pos: Pos) -> str:
        return f"{self.file}:{pos[0]}:{pos[1]}"

    def depth(self, path: Path_) -> int:
        """How many leading steps of ``path`` this document has (0: none, not even the first key)."""
        for n in range(len(path), 0, -1):
            if path[:n] in self.values:
                return n
        return 0

    def nearest(self, path: Path_, key: bool = False) -> str | None:
        """``file:line:col`` of ``path``'s key (``key``) or value, else of its nearest written parent."""
        if key and path in self.keys:
            return self.at(self.keys[path])
        for n in range(len(path), -1, -1):
            if path[:n] in self.values:
                return self.at(self.values[path[:n]])
        return None


def _pos(node: yaml.Node) -> Pos:
    return node.start_mark.line + 1, node.start_mark.column + 1


def dotted(path: Path_) -> str:
    return ".".join(str(p) for p in path)


def yaml_error(file: str, table: str | None, exc: yaml.YAMLError) -> RegistryError:
    """A YAML syntax error as a registry error at its line and column, naming the file (not ``<unicode string>``)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    context_mark = getattr(exc, "context_mark", None)
    text = f"not valid YAML: {problem}"
    if context:
        where = f" (line {context_mark.line + 1}, column {context_mark.column + 1})" if context_mark else ""
        text += f", {context}{where}"
    text += "; " + _yaml_hint(problem)
    location = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark is not None else None
    return RegistryError(file, table, [text], [location])


def _yaml_hint(problem: str) -> str:
    if "\\t" in problem or "tab" in problem:
        return "indent with spaces; YAML does not allow tabs"
    if "mapping values are not allowed" in problem:
        return "quote a value that contains ': ', or fix the indentation of this line"
    if "expected ',' or ']'" in problem or "expected ',' or '}'" in problem:
        return "close the [ ] or { } opened before, or quote the value"
    if "alias" in problem or "anchor" in problem:
        return "define the anchor (&name) before its alias (*name), or quote a value starting with '*' or '&'"
    return "check the indentation and quoting of this line and the one before it"


def load_located(text: str, file: str, loader_cls: Any) -> Located:
    """Parse one YAML document with ``loader_cls`` (a safe loader), keeping every key's and value's position.

    Refuses a key that a mapping holds twice (any level): YAML keeps the last one without a word,
    which silently drops the first value. A YAML syntax error names ``file``, its line and column.
    Raises :class:`RegistryError`.
    """
    loader = loader_cls(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.YAMLError as exc:
            raise yaml_error(file, None, exc) from exc
        doc = Located(file, None)
        if node is None:
            return doc
        problems: list[str] = []
        locations: list[str | None] = []

        def walk(n: yaml.Node, path: Path_, merged: bool) -> None:
            if isinstance(n, yaml.MappingNode):
                seen: dict[Any, Pos] = {}
                merges = []
                for knode, vnode in n.value:
                    if knode.tag == _MERGE_TAG:
                        merges.append(vnode)
                        continue
                    if not isinstance(knode, yaml.ScalarNode):
                        continue  # a complex key: construction refuses or keeps it; no field has one
                    key = loader.construct_object(knode)
                    try:
                        first = seen.get(key)
                    except TypeError:
                        continue
                    here = (*path, key)
                    if first is not None and not merged:
                        problems.append(
                            f"field '{dotted(here)}': set twice, on line {first[0]} and on line {_pos(knode)[0]}; "
                            "YAML would keep only the last value and drop the first without a word: "
                            "delete one of them"
                        )
                        locations.append(doc.at(_pos(knode)))
                    seen[key] = _pos(knode)
                    if merged and here in doc.values:
                        continue  # an explicit key wins over a merged one (YAML's merge rule)
                    doc.keys[here] = _pos(knode)
                    doc.values[here] = _pos(vnode)
                    walk(vnode, here, merged)
                for m in merges:  # ``<<: *defaults``: the merged keys sit at this path too
                    for target in m.value if isinstance(m, yaml.SequenceNode) else [m]:
                        walk(target, path, True)
            elif isinstance(n, yaml.SequenceNode):
                for i, item in enumerate(n.value):
                    doc.values[(*path, i)] = _pos(item)
                    walk(item, (*path, i), merged)

        doc.values[()] = _pos(node)
        walk(node, (), False)
        if problems:
            raise RegistryError(file, None, problems, locations)
        try:
            data = loader.construct_document(node)
        except yaml.YAMLError as exc:
            raise yaml_error(file, None, exc) from exc
        return Located(file, data, doc.keys, doc.values)
    finally:
        loader.dispose()


# -- hints -----------------------------------------------------------------------------------


def _close(word: str, choices: list[str], cutoff: float = 0.6) -> str | None:
    """The choice closest to ``word`` (case-insensitively), if one is close enough."""
    by_lower = {c.lower(): c for c in choices}
    found = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=cutoff)
    return by_lower[found[0]] if found else None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (through Optional, list[...], Annotated, dict values)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in get_args(annotation):
        out += _models_in(arg)
    return out


def model_at(root: type[BaseModel] | None, path: Path_) -> type[BaseModel] | None:
    """The model that validates the mapping at ``path`` under ``root`` (None: not a model there)."""
    cls = root
    for step in path:
        if cls is None:
            return None
        if isinstance(step, int):
            continue  # a list item: the list's item model was already chosen by the field
        info = cls.model_fields.get(str(step))
        if info is None:
            return None
        models = _models_in(info.annotation)
        cls = models[0] if models else None
    return cls


#: Other systems' names of registry fields (Hudi, Delta, Iceberg, dbt, Airflow, the sinks' configs), by the
#: field they stand for: offered before the nearest spelling, which for these is a different field
#: (``key`` is not ``old_key``, ``location`` not ``compaction``, ``schema`` not ``schema_changes``).
_FIELD_SYNONYMS: dict[str, tuple[str, ...]] = {
    "primary_key": (
        "pk", "key", "keys", "primary_keys", "key_columns", "primary_key_columns", "record_key", "recordkey",
        "record_key_field", "unique_key", "merge_key", "id_columns",
    ),
    "order_by": (
        "precombine_field", "precombine", "ordering_field", "ordering_fields", "sequence_by", "sequence_column",
        "sequence_field", "version_column", "order_column", "sort_by", "sort_key", "ordering",
    ),
    "storage_root": (
        "location", "path", "root", "base_path", "table_path", "lake_path", "s3_path", "storage_path",
        "storage_location",
    ),
    "columns": ("schema", "fields", "cols", "column_list"),
    "partition_by": (
        "partitioned_by", "partition", "partitions", "partition_key", "partition_keys", "partition_column",
        "partition_columns", "partition_field",
    ),
    "schedule": ("cron", "schedule_interval", "interval", "timetable"),
    "database": ("db", "database_name", "schema_name", "namespace"),
    "table": ("table_name", "tbl"),
    "name": ("column", "col", "field", "column_name", "field_name"),
    "type": ("data_type", "datatype", "dtype", "type_name", "column_type", "hive_type"),
    "comment": ("description", "doc", "comments"),
}  # fmt: skip
_FIELD_FOR = {alias: name for name, aliases in _FIELD_SYNONYMS.items() for alias in aliases}


def _field_synonym(key: str, fields: list[str] | set[str]) -> str | None:
    """The field another system's name ``key`` stands for, if the model at hand has that field (and not ``key``)."""
    meant = _FIELD_FOR.get(key.lower())
    return meant if meant in fields and key not in fields else None


#: Spellings whose meaning depends on the system: the suggestion says which one it assumed.
_TYPE_NOTES = {"int8": "PostgreSQL's int8 is 8 bytes; for Arrow's 1-byte int8, tinyint is enough"}

#: A duration written with a unit word or several parts (5min, 1h30m): what the registry accepts instead.
_DURATION_PART = re.compile(
    r"(\d+)\s*(weeks?|wks?|w|days?|d|hours?|hrs?|h|minutes?|mins?|m|seconds?|secs?|s)", re.IGNORECASE
)
_UNIT_SECONDS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}
DURATION_FORMS = (
    "a number and one unit (s, m, h, d or w: 90s, 5m, 36h, 7d, 2w; m is minutes), "
    "a number of seconds without quotes (300), or ISO 8601 (PT1H30M)"
)


def duration_suggestion(value: Any) -> str | None:
    """The registry notation of a duration written otherwise (``5min`` -> ``5m``, ``1h30m`` -> ``90m``)."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text.isdigit():
        return text  # a quoted number of seconds
    parts = list(_DURATION_PART.finditer(text))
    if not parts or "".join(p.group(0) for p in parts).replace(" ", "") != text.replace(" ", ""):
        return None
    seconds = 0
    for p in parts:
        unit = p.group(2).lower()
        short = "m" if unit.startswith("mi") or unit == "m" else unit[0]
        seconds += int(p.group(1)) * _UNIT_SECONDS[short]
    for unit in ("w", "d", "h", "m"):
        if seconds and seconds % _UNIT_SECONDS[unit] == 0:
            return f"{seconds // _UNIT_SECONDS[unit]}{unit}"
    return f"{seconds}s"


@dataclass(frozen=True)
class Context:
    """What :func:`explain` knows about the entry besides its errors."""

    #: The table file (or the defaults file, when explaining that).
    doc: Located
    #: The model the document is validated as (None: unknown, e.g. a bad mode).
    model: type[BaseModel] | None
    #: The other table modes' models, by mode: a field of another mode is named as such.
    other_models: Mapping[str, type[BaseModel]] = field(default_factory=dict)
    #: The database's defaults file, merged under the table's document.
    defaults: Located | None = None
    #: The fields the entry's ``source`` preset filled in, and the preset's name.
    preset: Mapping[str, Any] = field(default_factory=dict)
    source: str | None = None
    #: Hive types and schedule presets the registry accepts (for did-you-mean).
    hive_types: tuple[str, ...] = ()
    schedule_presets: tuple[str, ...] = ()
    #: Names of the table modes, the tags pydantic puts first in a mode's error locations.
    modes: tuple[str, ...] = ()


_FIELD = re.compile(r"^field '([^']*)': ")
_DOTTED_PREFIX = re.compile(r"^(\w+(?:\.\w+)+): ")
_NESTED_FIELD = re.compile(r"^field '(\w+)': ")


def explain(err: ValidationError, problems: list[str], ctx: Context) -> tuple[list[str], list[str | None]]:
    """``problems`` (pydantic's errors as the registry words them, one per error) with a hint each,
    and the ``file:line:col`` of each."""
    out: list[str] = []
    locations: list[str | None] = []
    errors = err.errors()
    cut = _cut_types(errors)
    for i, (e, problem) in enumerate(zip(errors, problems, strict=False)):
        if i in cut.values():
            continue  # the tail of a type cut at its comma: said with the type's own error
        path: Path_ = tuple(e["loc"])
        if path and path[0] in ctx.modes:
            path = path[1:]
        named = _FIELD.match(problem)
        msg = problem[named.end() :] if named else problem
        if not path and named and named.group(1) != "(entry)":
            path = (named.group(1),)  # a cross-field check, located by the field its message starts with
        if not path and (m := _DOTTED_PREFIX.match(msg)):
            path = tuple(int(p) if p.isdigit() else p for p in m.group(1).split("."))
        if (m := _NESTED_FIELD.match(e["msg"].removeprefix("Value error, "))) and path:
            path = (*path, m.group(1))  # a nested model's cross-field check names its own field
        if i in cut:
            whole = f"{e['input']},{str(errors[cut[i]]['loc'][-1]).strip()}"
            better = hive_type_for(whole) or re.sub(r"\s+", "", whole.lower())
            named_field = named.group(0) if named else ""
            out.append(
                f"{named_field}YAML ended the value at the unquoted comma inside {{ }}, leaving {e['input']!r} and a "
                f"key {errors[cut[i]]['loc'][-1]!r}; quote the type: type: '{better}'"
            )
            locations.append(ctx.doc.nearest(path))
            continue
        hint, location = _hint(e, path, msg, ctx)
        if e["type"] == "time_delta_parsing":  # pydantic's words ("day" identifier ...) say nothing to an author
            problem = problem.replace(e["msg"], f"{e.get('input')!r} is not a duration", 1)
        out.append(f"{problem}; {hint}" if hint else problem)
        locations.append(location)
    return out, locations


#: A type YAML cut at an unquoted comma inside ``{ }`` (``type: decimal(12,2)``): ``decimal(12``, and a key ``2)``.
_CUT_TYPE = re.compile(r"^[a-z_][a-z0-9_ ]*\(\s*\d+\s*$", re.IGNORECASE)
_CUT_TAIL = re.compile(r"^\s*\d+\s*\)\s*$")


def _cut_types(errors: list[Any]) -> dict[int, int]:
    """``index of a type's error -> index of the extra key error of its tail``, for each type that YAML cut
    at a comma in a flow mapping: one mistake, which pydantic sees as two unrelated ones."""
    tails = {
        tuple(e["loc"]): i
        for i, e in enumerate(errors)
        if e["type"] == "extra_forbidden" and e["loc"] and _CUT_TAIL.match(str(e["loc"][-1]))
    }
    found: dict[int, int] = {}
    for i, e in enumerate(errors):
        loc = tuple(e["loc"])
        if loc and loc[-1] == "type" and isinstance(e.get("input"), str) and _CUT_TYPE.match(e["input"]):
            tail = next((j for t, j in tails.items() if t[:-1] == loc[:-1] and j not in found.values()), None)
            if tail is not None:
                found[i] = tail
    return found


def _hint(e: Any, path: Path_, msg: str, ctx: Context) -> tuple[str | None, str | None]:
    """(what to do, where) for one pydantic error at ``path``."""
    doc, kind = ctx.doc, e["type"]
    own_depth = doc.depth(path)
    default_depth = ctx.defaults.depth(path) if ctx.defaults is not None else 0
    # A value that came from the defaults file is located there (the table's own value wins a tie).
    src = ctx.defaults if ctx.defaults is not None and default_depth > own_depth else doc
    location = src.nearest(path, key=kind == "extra_forbidden")
    if kind == "extra_forbidden" and path:
        return _unknown_field(path, src, ctx), location
    if kind == "missing" and path:
        return _missing_field(path, ctx)
    if kind == "time_delta_parsing" or ("duration" in msg and "such as" in msg):
        better = duration_suggestion(e.get("input"))
        hint = f"write a duration as {DURATION_FORMS}"
        if better is not None and better.isdigit():
            return f"did you mean {better} (a number of seconds: no quotes)? {hint}", location
        return (f"did you mean {better!r}? {hint}" if better else hint), location
    if kind == "literal_error":
        expected = re.findall(r"'([^']*)'", str((e.get("ctx") or {}).get("expected", "")))
        near = _close(str(e.get("input")), expected, 0.5)
        return (f"did you mean {near!r}?" if near else None), location
    if kind == "unknown_mode":
        mode = doc.data.get("mode") if isinstance(doc.data, dict) else None
        near = _close(str(mode), list(ctx.modes), 0.5)
        return (f"did you mean mode: {near}?" if near else "leave mode out for cdc"), doc.nearest(("mode",))
    if "unknown Hive type" in msg:
        typed = str(e.get("input", "")).strip().lower()
        near = hive_type_for(typed) or _close(typed, list(ctx.hive_types), 0.5)
        note = f" ({_TYPE_NOTES[typed]})" if typed in _TYPE_NOTES else ""
        return (f"did you mean {near!r}?{note}" if near else None), location
    if "neither a cron expression nor" in msg:
        near = _close(str(e.get("input", "")), list(ctx.schedule_presets), 0.6)
        return (f"did you mean {near!r}?" if near else "write a cron expression such as '0 * * * *'"), location
    near_column = _close_column(msg)
    if path and own_depth == 0 and default_depth == 0 and isinstance(path[0], str):
        return _default_origin(path[0], ctx, near_column)
    if near_column:
        return f"did you mean {near_column!r}?", location
    return None, location


_NOT_AMONG = re.compile(r"^(.*?)not among the columns (\[.*\])$", re.DOTALL)


def _close_column(msg: str) -> str | None:
    """For "'x' is not among the columns [...]": the declared column closest to the name written."""
    m = _NOT_AMONG.match(msg.split("; ")[0])
    if not m:
        return None
    try:
        columns = [str(c) for c in ast.literal_eval(m.group(2))]
    except (ValueError, SyntaxError):
        return None
    for name in re.findall(r"'([^']*)'", m.group(1)):
        near = _close(name, columns, 0.6)
        if near is not None:
            return near
    return None


def _unknown_field(path: Path_, src: Located, ctx: Context) -> str:
    key, parent = str(path[-1]), path[:-1]
    model = model_at(ctx.model, parent)
    fields = list(model.model_fields) if model is not None else []
    near = _field_synonym(key, fields) or _close(key, fields)
    if near is not None:
        return f"did you mean {near!r}? rename the key to {near}"
    if not parent:
        for mode, other in ctx.other_models.items():
            if other is not ctx.model and key in other.model_fields:
                return f"{key} is a field of mode: {mode} tables only; remove it, or set mode: {mode}"
    if fields and parent:
        return f"remove it; {dotted(parent)} takes {', '.join(fields)}"
    return "remove it (`cdc-compaction registry schema` lists every field)"


def _missing_field(path: Path_, ctx: Context) -> tuple[str, str | None]:
    name, parent = str(path[-1]), path[:-1]
    doc = ctx.doc
    written = _mapping_at(doc.data, parent)
    model = model_at(ctx.model, parent)
    known = set(model.model_fields) if model is not None else set()
    for key in written:
        if isinstance(key, str) and key not in known and name in (_close(key, [name]), _field_synonym(key, known)):
            # Located at the misspelt key: that is the line to change.
            line = doc.keys.get((*parent, key), (0, 0))[0]
            hint = f"line {line} has {key!r}: did you mean {name}? rename the key to {name}"
            return hint, doc.nearest((*parent, key), key=True)
    return f"add {name}: to {'the file' if not parent else dotted(parent)}", doc.nearest(parent)


def _mapping_at(data: Any, path: Path_) -> dict[Any, Any]:
    for step in path:
        try:
            data = data[step]
        except (KeyError, IndexError, TypeError):
            return {}
    return data if isinstance(data, dict) else {}


def _default_origin(name: str, ctx: Context, near: str | None = None) -> tuple[str | None, str | None]:
    """A field the author did not write: where its value came from, and where to look.

    ``near``: a declared column close to the chosen one, offered as the value to write.
    """
    doc = ctx.doc
    value_text = near if near is not None else "<value>"
    if name in ctx.preset and ctx.source:
        # The preset is chosen in the table's file, or else in its database's defaults file.
        src = doc if ("source",) in doc.values or ctx.defaults is None else ctx.defaults
        where = src.nearest(("source",))
        line = src.values.get(("source",), (0, 0))[0]
        on = f" (line {line}{'' if src is doc else ' of ' + src.file})" if line else ""
        return (
            f"{name} is not set in this file: the source: {ctx.source} preset{on} chose {ctx.preset[name]!r}; "
            f"add `{name}: {value_text}` to override the preset"
        ), where
    model = ctx.model
    info = model.model_fields.get(name) if model is not None else None
    if info is not None and not info.is_required():
        value = info.get_default(call_default_factory=True)
        value = value.model_dump() if isinstance(value, BaseModel) else value
        return (
            f"{name} is not set in this file, so it took its default {value!r}; add `{name}: {value_text}` to the file"
        ), doc.nearest(())
    return None, doc.nearest(())
