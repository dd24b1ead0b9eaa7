"""The ``validate`` step: what it refuses to publish, and its DAG callable's alert.

On real storage, metastore and Spark (moved here from ``tests/test_tasks.py``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from conftest import visible_names

from cdc_compaction.core.exceptions import (
    PublishValidationError,
)
from cdc_compaction.devtools.conformance import land
from cdc_compaction.pipeline.plan import plan
from cdc_compaction.pipeline.tables import ensure_tables
from cdc_compaction.pipeline.validate import attempts, validate

from .helpers import run_job, student_rows

pytestmark = [pytest.mark.spark, pytest.mark.metastore]


def test_validation_refuses_tampered_output(make_cfg, runtime, spark) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [student_rows((1, "Alice", "c", 1), (2, "Bob", "c", 1))])
    path = plan(rt, "run-1")
    run_job(rt, path)
    out = Path(rt.lake.layout.version_dir(attempts(rt, json.loads(Path(path).read_text()))[-1][0]))
    stats_file = out / "_cdc_stats.json"
    stats = json.loads(stats_file.read_text())
    stats_file.write_text(json.dumps({**stats, "output_rows": 3}))
    with pytest.raises(PublishValidationError, match="do not reconcile"):
        validate(rt, path)
    stats_file.write_text(json.dumps(stats))
    # Where readers glob, only data files: a marker or a checksum file there is refused.
    for junk in ("data/_SUCCESS", "data/.part-0.parquet.crc", "tombstones/_committed_1"):
        (out / junk).write_text("")
        with pytest.raises(PublishValidationError, match="not data files where readers read"):
            validate(rt, path)
        (out / junk).unlink()
    for f in out.glob("data/*.parquet"):
        f.unlink()
    with pytest.raises(PublishValidationError, match="output files differ"):
        validate(rt, path)
    assert rt.lake.latest_commit().seq == 0, "nothing was published"
    assert visible_names(spark, rt.cfg) == {}


def test_validation_refuses_input_changed_after_planning(make_cfg, runtime) -> None:
    rt = runtime(make_cfg())
    ensure_tables(rt)
    land(rt.cfg, "increment_2026112200", [student_rows((1, "Alice", "c", 1))])
    path = plan(rt, "run-1")
    # The sink rewrote the file after the plan recorded it: the job reads two rows, not one.
    land(rt.cfg, "increment_2026112200", [student_rows((1, "Alice", "c", 1), (2, "Bob", "c", 1))])
    run_job(rt, path)
    with pytest.raises(PublishValidationError, match="read 2 increment rows, the planned files held 1"):
        validate(rt, path)


def test_validate_and_publish_succeed_when_the_alert_cannot_be_delivered(make_cfg, runtime, spark, monkeypatch) -> None:
    """Issue 10 §2.17 as reported: alerts.emails set, no smtp_default connection, refused rows to alert about.

    The DAG's own validate and publish callables (factory.build_dag) on a really staged version:
    both succeed and the version is published; the failed delivery is logged and counted.
    """
    from airflow.sdk.observability.stats import Stats

    from cdc_compaction.airflow import factory
    from cdc_compaction.integrations import notifications

    monkeypatch.delenv("AIRFLOW_CONN_SMTP_DEFAULT", raising=False)
    rt = runtime(make_cfg(alerts={"emails": ["owner@example.org"]}, retries=3))
    assert rt.cfg.alerts.smtp_conn_id == "smtp_default" and rt.cfg.alerts.on_rejected_rows
    ensure_tables(rt)
    land(
        rt.cfg, "increment_2026112200", [student_rows((1, "Alice", "c", 1), (2, "Bob", "c", 1), (3, "refused", "x", 1))]
    )
    path = plan(rt, "run-1")
    run_job(rt, path)
    counted: list[tuple[str, dict[str, str]]] = []
    monkeypatch.setattr(Stats, "incr", lambda name, *a, tags=None, **kw: counted.append((name, tags or {})))
    monkeypatch.setattr(factory, "_runtime", lambda cfg: rt)
    before = notifications.DELIVERY_FAILURES[rt.cfg.qualified_name]
    dag = factory.build_dag(rt.cfg)
    # On the module's logger itself: looking up the connection makes Airflow reconfigure the root logger.
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger(notifications.__name__).addHandler(handler)
    try:
        stats = dag.get_task("validate").python_callable(plan_path=path)
        published = dag.get_task("publish").python_callable(plan_path=path)
    finally:
        logging.getLogger(notifications.__name__).removeHandler(handler)

    assert stats["rejected_rows"] == 1
    assert published["version"] == rt.lake.latest_commit().version == stats["version"]
    assert visible_names(spark, rt.cfg) == {1: "Alice", 2: "Bob"}
    failed = [r for r in records if "could not deliver the alert" in r.getMessage()]
    assert (
        len(failed) == 1
        and "smtp_default" in failed[0].getMessage()
        and "1 change events refused" in (failed[0].getMessage())
    )
    assert failed[0].exc_info is not None and "smtp_default" in str(failed[0].exc_info[1])
    assert notifications.DELIVERY_FAILURES[rt.cfg.qualified_name] == before + 1
    # The failed delivery is counted once; publish's own metrics (events_in, ...) go out beside it.
    failures = [c for c in counted if c[0].endswith("_failed")]
    assert failures == [(notifications.DELIVERY_FAILED_METRIC, {"table": rt.cfg.qualified_name})]
