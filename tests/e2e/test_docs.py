"""The docs site's generated reference sections (docs/hooks/reference.py) against what they document.

Expectations come from the code's public faces, not from the generator: the registry's fields from
the shipped ``registry.schema.json`` (``tests/core/test_registry_schema.py`` keeps it current), the
commands from the CLI's own ``--help`` output.  ``make test`` builds the whole site with
``mkdocs build --strict`` besides (a broken link or anchor fails it).
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
# The hook links the sections the models' descriptions name with Markdown's own anchor rule.
pytest.importorskip("markdown", reason="the docs tools are not installed: make docs installs requirements-docs.txt")


@pytest.fixture(scope="module")
def reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "docs" / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sections(markdown: str) -> dict[str, str]:
    """``### heading -> its text`` of a generated section."""
    parts = re.split(r"^### (.+)$", markdown, flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def _marker_pages() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for page in sorted((REPO / "docs").glob("*.md")):
        for name in re.findall(r"^<!-- generated: ([a-z0-9-]+) -->$", page.read_text(), flags=re.MULTILINE):
            found.setdefault(name, []).append(page.name)
    return found


def test_the_pages_ask_for_each_generated_section_once() -> None:
    assert _marker_pages() == {
        "registry-fields": ["registry.md"],
        "commands": ["commands.md"],
        "layers": ["architecture.md"],
        "contracts": ["architecture.md"],
        "package-map": ["architecture.md"],
        "bench-targets": ["benchmarks.md"],
        "jars-lock": ["debezium.md"],
        "jars-lock-s3a": ["cloud.md"],
        "debezium-config": ["debezium.md"],
        "debezium-truth": ["debezium.md"],
        "table-modes": ["index.md"],
    }


def test_the_benchmarks_page_shows_the_last_runs_targets_as_the_report_has_them(
    reference: ModuleType, tmp_path: Path
) -> None:
    """Every row of the report's Targets table, the run's provenance line, no image (its path is the report's)."""
    report = REPO / "bench" / "results" / "RESULTS.md"
    lines = report.read_text().splitlines()
    start = lines.index("## Targets")
    rows = [
        ln for ln in itertools.takewhile(lambda ln: not ln.startswith("## "), lines[start + 1 :]) if ln.startswith("|")
    ]
    page = reference.on_page_markdown("<!-- generated: bench-targets -->")
    assert len(rows) >= 3 and all(row in page.splitlines() for row in rows)
    assert "![" not in page
    run = next(ln for ln in lines if ln.startswith("Run "))
    assert run[4:] in page
    # A report without the section is refused with what to do.
    bare = tmp_path / "RESULTS.md"
    bare.write_text("# Benchmark results\n\n## Compaction\n\nnothing\n")
    with pytest.raises(ValueError, match="make bench"):
        reference.bench_targets(bare)


def test_the_architecture_page_shows_every_layer_and_module(reference: ModuleType) -> None:
    """Every subpackage the layers contract declares is drawn, and every module of the package is listed."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c["layers"] for c in config["contracts"] if c["type"] == "layers")
    package = REPO / "plugins" / "cdc_compaction"
    subpackages = sorted(p.name for p in package.iterdir() if (p / "__init__.py").is_file())
    # Every subpackage is in a layer: a new one cannot escape the rules.
    assert sorted(layer.removeprefix("cdc_compaction.") for layer in layers) == subpackages
    diagram, table = reference.layers_diagram(), reference.package_map()
    for name in subpackages:
        assert f"{name}/" in diagram
    for path in package.rglob("*.py"):
        rel = path.relative_to(package)
        if len(rel.parts) == 1 or "__pycache__" in rel.parts:
            continue  # __init__ and __main__ of the package itself
        if rel.name == "__init__.py" and len(rel.parts) == 2:
            assert f"### {rel.parts[0]}/" in table  # a layer: its own heading, its docstring under it
            continue
        shown = f"{rel.parent.as_posix()}/" if path.name == "__init__.py" else rel.as_posix()
        assert f"`{shown}`" in table, f"{shown} is missing from the Architecture page's module map"
    for contract in config["contracts"]:
        assert contract["name"] in reference.contracts()


def test_the_registry_reference_lists_every_field_of_every_model(reference: ModuleType) -> None:
    schema = json.loads((REPO / "registry.schema.json").read_text())
    expected = {name: set(definition.get("properties", {})) for name, definition in schema["$defs"].items()}
    page = reference.on_page_markdown("<!-- generated: registry-fields -->")
    listed = {
        heading: set(re.findall(r"^\| `([^`]+)` \|", text, flags=re.MULTILINE))
        for heading, text in _sections(page).items()
    }
    assert listed == expected
    # Required fields say so; a field with a default shows it.
    cdc = _sections(page)["CdcTable"]
    for field in schema["$defs"]["CdcTable"].get("required", []):
        assert re.search(rf"^\| `{field}` \| [^|]+ \| required \|", cdc, flags=re.MULTILINE), field
    assert re.search(r"^\| `owner` \| string \| `data-platform` \|", cdc, flags=re.MULTILINE)


def _help(*words: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO / "plugins"), "COLUMNS": "100"}
    proc = subprocess.run(
        [sys.executable, "-m", "cdc_compaction", *words, "--help"], capture_output=True, text=True, env=env, check=True
    )
    return proc.stdout


def _subcommands(help_text: str) -> list[str]:
    """The sub-commands a ``--help`` offers: argparse shows them as ``{a,b,c} ...`` in its usage."""
    usage = help_text.split("\n\n", 1)[0]
    match = re.search(r"\{([a-z,-]+)\}\s+\.\.\.", usage)
    return match.group(1).split(",") if match else []


def test_the_commands_reference_has_every_command_and_its_usage(reference: ModuleType) -> None:
    commands: list[tuple[str, ...]] = []
    for name in _subcommands(_help()):
        nested = _subcommands(_help(name))
        commands += [(name, sub) for sub in nested] or [(name,)]
    assert len(commands) > 20 and ("registry", "validate") in commands and ("job-package",) in commands

    page = reference.on_page_markdown("<!-- generated: commands -->")
    sections = _sections(page)
    assert list(sections) == [" ".join(words) for words in commands]
    for words in commands:
        assert f"usage: cdc-compaction {' '.join(words)} " in sections[" ".join(words)], words
    # The help text itself, as the CLI prints it (here: the one the README's five-minute path uses).
    status = _help("status").replace("usage: python -m cdc_compaction", "usage: cdc-compaction")
    assert status.strip() in sections["status"]


def test_a_description_naming_a_missing_section_fails_the_build(reference: ModuleType) -> None:
    with pytest.raises(ValueError, match="no page of docs/ has a heading"):
        reference._text('See README, "No such section".', reference._headings())


def test_every_make_target_the_docs_name_exists() -> None:
    """``make metastore`` was documented, but the target is ``make metastore-start``."""
    targets = set(re.findall(r"^([a-z][a-z-]*):", (REPO / "Makefile").read_text(), flags=re.MULTILINE))
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    named = {
        (page.name, target)
        for page in pages
        # In code only (a span or a fenced block): prose says "make" too.
        for code in re.findall(r"```.*?```|`[^`\n]+`", page.read_text(), flags=re.DOTALL)
        for target in re.findall(r"(?<![\w-])make ([a-z][a-z-]*[a-z])", code)
    }
    assert len(named) > 20
    assert {(page, target) for page, target in named if target not in targets} == set()


# --- Messages that point somewhere real --------------------------------------------------------------------------

PACKAGE_SOURCES = [*sorted((REPO / "plugins").rglob("*.py")), *sorted((REPO / "dags").glob("*.py"))]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs site as ``mkdocs build`` makes it (its generated pages too), in a directory of its own."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": str(REPO / "plugins"), "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", str(out)], cwd=REPO, env=env, check=True
    )
    return out


def _site_anchors(site: Path) -> dict[str, set[str]]:
    """``page -> the ids of its HTML``, read from the built site (``<page>/index.html``; the home is ``index``)."""
    pages = {"index": site / "index.html"} | {p.parent.name: p for p in site.glob("*/index.html")}
    return {name: set(re.findall(r'\bid="([^"]+)"', path.read_text())) for name, path in pages.items()}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            found.add(id(first.value))
    return found


def _doc_ref_calls() -> list[tuple[str, int, list[object]]]:
    """``(file, line, arguments)`` of every ``doc_ref(...)`` call in the package and the DAG file."""
    calls = []
    for path in PACKAGE_SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
                if name == "doc_ref":
                    args = [a.value if isinstance(a, ast.Constant) else a for a in node.args]
                    calls.append((str(path.relative_to(REPO)), node.lineno, args))
    return calls


def test_every_doc_reference_of_a_message_is_a_page_and_anchor_of_the_site(site: Path) -> None:
    """A message's ``doc_ref(page, anchor)`` names a page the built site has and an id on that page."""
    anchors = _site_anchors(site)
    assert {"index", "data", "operations", "registry"} <= set(anchors)
    calls = _doc_ref_calls()
    assert len(calls) >= 10, calls
    unresolved = []
    for file, line, args in calls:
        if not (1 <= len(args) <= 2 and all(isinstance(a, str) for a in args)):
            unresolved.append(f"{file}:{line}: doc_ref takes a page and an anchor written as literals, got {args}")
            continue
        page, anchor = (*args, "")[:2]
        if page not in anchors:
            unresolved.append(f"{file}:{line}: no page {page!r} on the site")
        elif anchor and anchor not in anchors[page]:
            unresolved.append(f"{file}:{line}: page {page!r} has no anchor {anchor!r}")
    assert unresolved == []


#: How messages cited the docs before doc_ref: a README section, a heading's words, a page's path.
OTHER_CITATIONS = re.compile(r"\bREADME\b|\bdocs, ['\"]|\bdocs/[\w-]+\.md|\.md#")


def test_no_message_cites_the_docs_another_way() -> None:
    """Every text the package shows (its string literals; docstrings are the code's own) cites with doc_ref."""
    found = []
    for path in PACKAGE_SOURCES:
        tree = ast.parse(path.read_text())
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            text = node.value if isinstance(node, ast.Constant) and id(node) not in docstrings else None
            if isinstance(text, str) and OTHER_CITATIONS.search(text):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {text.strip()[:100]}")
    assert found == []


def test_the_registry_schema_cites_sections_the_site_has(site: Path) -> None:
    """The shipped schema's texts (editors show them) cite ``docs/<page>.md#<anchor>`` that resolve."""
    anchors = _site_anchors(site)
    text = (REPO / "registry.schema.json").read_text()
    cited = re.findall(r"docs/([\w-]+)\.md(?:#([\w-]+))?", text)
    assert len(cited) > 10
    assert re.findall(r'(?:docs|README), \\"[^\\]*\\"', text) == [], "a section named by its heading's words"
    assert [(p, a) for p, a in cited if p not in anchors or (a and a not in anchors[p])] == []


def _airflow_commands() -> dict[str, list[str]]:
    """``command -> its subcommands`` (empty for a leaf) of the installed Airflow's own CLI parser."""
    code = (
        "import argparse, json\n"
        "from airflow.cli.cli_parser import get_parser\n"
        "def subs(p):\n"
        "    return next((a.choices for a in p._actions if isinstance(a, argparse._SubParsersAction)), {})\n"
        "print(json.dumps({name: sorted(subs(p)) for name, p in subs(get_parser()).items()}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "plugins")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_airflow_command_the_docs_name_exists() -> None:
    """``airflow dags reserialize``, ``airflow db migrate``: Airflow 3's commands, as its own parser has them."""
    commands = _airflow_commands()
    assert "reserialize" in commands["dags"] and "migrate" in commands["db"]
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    named = {
        (page.name, words)
        for page in pages
        for code in re.findall(r"```.*?```|`[^`\n]+`", page.read_text(), flags=re.DOTALL)
        for words in re.findall(r"(?<![\w./-])airflow ([a-z][a-z-]*(?: [a-z][a-z-]*)?)", code)
    }
    assert len(named) > 5
    wrong = []
    for page, words in sorted(named):
        command, _, sub = words.partition(" ")
        if command not in commands:
            wrong.append((page, f"airflow {words}"))
        elif commands[command] and sub not in commands[command]:
            wrong.append((page, f"airflow {words}: {command} takes {', '.join(commands[command])}"))
    assert wrong == []


def test_the_deployment_page_gives_the_steps_for_an_existing_airflow_in_order() -> None:
    """Install, environment, DAG file, ``db migrate``, ``dags reserialize``, check: a numbered list, in that order."""
    text = (REPO / "docs" / "deployment.md").read_text()
    sections = re.split(r"^#{2,3} ", text, flags=re.MULTILINE)
    (section,) = [s for s in sections if s.lower().startswith("adding it to an existing airflow")]
    steps = re.findall(r"^\d+\. (.*?)(?=^\d+\. |\Z)", section, flags=re.MULTILINE | re.DOTALL)
    wanted = [
        "pip install",
        "CDC_REGISTRY_DIR=",
        "cdc_compaction_dags.py",
        "`airflow db migrate`",
        "`airflow dags reserialize`",
        "`airflow dags list`",
    ]
    assert len(steps) == len(wanted), steps
    for step, words in zip(steps, wanted, strict=True):
        assert words in step, (words, step)
    # The last step says what the parse logs, in the words it logs them (tests/airflow/test_dag_file_log.py).
    assert "registry directory" in steps[-1] and "no registry directory" in steps[-1]


# --- The docs in step with the code ------------------------------------------------------------------------------


def _paragraph(text: str, words: str) -> str:
    """The paragraph (blank-line separated) of ``text`` that holds ``words``."""
    (found,) = [p for p in text.split("\n\n") if words in p]
    return found


#: What each of the Makefile's check targets stops for when it is missing.
CHECKED_REQUIREMENTS = {"check-postgres": "PostgreSQL", "check-browser": "Chromium"}


def test_the_requirements_name_every_target_that_checks_for_a_server() -> None:
    """``make airflow-ui`` needs PostgreSQL's server (its prerequisite check-postgres): the requirements say so."""
    makefile = (REPO / "Makefile").read_text()
    needs = {
        (target, CHECKED_REQUIREMENTS[check])
        for target, prerequisites in re.findall(r"^([a-z][a-z-]*):([^#\n]*)", makefile, flags=re.MULTILINE)
        for check in prerequisites.split()
        if check in CHECKED_REQUIREMENTS
    }
    assert ("airflow-ui", "PostgreSQL") in needs and ("test", "Chromium") in needs
    for page, anchor in [("README.md", "JDK 17+"), ("docs/getting-started.md", "JDK 17+")]:
        paragraph = _paragraph((REPO / page).read_text(), anchor)
        for target, what in sorted(needs):
            assert f"`make {target}`" in paragraph and what in paragraph, (page, target, what, paragraph)


def test_the_local_ui_is_described_as_the_project_starts_it() -> None:
    """``make airflow-ui`` is not ``airflow standalone``: the project starts Airflow's components itself and
    prints where the admin password is (``simple_auth_manager_passwords.json.generated``)."""
    for page in ("README.md", "docs/getting-started.md"):
        paragraph = _paragraph((REPO / page).read_text(), "It starts the local")
        assert "airflow standalone" not in paragraph, (page, paragraph)
        for words in ("PostgreSQL", "api-server", "scheduler", "DAG processor", "triggerer", "admin"):
            assert words in paragraph, (page, words, paragraph)
        assert "simple_auth_manager_passwords.json.generated" in paragraph, (page, paragraph)


def test_the_home_page_and_the_readme_name_every_table_mode(reference: ModuleType) -> None:
    """Every mode the registry takes (the shipped schema's ``mode`` enum), ``append`` included."""
    modes = json.loads((REPO / "registry.schema.json").read_text())["properties"]["mode"]["enum"]
    assert "append" in modes and len(modes) >= 4
    home = reference.on_page_markdown((REPO / "docs" / "index.md").read_text())
    readme = (REPO / "README.md").read_text()
    for mode in modes:
        assert f"mode: {mode}" in home, (mode, "docs/index.md")
        assert f"mode: {mode}" in readme, (mode, "README.md")


def test_the_readmes_table_of_pages_lists_every_page_of_the_site() -> None:
    """Every page of docs/ (the Delta and Iceberg page was missing), each once, linked as the site names it."""
    pages = sorted(p.name for p in (REPO / "docs").glob("*.md") if p.name != "index.md")
    readme = (REPO / "README.md").read_text()
    table = readme.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    linked = re.findall(r"\]\(docs/([\w-]+\.md)\)", table)
    assert sorted(linked) == pages
    home = (REPO / "docs" / "index.md").read_text().split("## Where to go", 1)[1]
    assert sorted(set(re.findall(r"\]\(([\w-]+\.md)\)", home))) == pages, "the home page's Where to go"


def test_every_link_of_the_readme_into_the_docs_resolves(site: Path) -> None:
    """The README is not part of the site, so ``mkdocs build --strict`` does not check its links: this does."""
    anchors = _site_anchors(site)
    links = re.findall(r"\]\(docs/([\w-]+)\.md(?:#([\w-]+))?\)", (REPO / "README.md").read_text())
    assert len(links) > 10
    assert [(p, a) for p, a in links if p not in anchors or (a and a not in anchors[p])] == []
