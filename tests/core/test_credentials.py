"""Credentials in registry values are refused, and every logged command masks them (issue 35).

Registry files are data in git and in the logged spark-submit command: a password inside a JDBC URL,
user info in any URI (``s3a://KEY:SECRET@bucket``), a ``-D...secret...=`` inside Java options is a
credential even under a key that names none. The expectations are written from the inputs: the
secret each case puts in, never the project's rule.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import fuzz_settings, student_doc
from hypothesis import assume, given
from hypothesis import strategies as st

from cdc_compaction.core.credentials import mask_credentials
from cdc_compaction.core.exceptions import RegistryError
from cdc_compaction.core.registry import load_registry

#: (where in the entry, the value, the secret it holds): each a credential under a key that names none.
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    (
        "spark.conf",
        {
            "spark": {
                "conf": {"spark.hadoop.javax.jdo.option.ConnectionURL": "jdbc:postgresql://h/db?user=u&password=PW1x"}
            }
        },
        "PW1x",
    ),
    ("spark.conf", {"spark": {"conf": {"spark.hadoop.hive.metastore.uris": "thrift://user:PW2x@host:9083"}}}, "PW2x"),
    (
        "spark.hadoop_conf",
        {"spark": {"hadoop_conf": {"fs.defaultFS": "s3a://AKIAKEY:SECRET3x@bucket/path"}}},
        "SECRET3x",
    ),
    (
        "spark.conf",
        {"spark": {"conf": {"spark.driver.extraJavaOptions": "-Dlog4j.debug=true -Dfs.s3a.secret.key=SECRET4x"}}},
        "SECRET4x",
    ),
    (
        "spark.conf",
        {"spark": {"conf": {"spark.executor.extraJavaOptions": "-Djavax.net.ssl.trustStorePassword='SECRET 5x'"}}},
        "SECRET 5x",
    ),
    (
        "spark.conf",
        {"spark": {"conf": {"spark.sql.catalog.pg.url": "jdbc:sqlserver://h;user=u;password=PW6x;encrypt=true"}}},
        "PW6x",
    ),
    ("spark.jars", {"spark": {"jars": ["s3a://AKIA:SECRET7x@bucket/jars/x.jar"]}}, "SECRET7x"),
    ("spark.jars", {"spark": {"jars": ["https://user:PW8x@repo.example.com/x.jar"]}}, "PW8x"),
    ("storage_root", {"storage_root": "s3a://KEY:SECRET9x@bucket/lake/t"}, "SECRET9x"),
    ("views.duckdb", {"views": {"duckdb": "s3://KEY:SECRET10x@bucket/views/t.sql"}}, "SECRET10x"),
    (
        "spark.emr.application",
        {"spark": {"engine": "emr", "emr": {"job_flow_id": "j-ABC", "application": "s3://K:SECRET11x@b/compact.py"}}},
        "SECRET11x",
    ),
    ("description", {"description": "copied from postgresql://app:PW12x@db.internal/shop"}, "PW12x"),
]


def _merge(doc: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    for k, v in over.items():
        doc[k] = _merge(dict(doc.get(k) or {}), v) if isinstance(v, dict) else v
    return doc


def _registry_file(tmp_path: Path, name: str) -> Path:
    """A registry file in a directory of its own, beside the lake (a root inside the registry is refused)."""
    (tmp_path / "registry").mkdir(exist_ok=True)
    return tmp_path / "registry" / name


@pytest.mark.parametrize(("field", "over", "secret"), REFUSED, ids=[f"{c[0]}-{i}" for i, c in enumerate(REFUSED)])
def test_credentials_in_any_registry_value_are_refused(
    tmp_path: Path, field: str, over: dict[str, Any], secret: str
) -> None:
    """Refused naming the file, its line, the field and where credentials belong; the secret is not repeated."""
    doc = _merge(student_doc(tmp_path / "lake", "creds"), over)
    _registry_file(tmp_path, "tests.creds.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (entry,) = load_registry(tmp_path / "registry")
    assert isinstance(entry.error, RegistryError), (field, over)
    text = str(entry.error)
    assert re.search(r"tests\.creds\.yaml:\d+:\d+", text), text
    assert f"field '{field}" in text and "credential" in text, text
    assert "instance profile" in text and "Airflow connection" in text, text
    for part in secret.split():
        assert part not in text, text


def test_credentials_in_a_database_defaults_file_are_refused(tmp_path: Path) -> None:
    (tmp_path / "registry" / "tests").mkdir(parents=True)
    (tmp_path / "registry" / "tests" / "_database.yaml").write_text(
        "spark:\n  conf:\n    spark.hadoop.hive.metastore.uris: thrift://u:DEFAULTPW@metastore:9083\n"
    )
    _registry_file(tmp_path, "tests.creds.yaml").write_text(yaml.safe_dump(student_doc(tmp_path / "lake", "creds")))
    (entry,) = load_registry(tmp_path / "registry")
    text = str(entry.error)
    assert entry.error is not None and "_database.yaml:3" in text and "credential" in text, text
    assert "DEFAULTPW" not in text


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("conf", {"spark.driver.extraJavaOptions": "-Dlog4j.configurationFile=file:/etc/spark/log4j2.properties"}),
        ("conf", {"spark.hadoop.hive.metastore.uris": "thrift://metastore:9083"}),
        ("conf", {"spark.hadoop.javax.jdo.option.ConnectionURL": "jdbc:postgresql://h/db?user=hive&ssl=true"}),
        (
            "hadoop_conf",
            {"fs.s3a.aws.credentials.provider": "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider"},
        ),
        ("jars", ["s3a://bucket/jars/x.jar"]),
    ],
)
def test_values_without_a_credential_stay_accepted(tmp_path: Path, field: str, value: Any) -> None:
    doc = student_doc(tmp_path / "lake", "fine", spark={field: value})
    _registry_file(tmp_path, "tests.fine.yaml").write_text(yaml.safe_dump(doc))
    (entry,) = load_registry(tmp_path / "registry")
    assert entry.error is None, str(entry.error)


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("--conf spark.hadoop.hive.metastore.uris=thrift://user:pw@host:9083", "thrift://user:******@host:9083"),
        ("s3a://KEY:SECRET@bucket/path", "s3a://KEY:******@bucket/path"),
        ("jdbc:postgresql://h/db?user=u&password=pw", "jdbc:postgresql://h/db?user=u&password=******"),
        ("'-Dfs.s3a.secret.key=abc -Dx=1'", "'-Dfs.s3a.secret.key=****** -Dx=1'"),
        ('"-Dx=1 -Dspark.ssl.keyPassword=abc"', '"-Dx=1 -Dspark.ssl.keyPassword=******"'),
        ("password='a b c' host=h", "password='******' host=h"),
        ("postgresql://u:p@ss@h/db", "postgresql://u:******@h/db"),
    ],
)
def test_mask_credentials_examples(text: str, masked: str) -> None:
    assert masked in mask_credentials(text)


# -- random commands -------------------------------------------------------------------------------
_PREFIX = st.lists(
    st.sampled_from(
        ["spark", "hadoop", "fs", "s3a", "azure", "bucket", "mybucket", "ssl", "yarn", "hive", "jdbc", "x1"]
    ),
    max_size=4,
)
_WORDS = st.sampled_from(
    ["secret", "password", "passwd", "token", "access.key", "secret.key", "session.token", "account.key", "api.key",
     "AWS_SECRET_ACCESS_KEY", "keyStorePassword", "oauthToken", "sas.token", "signature"]
)  # fmt: skip


@st.composite
def credential_keys(draw: st.DrawFn) -> str:
    parts = [*draw(_PREFIX), draw(_WORDS)]
    key = draw(st.sampled_from([".", "_", "-"])).join(parts)
    return draw(st.sampled_from([key, key.upper(), key.lower()]))


_NO_SPACE = "abcdefghijkXYZ0123456789-._~!$%+,;:@/?#&=()[]"
_URI_SAFE = "abcdefghijkXYZ0123456789-._~!$%+,;&="


def secrets(alphabet: str) -> st.SearchStrategy[str]:
    return st.text(st.sampled_from(alphabet), min_size=6, max_size=14)


@st.composite
def fragment(draw: st.DrawFn) -> tuple[str, str, str]:
    """(a piece of a command with \\0 where its secret goes, the secret, what must still be shown of it)."""
    form = draw(st.sampled_from(["conf", "quoted", "pair_quoted", "javaopt", "uri", "jdbc_query", "jdbc_semicolon"]))
    key = draw(credential_keys())
    if form == "conf":
        s = draw(secrets(_NO_SPACE))
        return f"--conf {key}=\0", s, f"--conf {key}="
    if form == "quoted":
        q = draw(st.sampled_from(["'", '"']))
        s = draw(secrets(_NO_SPACE + " "))
        return f"--conf {key}={q}\0{q}", s, f"{key}={q}"
    if form == "pair_quoted":
        q = draw(st.sampled_from(["'", '"']))
        s = draw(secrets(_NO_SPACE))
        return f"--conf {q}{key}=\0{q}", s, f"{q}{key}="
    if form == "javaopt":
        q = draw(st.sampled_from(["'", '"', ""]))
        s = draw(secrets(_NO_SPACE))
        opts = f"-Dlog4j.debug=true -D{key}=\0 -Duser.timezone=UTC"
        return f"--conf spark.driver.extraJavaOptions={q}{opts}{q}", s, "-Duser.timezone=UTC"
    user = draw(st.text(st.sampled_from("abcuserXYZ09_"), min_size=1, max_size=8))
    host = draw(st.sampled_from(["host:9083", "bucket", "db.internal:5432", "10.0.0.1"]))
    if form == "uri":
        scheme = draw(st.sampled_from(["s3a", "thrift", "jdbc:postgresql", "https", "hdfs", "x-y+z"]))
        s = draw(secrets(_URI_SAFE))
        where = draw(st.sampled_from(["--conf spark.hadoop.fs.defaultFS=", "--jars ", "--conf 'spark.x.uri=", ""]))
        end = "'" if where.endswith("=") and "'" in where else ""
        return f"{where}{scheme}://{user}:\0@{host}/path{end}", s, f"{scheme}://{user}:"
    s = draw(secrets(_URI_SAFE.replace("&", "").replace(";", "")))
    if form == "jdbc_query":
        return f"--conf spark.x.url=jdbc:postgresql://{host}/db?user={user}&password=\0", s, f"?user={user}&password="
    return f"--conf spark.x.url=jdbc:sqlserver://{host};user={user};password=\0", s, f";user={user};password="


@fuzz_settings(test_examples=300)
@given(parts=st.lists(fragment(), min_size=1, max_size=5), safe_first=st.booleans())
def test_no_secret_survives_mask_credentials(parts: list[tuple[str, str, str]], safe_first: bool) -> None:
    """Random credential keys, URIs and quoting: every secret put in is gone, the rest stays readable."""
    safe = "--conf spark.sql.shuffle.partitions=SAFEVALUE"
    templates = [t for t, _, _ in parts]
    skeleton = " ".join([safe, *templates] if safe_first else [*templates, safe])
    for _, s, _ in parts:
        assume(s not in skeleton)  # a secret that is also other text (a user name, a key) proves nothing
    pieces = [t.replace("\0", s) for t, s, _ in parts]
    text = " ".join([safe, *pieces] if safe_first else [*pieces, safe])
    masked = mask_credentials(text)
    for piece, s, shown in parts:
        assert s not in masked, (piece, masked)
        assert shown in masked, (shown, masked)
    assert "spark.sql.shuffle.partitions=SAFEVALUE" in masked
