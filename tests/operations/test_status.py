"""``cdc-compaction status`` and the status it reads from a lake (no Spark: see status_helpers)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from status_helpers import FAILING, NOW, SAMPLE, build_sample_lake, version_of

from cdc_compaction.core.settings import PROJECT_ROOT
from cdc_compaction.operations.status import airflow_paused, commit_history, table_status


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdc_compaction", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT / "plugins"), **(env or {})},
        check=False,
    )


def _airflow_db(path: Path, flags: dict[str, bool]) -> str:
    """A metadata database holding Airflow's ``dag`` table columns that status reads."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE dag (dag_id VARCHAR(250) PRIMARY KEY, is_paused BOOLEAN)")
        db.executemany("INSERT INTO dag VALUES (?, ?)", [(d, int(p)) for d, p in flags.items()])
    return f"sqlite:///{path}"


def test_status_of_a_compacted_table(tmp_path: Path) -> None:
    student, _ = build_sample_lake(tmp_path / "lake")
    st = table_status(student, NOW, paused={SAMPLE["dag_id"]: False})
    last = SAMPLE["commits"][-1]
    assert st.live_version == version_of(last[0])
    assert st.last_commit is not None
    assert (st.last_commit.seq, st.last_commit.committed_at, st.last_commit.rows) == (last[0], last[2], last[4])
    # now (04:00) minus the newest event time compacted (01:55).
    assert st.freshness_basis == "event_time" and st.freshness_seconds == 2 * 3600 + 5 * 60
    # The unarchived commit's increment is still landed but compacted: not pending.
    assert st.pending == SAMPLE["pending"]
    assert (st.quarantine_entries, st.quarantine_waiting) == (1, 1)
    assert st.lease.startswith(f"held by {SAMPLE['lease_owner']} until ")
    assert st.paused is False and st.error == ""
    line = st.line()
    # The sample's own slo (1 h) is missed at 2h05m: stale, never "fresh".
    assert "commit 2 2026-11-22T02:20:00 rows 3" in line and "stale 2h05m" in line and "fresh" not in line
    # Unpaused is "active": "enabled" is the registry's word for a table that runs at all.
    assert "pending 2h" in line and "quarantine 1 waiting" in line and line.endswith("active")


def test_history_lists_every_commit_with_the_freshness_it_gave(tmp_path: Path) -> None:
    student, _ = build_sample_lake(tmp_path / "lake")
    history = commit_history(student)
    assert [(c.seq, c.rows, c.increment_rows) for c in history] == [
        (s, r, n) for s, _, _, _, r, n, _ in SAMPLE["commits"]
    ]
    # 01:10 - 00:50 and 02:20 - 01:55.
    assert [c.lag_seconds for c in history] == [20 * 60, 25 * 60]


def test_a_table_never_compacted_and_an_unreadable_one(tmp_path: Path) -> None:
    student, fresh = build_sample_lake(tmp_path / "lake")
    st = table_status(fresh, NOW)
    assert (st.live_version, st.freshness_seconds, st.paused) == ("v00000000-empty", None, None)
    assert "never compacted" in st.line() and st.line().endswith("unknown")
    Path(student.storage_root, "_cdc", "commits", "00000002.json").write_text("{not json")
    broken = table_status(student, NOW)
    assert broken.error and "00000002.json" in broken.error and "restore it" in broken.error
    assert broken.line().startswith(f"{SAMPLE['table']:<28} ERROR CommitLogError")


def test_freshness_against_an_slo_and_its_compliance(tmp_path: Path) -> None:
    """Commits at 01:10 (newest event 00:50) and 02:20 (01:55); now 04:00, so 170 minutes measured."""
    from cdc_compaction.core.registry import Slo

    student, _ = build_sample_lake(tmp_path / "lake")
    # bound 3h: never late (00:50 + 3h and 01:55 + 3h are after 04:00); bound 1h: within 01:10-01:50
    # and 02:20-02:55, 75 of 170 minutes; bound 2h: 01:10-02:20 all, then 02:20-03:55: 165 of 170.
    for hours, state, within in ((3, "ok", 170), (2, "late", 165), (1, "late", 75)):
        slo = Slo(freshness=timedelta(hours=hours), target=0.9, window=timedelta(days=1))
        cfg = student.model_copy(update={"slo": slo})
        st = table_status(cfg, NOW)
        assert (st.slo_seconds, st.slo_state) == (hours * 3600, state)
        assert st.slo_target == 0.9 and st.slo_compliance == pytest.approx(within / 170)
        assert f"slo {hours}h00m {state.upper()} {100 * within / 170:.1f}%/90%" in st.line()
        label = "fresh" if state == "ok" else "stale"
        assert f" {label} 2h05m slo" in st.line(), "the label says what the SLO says"
    no_slo = table_status(student.model_copy(update={"slo": None}), NOW)
    assert (no_slo.slo_compliance, no_slo.slo_state) == (None, ""), "no slo: nothing to measure against"
    assert " age 2h05m " in no_slo.line() and "fresh" not in no_slo.line(), "without an slo, no verdict"


def test_paused_flags_come_from_the_metadata_db_or_are_unknown(tmp_path: Path) -> None:
    conn = _airflow_db(tmp_path / "airflow.db", {SAMPLE["dag_id"]: True})
    assert airflow_paused(conn) == {SAMPLE["dag_id"]: True}
    missing = tmp_path / "none.db"
    assert airflow_paused(f"sqlite:///{missing}") is None
    assert not missing.exists(), "reading the paused flags created a database"
    assert airflow_paused("postgresql+psycopg2://nobody@127.0.0.1:1/airflow") is None


def test_status_command_lines_and_json(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    build_sample_lake(tmp_path / "lake", registry)
    env = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": _airflow_db(tmp_path / "airflow.db", {SAMPLE["dag_id"]: True})}
    proc = _cli("status", "--registry-dir", str(registry), env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == [SAMPLE["empty_table"], SAMPLE["table"]]
    student_line = lines[1]
    assert version_of(2) in student_line and "pending 2h" in student_line and student_line.endswith("paused")
    assert lines[0].endswith("unknown"), "a DAG the metadata DB does not know is neither paused nor enabled"

    proc = _cli("status", SAMPLE["table"], "--json", "--registry-dir", str(registry), env=env)
    assert proc.returncode == 0, proc.stderr
    (doc,) = json.loads(proc.stdout)
    assert doc["table"] == SAMPLE["table"] and doc["pending"] == SAMPLE["pending"]
    assert doc["last_commit"]["seq"] == 2 and doc["paused"] is True and doc["quarantine_waiting"] == 1

    proc = _cli("status", "tests.nope", "--registry-dir", str(registry), env=env)
    assert proc.returncode == 2 and "no registry entry for tests.nope" in proc.stderr


def test_the_metadata_db_is_found_without_importing_airflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc_compaction.operations.status import metadata_conn

    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "postgresql://a@h/db")
    assert metadata_conn() == "postgresql://a@h/db"
    monkeypatch.delenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN")
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    (tmp_path / "airflow.cfg").write_text("[core]\ndags_folder = /x\n")
    assert metadata_conn() == f"sqlite:///{tmp_path}/airflow.db", "Airflow's default under its home"
    (tmp_path / "airflow.cfg").write_text("[database]\nsql_alchemy_conn = sqlite:////srv/af.db\n")
    assert metadata_conn() == "sqlite:////srv/af.db"


def test_an_invalid_registry_entry_is_a_line_and_exit_1(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    build_sample_lake(tmp_path / "lake", registry)
    (registry / "tests.bad.yaml").write_text("database: tests\ntable: bad\n")
    proc = _cli("status", "--registry-dir", str(registry), env={"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": ""})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    bad = [ln for ln in proc.stdout.splitlines() if ln.startswith("tests.bad.yaml")]
    assert len(bad) == 1 and "ERROR invalid registry entry" in bad[0], proc.stdout
    assert sum(1 for ln in proc.stdout.splitlines() if ln.startswith(SAMPLE["table"])) == 1


def test_status_without_a_registry_fails_and_says_where_it_looked(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    proc = _cli("status", env={"CDC_REGISTRY_DIR": str(missing), "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": ""})
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert str(missing) in proc.stderr and "does not exist" in proc.stderr
    assert "--registry-dir" in proc.stderr and "CDC_REGISTRY_DIR" in proc.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = _cli("status", "--registry-dir", str(empty), env={"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": ""})
    assert proc.returncode == 2 and str(empty) in proc.stderr and "no registry files" in proc.stderr


@pytest.fixture(scope="module")
def failed_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    from status_helpers import airflow_with_failed_runs

    return airflow_with_failed_runs(tmp_path_factory.mktemp("failed_runs"))


def test_a_failing_table_and_a_broken_file_show_their_failed_runs(failed_runs: tuple[Path, dict[str, str]]) -> None:
    registry, env = failed_runs
    af = {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"],
        "AIRFLOW_HOME": env["AIRFLOW_HOME"],
    }
    proc = _cli("status", "--registry-dir", str(registry), env=af)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the invalid file
    lines = {ln.split()[0]: ln for ln in proc.stdout.splitlines()}
    badfit = lines[FAILING["table"]]
    assert "never compacted" in badfit and "last run failed " in badfit, badfit
    assert f"{FAILING['first_task']} try 1" in badfit and badfit.endswith("active"), badfit
    assert "next run none scheduled" not in badfit and "next run none (paused)" not in badfit, "hourly and unpaused"
    # The sample table never ran and is paused (DAGs are paused at creation).
    student = lines[SAMPLE["table"]]
    assert "last run no run" in student and "next run none (paused)" in student and student.endswith("paused")
    broken = lines[FAILING["broken_file"]]
    assert "ERROR invalid registry entry" in broken and "last run failed " in broken, broken
    assert f"{FAILING['broken_file']}:1:1: field 'columns': Field required" in broken, "located, as validate says"
    assert f"{FAILING['broken_task']} try 1" in broken, broken

    proc = _cli("status", FAILING["table"], "--json", "--registry-dir", str(registry), env=af)
    (doc,) = json.loads(proc.stdout)
    run = doc["last_run"]
    assert (run["state"], run["failed_task"], run["try_number"]) == ("failed", FAILING["first_task"], 1), doc
    assert run["run_id"].startswith("manual__") and doc["paused"] is False and doc["next_run"], doc


def test_pause_without_an_airflow_home_refuses_and_creates_nothing(tmp_path: Path) -> None:
    """No AIRFLOW_HOME (and no ~/airflow): pause would write a new ~/airflow/airflow.db and pause nothing real."""
    registry = tmp_path / "registry"
    build_sample_lake(tmp_path / "lake", registry)
    home = tmp_path / "home"  # HOME: Airflow's default home is ~/airflow
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    run = {"capture_output": True, "text": True, "check": False}
    cmd = [sys.executable, "-m", "cdc_compaction", "pause", SAMPLE["table"]]
    base_env = {**env, "HOME": str(home), "PYTHONPATH": str(PROJECT_ROOT / "plugins")}
    proc = subprocess.run(cmd, env=base_env, **run)  # type: ignore[call-overload]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "AIRFLOW_HOME" in proc.stderr and str(home / "airflow" / "airflow.cfg") in proc.stderr, proc.stderr
    assert "nothing was changed" in proc.stderr
    assert not (home / "airflow").exists(), "pause created an Airflow home"

    # A home whose metadata DB was never initialised (`airflow db migrate`): refused too, and left as it was.
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "airflow.cfg").write_text(f"[database]\nsql_alchemy_conn = sqlite:///{bare}/airflow.db\n")
    proc = subprocess.run(cmd, env={**base_env, "AIRFLOW_HOME": str(bare)}, **run)  # type: ignore[call-overload]
    assert proc.returncode == 1 and "airflow db migrate" in proc.stderr, proc.stdout + proc.stderr
    assert sorted(p.name for p in bare.iterdir()) == ["airflow.cfg"], "pause created a database"


#: What a terminal obeys rather than shows: an OSC that retitles the window (ended by BEL), a CSI
#: that clears the screen, a C1 CSI, a bidi override that reverses what follows, a carriage return.
EVIL = "\x1b]0;evil\x07 boom \x1b[2J \x9b31m \u202eredro \r over"
#: Characters no line of ``status`` may hold: C0 (no newline inside a line, no tab), DEL, C1, bidi controls.
UNSAFE = [chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)]] + ["\u061c", "\u200e", "\u200f"]
UNSAFE += [chr(c) for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]]


def _unsafe_in(text: str) -> list[str]:
    return sorted({c for line in text.splitlines() for c in line if c in UNSAFE})


def test_a_task_logs_error_line_is_printed_without_terminal_controls(tmp_path: Path) -> None:
    from cdc_compaction.operations.status import first_error_line

    log = tmp_path / "attempt=1.log"
    record = {"level": "error", "event": "Task failed with exception"}
    record["error_detail"] = [{"exc_type": "RuntimeError", "exc_value": f"{EVIL}\nsecond line"}]
    log.write_text(json.dumps({"level": "info", "event": "start"}) + "\n" + json.dumps(record) + "\n")
    line = first_error_line(log)
    assert _unsafe_in(line) == [] and "\n" not in line, repr(line)
    assert line.startswith("RuntimeError: ") and "evil" in line and "boom" in line and "over" in line, line
    assert "\\x1b" in line and "\\u202e" in line, "an escape is shown as text, not dropped silently"


def test_status_escapes_terminal_controls_from_the_registry(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    build_sample_lake(tmp_path / "lake", registry)
    # YAML's double-quoted escapes: \e is ESC, \a is BEL; the value comes back in the error line.
    (registry / "tests.bad.yaml").write_text('database: tests\ntable: bad\nowner: "\\e]0;evil\\a\\e[2J\\u202e x"\n')
    proc = _cli("status", "--registry-dir", str(registry), env={"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": ""})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (bad,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("tests.bad.yaml")]
    assert "ERROR invalid registry entry" in bad and "owner" in bad, bad
    assert _unsafe_in(proc.stdout) == [], repr(proc.stdout)
    proc = _cli("status", "--json", "--registry-dir", str(registry), env={"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": ""})
    assert _unsafe_in(proc.stdout) == [] and "owner" in proc.stdout, "JSON escapes them as JSON does"
    proc = _cli(
        "status", "tests.\x1b[2Jx", "--registry-dir", str(registry), env={"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": ""}
    )
    assert proc.returncode == 2 and "no registry entry" in proc.stderr and _unsafe_in(proc.stderr) == [], proc.stderr


def test_a_failed_runs_error_with_terminal_controls_is_printed_escaped(
    failed_runs: tuple[Path, dict[str, str]],
) -> None:
    """The failed try's real task log gets an error line with escape sequences: status shows them as text."""
    registry, env = failed_runs
    af = {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"],
        "AIRFLOW_HOME": env["AIRFLOW_HOME"],
    }
    # `airflow dags test` logs to its stdout: the try's log file is written where Airflow's default
    # log_filename_template puts it (dag_id=/run_id=/task_id=/attempt=N.log under $AIRFLOW_HOME/logs).
    db = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].removeprefix("sqlite:///")
    with sqlite3.connect(db) as con:
        (run_id,) = con.execute("SELECT run_id FROM dag_run WHERE dag_id = ?", (FAILING["dag_id"],)).fetchone()
    log = Path(env["AIRFLOW_HOME"], "logs", f"dag_id={FAILING['dag_id']}", f"run_id={run_id}")
    log = log / f"task_id={FAILING['first_task']}" / "attempt=1.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    original = log.read_text() if log.exists() else ""
    record = {"level": "error", "event": "Task failed with exception"}
    record["error_detail"] = [{"exc_type": "RuntimeError", "exc_value": EVIL}]
    try:
        log.write_text(original + json.dumps(record) + "\n")
        proc = _cli("status", FAILING["table"], "--registry-dir", str(registry), env=af)
    finally:
        log.unlink() if not original else log.write_text(original)
    (line,) = proc.stdout.splitlines()
    assert f"{FAILING['first_task']} try 1: RuntimeError: " in line and "evil" in line, line
    assert _unsafe_in(proc.stdout) == [], repr(proc.stdout)
