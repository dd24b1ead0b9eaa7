"""EMR: the compaction as an EMR step, submitted through the amazon provider to moto's EMR API on loopback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cdc_compaction.airflow.factory import build_dag
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.integrations.engine import compaction_conf, emr_steps

EMR = {"job_flow_id": "j-PLACEHOLDER1", "application": "s3://lake-code/cdc/compact.py"}
PLAN = "s3://lake/shop/orders/_cdc/plans/abc.json"


def _cluster() -> str:
    """A running EMR cluster in moto, created through the same hook the DAG uses."""
    from airflow.providers.amazon.aws.hooks.emr import EmrHook

    client = EmrHook(aws_conn_id="aws_default").conn
    return client.run_job_flow(
        Name="cdc-compaction",
        ReleaseLabel="emr-7.5.0",
        Instances={"InstanceCount": 1, "KeepJobFlowAliveWhenNoSteps": True, "MasterInstanceType": "m5.xlarge"},
        Applications=[{"Name": "Spark"}],
        JobFlowRole="EMR_EC2_DefaultRole",
        ServiceRole="EMR_DefaultRole",
    )["JobFlowId"]


def test_the_step_is_spark_submit_of_the_deployed_job_with_the_tables_conf(
    make_cfg: Callable[..., TableConfig],
) -> None:
    cfg = make_cfg(
        spark={
            "engine": "emr",
            "emr": EMR,
            "hadoop_conf": {"fs.s3a.path.style.access": "true"},
            "executor_memory": "4g",
        }
    )
    (step,) = emr_steps(cfg, PLAN)
    assert step["Name"] == f"cdc-compact-{cfg.qualified_name}" and step["ActionOnFailure"] == "CONTINUE"
    args = step["HadoopJarStep"]["Args"]
    assert step["HadoopJarStep"]["Jar"] == "command-runner.jar"
    assert args[:3] == ["spark-submit", "--deploy-mode", "cluster"]
    assert args[-3:] == ["s3://lake-code/cdc/compact.py", "--plan", PLAN]
    confs = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--conf")
    assert confs == compaction_conf(cfg)
    assert args[args.index("--executor-memory") + 1] == "4g"


def test_the_dag_submits_a_step_then_waits_for_it(make_cfg: Callable[..., TableConfig]) -> None:
    from airflow.providers.amazon.aws.operators.emr import EmrAddStepsOperator
    from airflow.providers.amazon.aws.sensors.emr import EmrStepSensor

    dag = build_dag(make_cfg(spark={"engine": "emr", "emr": EMR}))
    submit, sensor = dag.get_task("compact_submit"), dag.get_task("compact")
    assert isinstance(submit, EmrAddStepsOperator) and isinstance(sensor, EmrStepSensor)
    assert submit.upstream_task_ids == {"plan"}
    assert sensor.upstream_task_ids == {"plan", "compact_submit"}
    assert dag.get_task("validate").upstream_task_ids >= {"compact"}
    assert sensor.mode == "reschedule", "a long step must not hold a worker slot"
    assert "compact_submit" in sensor.step_id and submit.job_flow_id == EMR["job_flow_id"]


@pytest.mark.s3
def test_the_rendered_step_is_accepted_by_the_emr_api(make_cfg: Callable[..., TableConfig], aws_default: str) -> None:
    """Render the operator's templates as Airflow would, submit the resulting steps, read them back."""
    from airflow.providers.amazon.aws.hooks.emr import EmrHook
    from airflow.providers.amazon.aws.sensors.emr import EmrStepSensor

    cluster = _cluster()
    cfg = make_cfg(spark={"engine": "emr", "emr": {**EMR, "job_flow_id": cluster}})
    dag = build_dag(cfg)
    submit = dag.get_task("compact_submit")
    ti = SimpleNamespace(xcom_pull=lambda task_ids, **_: PLAN if task_ids == "plan" else None)
    submit.render_template_fields({"ti": ti})
    steps = submit.steps_with_plan()
    assert steps[0]["HadoopJarStep"]["Args"][-1] == PLAN

    hook = EmrHook(aws_conn_id=submit.aws_conn_id)
    step_ids = hook.add_job_flow_steps(job_flow_id=submit.job_flow_id, steps=steps)
    assert len(step_ids) == 1
    described = hook.conn.describe_step(ClusterId=cluster, StepId=step_ids[0])["Step"]
    assert described["Name"] == f"cdc-compact-{cfg.qualified_name}"
    assert described["Config"]["Args"] == steps[0]["HadoopJarStep"]["Args"]

    # The sensor reads that step's state through the same hook.
    sensor = dag.get_task("compact")
    probe = EmrStepSensor(task_id="probe", job_flow_id=cluster, step_id=step_ids[0], aws_conn_id=sensor.aws_conn_id)
    response = probe.get_emr_response(context={})  # type: ignore[arg-type]
    assert EmrStepSensor.state_from_response(response) in {"PENDING", "RUNNING", "COMPLETED", "STARTING"}


@pytest.mark.parametrize(
    ("emr", "problem"),
    [
        ({"application": EMR["application"]}, "job_flow_id"),
        ({**EMR, "job_flow_id": "cluster-1"}, "is not an EMR cluster id"),
        ({**EMR, "application": "/local/compact.py"}, "must be the s3:// URI"),
        ({**EMR, "application": "s3://b/x/../compact.py"}, "must be the s3:// URI"),
    ],
)
def test_bad_emr_settings_are_refused(make_cfg: Callable[..., TableConfig], emr: dict[str, Any], problem: str) -> None:
    with pytest.raises(Exception, match=problem):
        make_cfg(spark={"engine": "emr", "emr": emr})


def test_engine_emr_needs_its_settings(make_cfg: Callable[..., TableConfig]) -> None:
    with pytest.raises(Exception, match=r"engine 'emr' needs emr\.job_flow_id"):
        make_cfg(spark={"engine": "emr"})


def _failed_step(*_: Any, **__: Any) -> dict[str, Any]:
    """DescribeStep's answer for a step whose spark-submit failed (EMR reports no exit status of the job)."""
    details = {"Reason": "Unknown Error.", "Message": "Application finished with failed status", "LogFile": "s3://x"}
    return {
        "ResponseMetadata": {"HTTPStatusCode": 200},
        "Step": {"Status": {"State": "FAILED", "FailureDetails": details}},
    }


@pytest.mark.parametrize("stale", [True, False], ids=["stale-plan", "other-failure"])
def test_a_failed_step_of_a_stale_plan_fails_the_sensor_at_once(
    make_cfg: Callable[..., TableConfig], tmp_path: Any, monkeypatch: pytest.MonkeyPatch, stale: bool
) -> None:
    """The job wrote its permanent error beside the plan: the sensor fails at once; otherwise retries apply."""
    import json

    from airflow.sdk.exceptions import AirflowFailException

    from cdc_compaction.airflow.factory import permanent_error_path

    dag = build_dag(make_cfg(spark={"engine": "emr", "emr": EMR}))
    sensor = dag.get_task("compact")
    assert "plan_path" in sensor.template_fields
    plan = tmp_path / "_cdc" / "plans" / "abc.json"
    plan.parent.mkdir(parents=True)
    plan.write_text("{}")
    if stale:
        error = "shop.orders: commit 4 was made by plan x, so plan abc is stale; nothing was written"
        Path(permanent_error_path(str(plan))).write_text(json.dumps({"plan_id": "abc", "seq": 4, "error": error}))
    sensor.plan_path = str(plan)
    monkeypatch.setattr(type(sensor), "get_emr_response", _failed_step)
    with pytest.raises(Exception) as raised:  # which class it is, is the point
        sensor.poke({})
    if stale:
        assert isinstance(raised.value, AirflowFailException) and "is stale" in str(raised.value)
        assert "EMR job failed" in str(raised.value.__cause__)
    else:
        assert not isinstance(raised.value, AirflowFailException) and "EMR job failed" in str(raised.value)
