"""The compaction's spark-submit: conf, extra jars and Hadoop (S3A) settings, and switching engines by connection."""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable
from typing import Any

import pytest

from cdc_compaction.airflow.factory import build_dag
from cdc_compaction.core import settings
from cdc_compaction.core.exceptions import RegistryError
from cdc_compaction.core.registry import TableConfig
from cdc_compaction.integrations.engine import check_jars, compaction_conf, spark_hadoop_version

S3A = {
    "fs.s3a.endpoint": "http://127.0.0.1:9000",
    "fs.s3a.path.style.access": "true",
    "fs.s3a.aws.credentials.provider": "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider",
}
JARS = ["/opt/spark-extra/hadoop-aws-3.5.0.jar", "/opt/spark-extra/bundle-2.29.52.jar"]


def _command(cfg: TableConfig) -> list[str]:
    """The exact spark-submit command the table's compact task would run."""
    op = build_dag(cfg).get_task("compact")
    op.application_args = ["--plan", "/lake/t/_cdc/plans/p.json"]  # what the plan task's XCom renders to
    hook = op._get_hook()  # the operator's own hook: the command under test is the real one
    return hook._build_spark_submit_command(op.application)


def _confs(cmd: list[str]) -> dict[str, str]:
    return dict(cmd[i + 1].split("=", 1) for i, a in enumerate(cmd) if a == "--conf")


def test_hadoop_settings_and_jars_reach_spark_submit(make_cfg: Callable[..., TableConfig]) -> None:
    cfg = make_cfg(spark={"conf": {"spark.sql.shuffle.partitions": "64"}, "hadoop_conf": S3A, "jars": JARS})
    conf = compaction_conf(cfg)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.sql.session.timeZone"] == "UTC" and conf["spark.sql.shuffle.partitions"] == "64"
    cmd = _command(cfg)
    assert cmd[cmd.index("--jars") + 1] == ",".join(JARS)
    confs = _confs(cmd)
    for key, value in S3A.items():
        assert confs[f"spark.hadoop.{key}"] == value
    assert cmd[-3:] == [str(settings.SPARK_JOBS_DIR / "compact.py"), "--plan", "/lake/t/_cdc/plans/p.json"]


def test_the_registry_spark_conf_wins_over_hadoop_conf(make_cfg: Callable[..., TableConfig]) -> None:
    cfg = make_cfg(
        spark={"hadoop_conf": {"fs.s3a.endpoint": "a"}, "conf": {"spark.hadoop.fs.s3a.endpoint": "b"}},
    )
    assert compaction_conf(cfg)["spark.hadoop.fs.s3a.endpoint"] == "b"


def test_moving_to_a_cluster_is_a_connection_change(
    make_cfg: Callable[..., TableConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same registry entry; only the Airflow connection says where Spark runs."""
    cluster = {"conn_type": "spark", "host": "spark://10.1.2.3", "port": 7077, "extra": {"deploy-mode": "client"}}
    yarn = {"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster", "queue": "etl"}}
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_STANDALONE", json.dumps(cluster))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN", json.dumps(yarn))
    standalone = _command(make_cfg(spark={"conn_id": "spark_standalone"}))
    assert standalone[standalone.index("--master") + 1] == "spark://10.1.2.3:7077"
    on_yarn = _command(make_cfg(spark={"conn_id": "spark_yarn"}))
    assert on_yarn[on_yarn.index("--master") + 1] == "yarn"
    assert on_yarn[on_yarn.index("--deploy-mode") + 1] == "cluster"
    assert on_yarn[on_yarn.index("--queue") + 1] == "etl"


def test_hadoop_aws_must_match_the_hadoop_spark_ships(make_cfg: Callable[..., TableConfig]) -> None:
    shipped = spark_hadoop_version()
    assert shipped == "3.5.0", "pyspark 4.2.0 ships hadoop-client-api 3.5.0; update the README if this changes"
    assert check_jars(make_cfg(spark={"jars": JARS}), shipped) == []
    (problem,) = check_jars(make_cfg(spark={"jars": ["/x/hadoop-aws-3.4.1.jar"]}), shipped)
    assert "use hadoop-aws-3.5.0.jar" in problem


@pytest.mark.parametrize("jar", ["a.jar,b.jar", "/x/../y.jar", "lib/thing.zip", "x y.jar", "x'.jar"])
def test_unsafe_jar_entries_are_refused(make_cfg: Callable[..., TableConfig], jar: str) -> None:
    with pytest.raises(Exception, match=r"spark\.jars") as err:
        make_cfg(spark={"jars": [jar]})
    assert "must be a path or URI ending in .jar" in str(err.value)


def test_registry_error_type_for_jars(tmp_path: Any) -> None:
    """Loaded from a file, the error names the file, the table and the field."""
    import yaml
    from conftest import student_doc

    from cdc_compaction.core.registry import load_registry

    doc = student_doc(tmp_path / "lake", "jars", spark={"jars": ["a.jar,b.jar"]})
    (tmp_path / "tests.jars.yaml").write_text(yaml.safe_dump(doc))
    (entry,) = load_registry(tmp_path)
    assert isinstance(entry.error, RegistryError)
    assert "tests.jars.yaml" in str(entry.error) and "spark.jars" in str(entry.error)


def test_spark_sql_variable_substitution_is_off_in_every_submission(
    make_cfg: Callable[..., TableConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Registry text (column comments) reaches Spark SQL; ``${env:HOME}`` in it must stay text.

    Off in the DDL submission and in the compaction (spark-submit and EMR), even when the
    registry's own spark.conf tries to turn it back on.
    """
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from cdc_compaction.core.settings import MetastoreEndpoint
    from cdc_compaction.integrations.engine import SparkSubmitEngine, emr_steps

    key = "spark.sql.variable.substitute"
    emr = {"job_flow_id": "j-ABC123", "application": "s3://code-bucket/jobs/compact.py"}
    cfg = make_cfg(spark={"conf": {key: "true"}, "engine": "emr", "emr": emr})
    assert _confs(_command(make_cfg(spark={"conf": {key: "true"}})))[key] == "false"
    (step,) = emr_steps(cfg, "/lake/plans/p.json")
    assert _confs(step["HadoopJarStep"]["Args"])[key] == "false"

    commands: list[list[str]] = []
    monkeypatch.setattr(
        SparkSubmitHook,
        "submit",
        lambda self, application: commands.append(self._build_spark_submit_command(application)),
    )
    SparkSubmitEngine(MetastoreEndpoint("127.0.0.1", 9083), "/tmp/warehouse").run_sql(cfg, ["SELECT 1"])
    (ddl,) = commands
    assert _confs(ddl)[key] == "false"


# ------------------------------------------------------------------ spark_connect
def test_spark_connect_compact_task_runs_in_the_task_and_reads_the_url_from_the_connection(
    make_cfg: Callable[..., TableConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.providers.standard.operators.python import PythonOperator

    from cdc_compaction.airflow.factory import PLAN_XCOM, _runtime
    from cdc_compaction.integrations.engine import ConnectEngine

    cfg = make_cfg(spark={"engine": "spark_connect", "conf": {"spark.sql.shuffle.partitions": "8"}})
    assert cfg.spark.conn_id == "spark_connect_default"  # a connection of type spark_connect, not spark-submit's
    op = build_dag(cfg).get_task("compact")
    assert isinstance(op, PythonOperator) and op.op_kwargs == {"plan_path": PLAN_XCOM}
    conn = {"conn_type": "spark_connect", "host": "10.1.2.3", "port": 15002, "login": "etl"}
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", json.dumps(conn))
    monkeypatch.setenv("AIRFLOW_CONN_HIVE_METASTORE_DEFAULT", json.dumps({"conn_type": "hive_metastore"}))
    engine = _runtime(cfg).engine  # ensure_tables' DDL and the compaction: the same server
    assert isinstance(engine, ConnectEngine)
    assert engine.url == "sc://10.1.2.3:15002/;user_id=etl" and engine.cfg is cfg


@pytest.mark.parametrize(
    ("field", "value"),
    [("jars", ["/x/a.jar"]), ("driver_memory", "2g"), ("executor_memory", "2g")],
)
def test_spark_connect_refuses_what_only_the_server_can_set(
    make_cfg: Callable[..., TableConfig], field: str, value: Any
) -> None:
    with pytest.raises(
        Exception, match=rf"field '{field}': engine 'spark_connect'.*set {field} where the server starts"
    ):
        make_cfg(spark={"engine": "spark_connect", field: value})


def test_a_stale_plan_fails_at_once_a_lost_server_is_retried() -> None:
    import grpc

    from cdc_compaction.core.exceptions import PermanentCompactionError, SparkConnectLostError, is_permanent
    from cdc_compaction.integrations.engine import connect_lost

    class Unavailable(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

    class Denied(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.PERMISSION_DENIED

    assert is_permanent(PermanentCompactionError("stale plan"))
    assert not is_permanent(SparkConnectLostError("server gone"))
    wrapped = RuntimeError("write failed")
    wrapped.__cause__ = Unavailable()
    assert connect_lost(Unavailable()) and connect_lost(wrapped)
    assert not connect_lost(Denied()) and not connect_lost(ValueError("bad column"))
    assert connect_lost(RuntimeError("[INVALID_HANDLE.SESSION_NOT_FOUND] the server restarted"))


def test_no_server_behind_the_url_is_a_lost_server_not_a_ddl_error(make_cfg: Callable[..., TableConfig]) -> None:
    """Nothing listens at the URL: the task fails as transient (Airflow retries), and the process stays classic."""
    import os

    from cdc_compaction.core.exceptions import SparkConnectLostError
    from cdc_compaction.devtools.local_services import free_port
    from cdc_compaction.integrations.engine import ConnectEngine

    cfg = make_cfg(spark={"engine": "spark_connect"})
    mark = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
    with pytest.raises(
        SparkConnectLostError, match=r"DDL for tests\..*lost the Spark Connect server sc://127\.0\.0\.1"
    ):
        ConnectEngine(f"sc://127.0.0.1:{free_port()}", cfg, client_retries=1).run_sql(cfg, ["SELECT 1"])
    assert os.environ.get("SPARK_CONNECT_MODE_ENABLED") == mark


# Credential keys as the stores' connectors name them (Hadoop S3A, ABFS, Spark's executor
# environment), written out by hand: none may be accepted from a registry file.
CREDENTIAL_KEYS = [
    ("hadoop_conf", "fs.s3a.session.token"),
    ("hadoop_conf", "fs.s3a.secret.key"),
    ("hadoop_conf", "fs.s3a.access.key"),
    ("hadoop_conf", "fs.s3a.bucket.lake.secret.key"),
    ("hadoop_conf", "fs.azure.account.key.acct.dfs.core.windows.net"),
    ("hadoop_conf", "fs.azure.sas.container.acct.blob.core.windows.net"),
    ("conf", "spark.executorEnv.AWS_SECRET_ACCESS_KEY"),
    ("conf", "spark.executorEnv.AWS_ACCESS_KEY_ID"),
    ("conf", "spark.yarn.appMasterEnv.AWS_SESSION_TOKEN"),
    ("conf", "spark.hadoop.fs.s3a.access.key"),
    ("conf", "spark.hadoop.fs.s3a.session.token"),
    ("conf", "spark.ssl.keyPassword"),
    ("conf", "spark.kubernetes.authenticate.submission.oauthToken"),
]


@pytest.mark.parametrize(("field", "key"), CREDENTIAL_KEYS)
def test_credentials_in_the_registry_spark_conf_are_refused(tmp_path: Any, field: str, key: str) -> None:
    """Registry values are data: a credential key is refused, naming the file, the field and where it belongs."""
    import yaml
    from conftest import student_doc

    from cdc_compaction.core.registry import load_registry

    doc = student_doc(tmp_path / "lake", "creds", spark={field: {key: "AKIAEXAMPLEVALUE"}})
    (tmp_path / "tests.creds.yaml").write_text(yaml.safe_dump(doc))
    (entry,) = load_registry(tmp_path)
    assert isinstance(entry.error, RegistryError), key
    text = str(entry.error)
    assert "tests.creds.yaml" in text and f"spark.{field}" in text and key in text
    assert "credential" in text and "instance profile" in text and "Airflow connection" in text
    assert "AKIAEXAMPLEVALUE" not in text


@pytest.mark.parametrize(
    "key",
    [
        "fs.s3a.aws.credentials.provider",
        "fs.s3a.endpoint",
        "fs.azure.account.auth.type",
        "spark.sql.shuffle.partitions",
    ],
)
def test_settings_that_name_no_credential_stay_accepted(make_cfg: Callable[..., TableConfig], key: str) -> None:
    assert make_cfg(spark={"hadoop_conf": {key: "x"}}).spark.hadoop_conf == {key: "x"}


def test_the_logged_spark_submit_command_masks_every_credential(
    make_cfg: Callable[..., TableConfig], caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """A safety net for what reaches the command by another way than the registry (here: set on the task)."""
    op = build_dag(make_cfg()).get_task("compact")
    op.application_args = ["--plan", "/lake/t/_cdc/plans/p.json"]
    secrets = {
        "spark.hadoop.fs.s3a.session.token": "SESSIONTOKENVALUE",
        "spark.hadoop.fs.s3a.access.key": "ACCESSKEYVALUE",
        "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net": "ACCOUNTKEYVALUE",
        "spark.executorEnv.AWS_SECRET_ACCESS_KEY": "SECRETVALUE",
        "spark.driver.extraJavaOptions": "-Dfs.s3a.secret.key=JAVAOPTVALUE",
        # Credentials under keys that name none: a URI's user info, a JDBC URL's password parameter.
        "spark.hadoop.hive.metastore.uris": "thrift://hive:URIPASSWORDVALUE@metastore:9083",
        "spark.hadoop.javax.jdo.option.ConnectionURL": "jdbc:postgresql://h/db?user=u&password=JDBCPASSWORDVALUE",
        "spark.executor.extraJavaOptions": "-Dx=1 -Djavax.net.ssl.trustStorePassword=TRUSTSTOREVALUE",
    }
    op.conf = {**op.conf, **secrets}
    hook = op._get_hook()
    with caplog.at_level("INFO"):
        cmd = hook._build_spark_submit_command(op.application)
    assert "SESSIONTOKENVALUE" in " ".join(cmd)  # the command itself is unchanged: only its log is masked
    logged = caplog.text + capsys.readouterr().out  # Airflow's task logger writes to stdout here
    assert "Spark-Submit cmd" in logged
    assert "spark.hadoop.fs.s3a.session.token=******" in logged
    for value in secrets.values():
        secret = re.search(r"[A-Z]+VALUE", value).group(0)  # type: ignore[union-attr]
        assert secret not in logged, value
    assert "thrift://hive:******@metastore:9083" in logged, "the URI stays readable but its password"
    assert "spark.sql.session.timeZone=UTC" in logged  # what is not a credential stays readable


@pytest.mark.s3
def test_a_lake_on_s3_gets_s3a_from_the_storage_connection_when_the_task_runs(
    make_cfg: Callable[..., TableConfig], aws_default: str
) -> None:
    """The compact task's spark-submit of a table on ``s3a://``: the S3A jars of the jar cache, the
    ``aws_default`` connection's endpoint, and its credentials in the process environment only."""
    cfg = make_cfg(storage_root="s3a://lake-bucket/lake/t", spark={"hadoop_conf": {"fs.s3a.connection.maximum": "8"}})
    op = build_dag(cfg).get_task("compact")
    op.application_args = ["--plan", "s3a://lake-bucket/lake/t/_cdc/plans/p.json"]
    hook = op._get_hook()
    cmd = hook._build_spark_submit_command(op.application)
    jars = [posixpath.basename(j) for j in cmd[cmd.index("--jars") + 1].split(",")]
    assert "hadoop-aws-3.5.0.jar" in jars and "bundle-2.35.4.jar" in jars
    confs = _confs(cmd)
    assert confs["spark.hadoop.fs.s3a.endpoint"] == aws_default
    assert confs["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert confs["spark.hadoop.fs.s3a.endpoint.region"] == "us-east-1"
    assert confs["spark.hadoop.fs.s3a.connection.maximum"] == "8"  # the registry's own setting stays
    # The connection's secret is nowhere on the command line: it is in the process's environment.
    assert not [a for a in cmd if "testing-secret-key" in a or "testing-access-key" in a]
    assert hook._env_vars["AWS_ACCESS_KEY_ID"] == "testing-access-key"
    assert hook._env_vars["AWS_SECRET_ACCESS_KEY"] == "testing-secret-key"
