"""The registry's JSON Schema, generated from its pydantic models (``registry schema``).

Editors that speak JSON Schema (VS Code and others through yaml-language-server) complete and
check registry files with it; the repository ships it as ``registry.schema.json``
(docs, "Editor support"). The schema is the models' own (pydantic), with three additions:

* descriptions: a field's ``Field(description=...)``, else its ``#:`` comment lines right above
  it in the model's source, else a docstring right below it (the comments the registry already
  has become what an editor shows on hover);
* the table modes chosen by ``mode`` (``cdc`` when absent) with ``if``/``then``/``else``, which
  editors follow, where pydantic's callable discriminator leaves a plain ``oneOf``;
* defaults written as a registry file would write them (``5m``, not ISO 8601's ``PT5M``).

The registry loader stays the authority: the schema helps while typing, ``registry validate``
decides (cross-field rules such as "the key is among the columns" are not in the schema).
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import sys
import textwrap
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema

from cdc_compaction.core import registry
from cdc_compaction.core.docs import doc_ref
from cdc_compaction.core.mode import table_modes

_UNITS = (("d", 86400), ("h", 3600), ("m", 60))


def duration_text(value: timedelta) -> str:
    """A duration as the registry writes it: the largest unit that divides it (``timedelta(hours=1)`` -> ``1h``)."""
    seconds = int(value.total_seconds())
    for unit, size in _UNITS:
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


class _RegistrySchema(GenerateJsonSchema):
    """pydantic's generator, with durations' defaults in the registry's own notation."""

    def encode_default(self, dft: Any) -> Any:
        if isinstance(dft, timedelta):
            return duration_text(dft)
        return super().encode_default(dft)


def _model_modules() -> set[str]:
    """The modules defining registry models: the registry's and every mode's."""
    return {registry.__name__, *(model.__module__ for model in registry.mode_models().values())}


def _models() -> dict[str, type[BaseModel]]:
    """The registry's models by class name (the ``$defs`` keys pydantic writes)."""
    modules = _model_modules()
    return {
        name: obj
        for module in modules
        for name, obj in vars(sys.modules[module]).items()
        if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ in modules
    }


@functools.cache
def _source_docs(model: type[BaseModel]) -> dict[str, str]:
    """``field -> text`` from ``#:`` comment lines above a field, or a string literal below it, in ``model``'s body."""
    try:
        source = textwrap.dedent(inspect.getsource(model))
    except (OSError, TypeError):  # no source (a zipped or compiled install): descriptions are a nicety
        return {}
    lines = source.splitlines()
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    docs: dict[str, str] = {}
    statements = body.body
    for i, node in enumerate(statements):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        comment: list[str] = []
        row = node.lineno - 2  # the line above, 0-based
        while row >= 0 and lines[row].strip().startswith("#:"):
            comment.insert(0, lines[row].strip()[2:].strip())
            row -= 1
        following = statements[i + 1] if i + 1 < len(statements) else None
        if comment:
            docs[node.target.id] = " ".join(comment)
        elif (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(following.value.value)
    return docs


def _field_docs(model: type[BaseModel]) -> dict[str, str]:
    """Descriptions of ``model``'s fields, inherited ones included (the nearest class that documents one wins)."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if isinstance(cls, type) and issubclass(cls, BaseModel) and cls.__module__ in _model_modules():
            docs.update(_source_docs(cls))
    return docs


def _describe(defs: dict[str, Any]) -> None:
    models = _models()
    for name, definition in defs.items():
        model = models.get(name)
        if model is None:
            continue
        docs = _field_docs(model)
        for field, prop in definition.get("properties", {}).items():
            if "description" not in prop and field in docs:
                prop["description"] = docs[field]


def _mode_is(mode: str) -> dict[str, Any]:
    return {"properties": {"mode": {"const": mode}}, "required": ["mode"]}


def registry_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one registry file, ``<database>.<table>.yaml``."""
    generated = registry._table_adapter().json_schema(schema_generator=_RegistrySchema)
    defs = generated["$defs"]
    _describe(defs)
    models = registry.mode_models()
    default = next(iter(models))
    choice: dict[str, Any] = {"$ref": f"#/$defs/{models[default].__name__}"}
    for mode in reversed([m for m in models if m != default]):
        choice = {"if": _mode_is(mode), "then": {"$ref": f"#/$defs/{models[mode].__name__}"}, "else": choice}
    kinds = ", ".join(f"{mode} ({table_modes()[mode].summary})" for mode in models)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "cdc-compaction registry entry",
        "description": f"One table of the cdc-compaction registry: <database>.<table>.yaml "
        f"({doc_ref('registry', 'field-reference')}). Its mode picks the fields it takes; cdc when absent.",
        "type": "object",
        "properties": {
            "mode": {
                "enum": list(models),
                "default": default,
                "description": f"The table mode ({doc_ref('concepts', 'table-modes')}): {kinds}.",
            }
        },
        **choice,
        "$defs": defs,
    }


def schema_text() -> str:
    """The schema as the shipped ``registry.schema.json`` holds it (stable key order, trailing newline)."""
    return json.dumps(registry_schema(), indent=2, ensure_ascii=False) + "\n"
