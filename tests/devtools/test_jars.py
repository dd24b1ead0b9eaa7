"""The pinned jar cache (``make jars``): Maven fetches, the sha256 of jars.lock decides, a stamp makes it idempotent."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from cdc_compaction.devtools import jars

pytestmark = pytest.mark.skipif(shutil.which("mvn") is None, reason="Maven is installed by .ci/run")

#: A small jar of the real lock: the test fetches it for real from Maven Central (or Maven's local repository).
SMALL = "org.slf4j:slf4j-api:1.7.36"


def _small_line() -> str:
    return next(line for line in jars.LOCK.read_text().splitlines() if line.startswith(SMALL + " "))


def test_the_lock_parses_into_its_groups() -> None:
    listed = jars.read_lock()
    assert {j.purpose for j in listed} == {
        *("kafka", "connect", "debezium", "spark", "s3a", "delta-spark", "iceberg-spark", "trino"),
        *("hive4-metastore", "hive4", "apicurio-converter", "apicurio-registry"),
    }
    coords = {(j.purpose, j.coordinate) for j in listed}
    assert ("kafka", "org.apache.kafka:kafka_2.13:4.4.0") in coords
    assert ("connect", "org.apache.kafka:connect-runtime:4.3.1") in coords
    assert ("connect", "org.apache.kafka:connect-json:4.3.1") in coords
    assert ("debezium", "io.debezium:debezium-connector-postgres:3.6.1.Final") in coords
    assert ("spark", "org.apache.spark:spark-avro_2.13:4.2.0") in coords
    # hadoop-aws is exactly pyspark 4.2.0's Hadoop (hadoop-client-api-3.5.0), with the SDK bundle its POM names.
    assert ("s3a", "org.apache.hadoop:hadoop-aws:3.5.0") in coords
    assert ("s3a", "software.amazon.awssdk:bundle:2.35.4") in coords
    # delta-spark built for pyspark 4.2 (Scala 2.13), with the delta-storage it needs.
    assert ("delta-spark", "io.delta:delta-spark_4.2_2.13:4.4.0") in coords
    assert ("delta-spark", "io.delta:delta-storage:4.4.0") in coords
    # HiveServer2 and the engine of the Hive views, with the antlr-runtime its parser needs (not Maven's 3.3).
    assert ("hive4", "org.apache.hive:hive-service:4.0.1") in coords
    assert ("hive4", "org.apache.hive:hive-exec:4.0.1") in coords
    assert ("hive4", "org.antlr:antlr-runtime:3.5.2") in coords
    # Iceberg's runtime is built for Spark 4.1 (none for 4.2), with the JDBC driver of the SQLite catalog.
    assert ("iceberg-spark", "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0") in coords
    assert ("iceberg-spark", "org.xerial:sqlite-jdbc:3.54.1.0") in coords
    # Trino's server is one tar.gz, unpacked by make jars (its own plugins and launcher inside).
    assert [(j.coordinate, j.type) for j in listed if j.purpose == "trino"] == [("io.trino:trino-server:476", "tar.gz")]
    # The Hive 4 test metastore is one tar.gz too (its lib/ and schema scripts), 4.0.0: 4.0.1 removed the get_table
    # call pyiceberg 0.12 makes. Hadoop's jars are its build's 3.3.6, beside it.
    # The schema registry is Apicurio's Quarkus app, one tar.gz; its Connect converter is the 2.6 line's (the 3.x
    # converter's dependencies are not on Maven Central), without Kafka's jars (Connect gives those).
    assert [(j.coordinate, j.type) for j in listed if j.purpose == "apicurio-registry"] == [
        ("io.apicurio:apicurio-registry-app:3.3.3:all", "tar.gz")
    ]
    converter = {j.coordinate for j in listed if j.purpose == "apicurio-converter"}
    assert "io.apicurio:apicurio-registry-utils-converter:2.6.13.Final" in converter and len(converter) == 23
    assert not [c for c in converter if c.startswith("org.apache.kafka:")]
    hive4 = {(j.coordinate, j.type) for j in listed if j.purpose == "hive4-metastore"}
    assert ("org.apache.hive:hive-standalone-metastore-server:4.0.0:bin", "tar.gz") in hive4
    assert ("org.apache.hadoop:hadoop-client-api:3.3.6", "jar") in hive4
    # One Debezium version throughout; Connect's own classes stay out of the plugin directory.
    assert {j.version for j in listed if j.group == "io.debezium"} == {"3.6.1.Final"}
    assert not [j for j in listed if j.purpose == "debezium" and j.group == "org.apache.kafka"]


def test_fetch_checks_stamps_and_then_does_nothing(tmp_path: Path) -> None:
    lock = tmp_path / "jars.lock"
    lock.write_text(f"# [logging] one small jar\n{_small_line()}\n")
    dest = tmp_path / "cache"
    jars.fetch(dest, lock)
    jar = dest / "logging" / "slf4j-api-1.7.36.jar"
    assert hashlib.sha256(jar.read_bytes()).hexdigest() == _small_line().split()[1]
    assert jars.group_dir("logging", dest, lock) == dest / "logging"
    # The stamp matches: a second fetch does not even look for Maven.
    jars.fetch(dest, lock, mvn="no-such-maven")
    # A changed lock makes the cache stale: services refuse it rather than download.
    lock.write_text(lock.read_text() + "# a comment changes the lock's hash\n")
    with pytest.raises(jars.JarError, match="run `make jars`"):
        jars.group_dir("logging", dest, lock)


def test_a_jar_whose_sha256_differs_is_refused_by_name(tmp_path: Path) -> None:
    coordinate, _sha = _small_line().split()
    lock = tmp_path / "jars.lock"
    lock.write_text(f"# [logging]\n{coordinate} {'0' * 64}\n")
    with pytest.raises(jars.JarError, match=r"org\.slf4j:slf4j-api:1\.7\.36 .*sha256 [0-9a-f]{64} is not the 0{64}"):
        jars.fetch(tmp_path / "cache", lock)
    assert not (tmp_path / "cache" / "logging").exists()
    assert not jars.is_current(tmp_path / "cache", lock)


#: A small tar.gz on Maven Central (airlift's launcher, which Trino's server ships), checked against Central's sha1
#: 6c4c0b4c9a4ce0cbdcbf23652ae5f2e8e6173c84 when this line was written.
SMALL_TAR = "io.airlift:launcher:303:bin@tar.gz 1b3fd1148ff94fb778b5b977bbd1f95316e3c051b58d6f6243ab2fa43f1f30e9"


def test_a_tar_gz_is_checked_then_unpacked_into_its_group(tmp_path: Path) -> None:
    lock = tmp_path / "jars.lock"
    lock.write_text(f"# [tools] an archive and a jar in one group\n{SMALL_TAR}\n{_small_line()}\n")
    dest = tmp_path / "cache"
    jars.fetch(dest, lock)
    group = dest / "tools"
    # Unpacked as the archive lays it out, executables kept executable; the checked archive itself is not kept.
    launcher = group / "bin" / "linux-amd64" / "launcher"
    assert launcher.is_file() and os.access(launcher, os.X_OK)
    assert not (group / "launcher-303-bin.tar.gz").exists()
    assert (group / "slf4j-api-1.7.36.jar").is_file()
    # The group's jars (a classpath's entries) are still its jars only: nothing of the archive's tree.
    assert [p.name for p in sorted(jars.group_dir("tools", dest, lock).glob("*.jar"))] == ["slf4j-api-1.7.36.jar"]


def test_a_tar_gz_whose_sha256_differs_is_refused_before_unpacking(tmp_path: Path) -> None:
    coordinate = SMALL_TAR.split()[0]
    lock = tmp_path / "jars.lock"
    lock.write_text(f"# [tools]\n{coordinate} {'0' * 64}\n")
    with pytest.raises(jars.JarError, match=r"io\.airlift:launcher:303:bin .*sha256 [0-9a-f]{64} is not the 0{64}"):
        jars.fetch(tmp_path / "cache", lock)
    assert not (tmp_path / "cache" / "tools").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("# [x]\norg.slf4j:slf4j-api 123\n", r"jars.lock:2: .* is not 'group:artifact:version"),
        (f"{SMALL} {'a' * 64}\n", r"jars.lock:1: slf4j-api comes before any '# \[group\]' line"),
    ],
)
def test_a_malformed_lock_names_its_line(tmp_path: Path, text: str, message: str) -> None:
    lock = tmp_path / "jars.lock"
    lock.write_text(text)
    with pytest.raises(jars.JarError, match=message):
        jars.read_lock(lock)
