"""MkDocs hook: the docs site's reference sections, generated from the code at build time.

Written once, in the code: the registry's fields come from its JSON Schema (which
:mod:`cdc_compaction.core.registry_schema` generates from the pydantic models), the commands from the
CLI's own argparse parser (:func:`cdc_compaction.cli.main.build_parser`).  A page asks for one with
a marker line, replaced here before the page is rendered:

* ``<!-- generated: registry-fields -->``: every field of every table mode and nested setting;
* ``<!-- generated: commands -->``: ``cdc-compaction <command> --help`` of every command;
* ``<!-- generated: jars-lock -->``: the jars of ``jars.lock`` (``make jars``), group by group;
* ``<!-- generated: jars-lock-s3a -->``: its ``s3a`` group only (Spark's S3A connector);
* ``<!-- generated: debezium-config -->``: the Debezium stack's Kafka, Connect and connector
  configuration, as :mod:`cdc_compaction.devtools.debezium` writes and sends it;
* ``<!-- generated: debezium-truth -->``: the PostgreSQL-truth test through Debezium
  (``tests/e2e/test_debezium_truth.py``): its tables, connector, landing routes and registry entries,
  from ``tests/e2e/truth_workload.py`` (which the test takes them from);
* ``<!-- generated: table-modes -->``: every table mode the code has, with its summary;
* ``<!-- generated: bench-targets -->``: the targets table of the last ``make bench`` run
  (``bench/results/RESULTS.md``, which ``bench/report.py`` writes), with the run's provenance.

The hook also publishes the benchmark results the benchmarks page shows (``bench/results/``).
``tests/e2e/test_docs.py`` checks the generated text against the schema and the CLI independently.
"""

from __future__ import annotations

import argparse
import html
import itertools
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "plugins") not in sys.path:  # `mkdocs build` from a clone without make install
    sys.path.insert(0, str(REPO / "plugins"))

MARKER = re.compile(r"^<!-- generated: ([a-z0-9-]+) -->$", re.MULTILINE)
#: Files of the repository the pages link to or show, published beside the pages.
PUBLISHED = ("bench/results/RESULTS.md", "bench/results/compaction.png", "bench/results/scaling.png")


#: Sections the models' descriptions name that are no heading of their own on the site.
SECTION_ALIASES = {"Table registry reference": "Registry"}
SECTION_REF = re.compile(r'(?:docs|README), "([^"]+)"')
#: A section cited as messages cite it (``cdc_compaction.core.docs.doc_ref``): ``docs/<page>.md#<anchor>``.
DOC_REF = re.compile(r"\bdocs/([a-z0-9-]+\.md(?:#[a-z0-9_-]+)?)")


def _modes() -> dict[str, str]:
    """The table modes' model names, in the order the page shows them (``mode`` picks one): as the code finds them."""
    from cdc_compaction.core.registry import mode_models

    return {mode: model.__name__ for mode, model in mode_models().items()}


def _headings() -> dict[str, str]:
    """``heading text -> page.md#anchor`` of every heading of the site's pages (code blocks skipped)."""
    from markdown.extensions.toc import slugify

    found: dict[str, str] = {}
    for page in sorted((REPO / "docs").glob("*.md")):
        fenced = False
        for line in page.read_text().splitlines():
            if line.startswith("```"):
                fenced = not fenced
            elif not fenced and re.match(r"#{1,6} ", line):
                text = line.lstrip("#").strip()
                plain = text.replace("`", "")
                found.setdefault(plain, f"{page.name}#{slugify(html.escape(plain), '-')}")
    return found


def _section_link(name: str, headings: dict[str, str]) -> str:
    """A link to the site's section a description names (``docs, "Doctor"``): the first heading starting so."""
    wanted = SECTION_ALIASES.get(name, name)
    for text, target in headings.items():
        if text.lower().startswith(wanted.lower()):
            return f"[{name}]({target})"
    raise ValueError(f"a registry description names the section {name!r}, which no page of docs/ has a heading for")


def _text(value: str, headings: dict[str, str] | None = None) -> str:
    """Markdown for a schema text in a table cell: HTML escaped outside code spans, pipes escaped,
    the sections it names (``docs, "Doctor"``) linked to the site's pages."""
    parts = re.split(r"(``?[^`]+``?)", value)
    out = []
    for part in parts:
        if part.startswith("`"):
            out.append("`" + part.strip("`") + "`")
        else:
            escaped = html.escape(part, quote=False)
            if headings is not None:
                escaped = SECTION_REF.sub(lambda m: "see " + _section_link(m.group(1), headings), escaped)
                escaped = DOC_REF.sub(lambda m: f"[{m.group(0)}]({m.group(1)})", escaped)
            out.append(escaped)
    return " ".join("".join(out).split()).replace("|", "\\|")


def _type(prop: dict[str, Any]) -> str:
    """A field's type in words: ``string``, ``list of Column``, ``cdc | keyless``, ``Alerts``."""
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "enum" in prop:
        return " \\| ".join(f"`{v}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    for key in ("anyOf", "oneOf"):
        if key in prop:
            kinds = [_type(p) for p in prop[key] if p.get("type") != "null"]
            nullable = any(p.get("type") == "null" for p in prop[key])
            return " or ".join(dict.fromkeys(kinds)) + (" or null" if nullable else "")
    kind = prop.get("type")
    if kind == "array":
        return "list of " + _type(prop.get("items", {}))
    if kind == "object":
        extra = prop.get("additionalProperties")
        return "mapping" + (f" to {_type(extra)}" if isinstance(extra, dict) and extra else "")
    if isinstance(kind, list):
        return " or ".join(kind)
    return kind or "any"


def _default(prop: dict[str, Any], required: bool) -> str:
    if required:
        return "required"
    if "default" not in prop:
        return ""
    value = prop["default"]
    return f"`{value}`" if isinstance(value, str) and value else "`" + json.dumps(value, ensure_ascii=False) + "`"


def _fields_table(definition: dict[str, Any], headings: dict[str, str]) -> list[str]:
    required = set(definition.get("required", []))
    rows = ["| field | type | default | description |", "|---|---|---|---|"]
    for field, prop in definition.get("properties", {}).items():
        text = _text(prop.get("description", ""), headings)
        rows.append(f"| `{field}` | {_type(prop)} | {_default(prop, field in required)} | {text} |")
    return rows


def registry_fields(schema: dict[str, Any]) -> str:
    """Every field of the registry, from its JSON Schema: one table per mode, then one per nested setting."""
    defs = schema["$defs"]
    headings = _headings()
    lines: list[str] = [
        "Generated from the registry's JSON Schema (`cdc-compaction registry schema`, the pydantic models'",
        "own). `mode` picks the fields a file takes; the nested settings follow the modes.",
        "",
    ]
    modes = _modes()
    for mode, name in modes.items():
        lines += [f"### {name}", "", f"`mode: {mode}`" + (" (or no `mode`)" if mode == "cdc" else "") + ".", ""]
        lines += [*_fields_table(defs[name], headings), ""]
    for name in sorted(set(defs) - set(modes.values())):
        definition = defs[name]
        lines += [f"### {name}", ""]
        if definition.get("description"):
            lines += [_text(definition["description"], headings), ""]
        lines += [*_fields_table(definition, headings), ""]
    return "\n".join(lines)


def table_modes() -> str:
    """One line per table mode, as the code finds them (``mode_models``), with its summary (``TableMode.summary``)."""
    from cdc_compaction.core.mode import table_modes as modes

    lines = []
    for i, mode in enumerate(_modes()):
        default = " (the default: no `mode`)" if i == 0 else ""
        lines.append(f"- `mode: {mode}`{default}: {modes()[mode].summary}")
    return "\n".join(lines)


def _subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """``(command words, parser)`` of every leaf command, depth first, in the parser's order."""
    found: list[tuple[tuple[str, ...], Any]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = _subcommands(sub, (*path, name))
                found += nested or [((*path, name), sub)]
    return found


def commands() -> str:
    """``--help`` of every command, as the CLI prints it (100 columns)."""
    from cdc_compaction.cli.main import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps at $COLUMNS: the same text on every machine
    parser = build_parser("cdc-compaction")
    lines: list[str] = []
    for words, sub in _subcommands(parser):
        lines += [f"### {' '.join(words)}", "", "```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(lines)


def _layers() -> list[str]:
    """The package's layers, top first, as the import-linter contract in pyproject.toml declares them."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    found = [c["layers"] for c in config["contracts"] if c["type"] == "layers"]
    if len(found) != 1:
        raise ValueError("pyproject.toml: expected one import-linter contract of type layers")
    return list(found[0])


def _summary(path: Path) -> str:
    """The first line of a module's (or a package's ``__init__``) docstring."""
    import ast

    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return doc.strip().split("\n")[0]


def _modules(package_dir: Path) -> list[tuple[str, str]]:
    """``(path below the package, summary)`` of every module and subpackage under ``package_dir``, sorted."""
    out: list[tuple[str, str]] = []
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir)
        if "__pycache__" in rel.parts:
            continue
        if path.name == "__init__.py":
            if rel.parent != Path("."):
                out.append((f"{rel.parent.as_posix()}/", _summary(path)))
        else:
            out.append((rel.as_posix(), _summary(path)))
    return out


def contracts() -> str:
    """The import contracts ``lint-imports`` checks in ``make test``, by name, as pyproject.toml declares them."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return "\n".join(f"- {c['name']} (`{c['type']}`)" for c in config["contracts"])


def layers_diagram() -> str:
    """A mermaid picture of the layers (top imports down, never up), with each layer's modules."""
    lines = ["```mermaid", "flowchart TB"]
    names = [layer.rsplit(".", 1)[-1] for layer in _layers()]
    package = REPO / "plugins" / "cdc_compaction"
    for name in names:
        modules = [p for p, _ in _modules(package / name) if "/" not in p.rstrip("/")]
        shown = ", ".join(m.removesuffix(".py").rstrip("/") for m in modules)
        lines.append(f'    {name}["<b>{name}/</b><br/>{html.escape(shown)}"]')
    lines += [f"    {a} --> {b}" for a, b in itertools.pairwise(names)]
    lines.append("```")
    return "\n".join(lines)


def package_map() -> str:
    """Every module of the package, by layer, with the first line of its docstring."""
    package = REPO / "plugins" / "cdc_compaction"
    lines: list[str] = []
    for layer in _layers():
        name = layer.rsplit(".", 1)[-1]
        lines += [
            f"### {name}/",
            "",
            f"*{_summary(package / name / '__init__.py')}*",
            "",
            "| module | what it is |",
            "|---|---|",
        ]
        for rel, summary in _modules(package / name):
            cell = summary.replace("|", "\\|")
            lines.append(f"| `{name}/{rel}` | {cell} |")
        lines.append("")
    return "\n".join(lines)


def bench_targets(results: Path = REPO / "bench" / "results" / "RESULTS.md") -> str:
    """The **Targets** section of the last benchmark run's report, and when, where and at which commit it ran.

    Copied from the report ``make bench`` wrote rather than written again on the page, so that the
    page never quotes numbers of an older run than the report's. Image lines are left out: the page
    shows the images itself (their paths in the report are relative to ``bench/results/``).
    """
    text = results.read_text()
    sections = dict(re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL))
    if "Targets" not in sections:
        raise ValueError(f"{results} has no '## Targets' section: run make bench (bench/report.py writes it)")
    runs = [line for line in text.splitlines() if line.startswith("Run ")]
    body = [line for line in sections["Targets"].strip().splitlines() if not line.startswith("![")]
    return "\n".join([*(runs[:1] and [f"From the compaction benchmark's run: {runs[0][4:]}", ""]), *body, ""])


def jars_lock(lock: Path = REPO / "jars.lock", only: str | None = None) -> str:
    """The pinned jars, one table per group of ``jars.lock`` (``only``: that group), captioned by its comment."""
    from cdc_compaction.devtools.jars import read_lock

    captions = dict(re.findall(r"^# \[([a-z0-9_-]+)\] (.*)$", lock.read_text(), flags=re.MULTILINE))
    out: list[str] = []
    for purpose, jars in itertools.groupby(read_lock(lock), key=lambda j: j.purpose):
        if only is not None and purpose != only:
            continue
        listed = list(jars)
        out += [f"**`{purpose}/`** ({len(listed)} jars): {captions.get(purpose, '')}", ""]
        out += ["| artifact | version | sha256 |", "|---|---|---|"]
        out += [f"| `{j.group}:{j.artifact}` | {j.version} | `{j.sha256[:16]}…` |" for j in listed]
        out.append("")
    return "\n".join(out)


def debezium_config() -> str:
    """The stack's configuration as the code writes it, with example ports (the stack picks free ones)."""
    from cdc_compaction.devtools import debezium as dbz

    def props(values: dict[str, Any]) -> str:
        return "".join(f"{k}={v}\n" for k, v in values.items())

    kafka = dbz.kafka_server_properties("<state>/kafka/data", 9092, 9093)
    worker = dbz.connect_worker_properties("127.0.0.1:9092", 8083, "<state>/connect/plugins")
    connector = dbz.connector_config("127.0.0.1", 5432, "postgres", "cdc", ["public.accounts"])
    return "\n".join(
        [
            "Kafka (`server.properties`, one process in KRaft mode, storage formatted with a new cluster id):",
            "",
            f"```properties\n{props(kafka)}```",
            "",
            "Kafka Connect (`worker.properties`, `org.apache.kafka.connect.cli.ConnectDistributed`):",
            "",
            f"```properties\n{props(worker)}```",
            "",
            f"The connector, `PUT /connectors/{dbz.CONNECTOR}/config` (`schemas.enable` is `false` here;"
            " `DebeziumStack(schemas_enable=True)` sends `true`):",
            "",
            f"```json\n{json.dumps(connector, indent=2)}\n```",
            "",
        ]
    )


def _truth_workload() -> Any:
    """``tests/e2e/truth_workload.py``, loaded by its path (the tests are no package of the site)."""
    import importlib.util

    path = REPO / "tests" / "e2e" / "truth_workload.py"
    spec = importlib.util.spec_from_file_location("cdc_docs_truth_workload", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def debezium_truth() -> str:
    """What the Debezium truth test runs: the tables, the connectors, the landing and the registry entries."""
    import yaml

    from cdc_compaction.devtools import debezium as dbz

    truth = _truth_workload()
    connector = dbz.connector_config("127.0.0.1", 5432, "postgres", "cdc", truth.DEBEZIUM_TABLES, schemas_enable=True)
    registry_connector = dbz.connector_config(
        "127.0.0.1",
        5432,
        "postgres",
        "cdc",
        truth.DEBEZIUM_TABLES,
        topic_prefix=truth.debezium_topic_prefix(truth.REGISTRY_FORMAT),
        slot="cdc_registry",
        registry_url="http://127.0.0.1:8080/apis/registry/v2",
    )
    routes = [
        f"| `{truth.landing_group(fmt)}` | `{truth.registry_format(fmt)}`"
        + (', `wire="confluent"`' if fmt == truth.REGISTRY_FORMAT else "")
        + " | "
        + ", ".join(f"`{dbz.topic_of(t, truth.debezium_topic_prefix(fmt))}`" for t in truth.DEBEZIUM_TABLES)
        + f" | `<lake_{fmt}>/<table>/incremental/increment_<YYYYMMDDHH>/` |"
        for fmt in truth.DEBEZIUM_FORMATS
    ]
    entries = []
    for table in (truth.KEYED, truth.KEYLESS):
        doc = truth.debezium_registry_doc("<format>", table, Path("<lake_<format>>"))
        doc = {k: v for k, v in doc.items() if k not in ("description", "views", "tags", "owner", "spark")}
        doc["table"] = doc["table"].replace("__format_", "_<format>")  # the sanitised placeholder, as a placeholder
        entries.append(f"```yaml\n{yaml.safe_dump(doc, sort_keys=False)}```")
    return "\n".join(
        [
            "The tables (`SQL` as the test runs it, before the connector is registered):",
            "",
            "```sql\n" + ";\n".join(truth.DEBEZIUM_DDL) + ";\n```",
            "",
            "The connector (`DebeziumStack(schemas_enable=True).register(...)`; the ports are examples):",
            "",
            f"```json\n{json.dumps(connector, indent=2)}\n```",
            "",
            "The second connector, on the same tables, for the `avro-registry` lake: Apicurio's `AvroConverter` "
            "2.6.13.Final for key and value, registering in Apicurio Registry 3.3.3 "
            "(`DebeziumStack(schema_registry=True).register(..., avro_registry=True)`):",
            "",
            f"```json\n{json.dumps(registry_connector, indent=2)}\n```",
            "",
            "The landing: one `LandingConsumer` per format, each in a consumer group of its own, reading both topics "
            "(the registry variant its connector's, decoded with the registry's writer schemas through "
            "`schema_registry=<ccompat URL>`):",
            "",
            "| group | `Route(format=...)` | topics | lands into |",
            "|---|---|---|---|",
            *routes,
            "",
            "The registry entries, one per table and format (`<format>`: "
            + ", ".join(f"`{f}`" for f in truth.DEBEZIUM_FORMATS)
            + "; the fields",
            "`conformance.registry_doc` adds for the test's lake, views and Spark left out):",
            "",
            *entries,
            "",
        ]
    )


def _generate(name: str) -> str:
    if name == "layers":
        return layers_diagram()
    if name == "package-map":
        return package_map()
    if name == "contracts":
        return contracts()
    if name == "registry-fields":
        from cdc_compaction.core.registry_schema import registry_schema

        return registry_fields(registry_schema())
    if name == "commands":
        return commands()
    if name == "table-modes":
        return table_modes()
    if name == "bench-targets":
        return bench_targets()
    if name == "jars-lock":
        return jars_lock()
    if name == "jars-lock-s3a":
        return jars_lock(only="s3a")
    if name == "debezium-config":
        return debezium_config()
    if name == "debezium-truth":
        return debezium_truth()
    raise ValueError(
        f"unknown generated section {name!r} (docs/hooks/reference.py knows registry-fields, commands, layers, "
        "contracts, package-map, bench-targets, jars-lock, jars-lock-s3a, debezium-config, debezium-truth, "
        "table-modes)"
    )


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs event: put the generated sections where the page's markers are."""
    return MARKER.sub(lambda m: _generate(m.group(1)), markdown)


def on_files(files: Any, config: Any) -> Any:
    """MkDocs event: publish the benchmark results (outside docs/) beside the pages."""
    from mkdocs.structure.files import File

    for rel in PUBLISHED:
        files.append(File.generated(config, rel, abs_src_path=str(REPO / rel)))
    return files
