"""Trino 476 runs on Java 24+: its JVM is found by version, or the start fails naming what to install."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_compaction.devtools.local_services import ServiceError
from cdc_compaction.devtools.trino import MIN_JAVA, find_java, java_release_major


def _jdk(root: Path, name: str, version: str) -> Path:
    """A JDK's layout as its packages install it: ``release`` names the version, ``bin/java`` runs it."""
    jdk = root / name
    (jdk / "bin").mkdir(parents=True)
    (jdk / "bin" / "java").write_text("")
    (jdk / "release").write_text(f'IMPLEMENTOR="Eclipse Adoptium"\nJAVA_VERSION="{version}"\n')
    return jdk


def test_the_oldest_jdk_new_enough_is_chosen_by_its_version_not_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.delenv("CDC_TRINO_JAVA_HOME", raising=False)
    _jdk(tmp_path, "java-17-openjdk-amd64", "17.0.13")
    _jdk(tmp_path, "zz-jdk", "24.0.2")
    _jdk(tmp_path, "aa-jdk", "25.0.3")
    assert find_java(dirs=(tmp_path,)) == tmp_path / "zz-jdk" / "bin" / "java"
    # JAVA_HOME wins when it is new enough, and is passed over when it is not.
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "aa-jdk"))
    assert find_java(dirs=(tmp_path,)) == tmp_path / "aa-jdk" / "bin" / "java"
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "java-17-openjdk-amd64"))
    assert find_java(dirs=(tmp_path,)) == tmp_path / "zz-jdk" / "bin" / "java"
    # CDC_TRINO_JAVA_HOME is Trino's alone (JAVA_HOME is Spark's too, which runs on 17): it wins.
    monkeypatch.setenv("CDC_TRINO_JAVA_HOME", str(tmp_path / "aa-jdk"))
    assert find_java(dirs=(tmp_path,)) == tmp_path / "aa-jdk" / "bin" / "java"


def test_without_a_new_enough_jdk_the_start_fails_naming_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.delenv("CDC_TRINO_JAVA_HOME", raising=False)
    _jdk(tmp_path, "java-17-openjdk-amd64", "17.0.13")
    with pytest.raises(ServiceError, match=r"needs Java 24 or newer.*java-17-openjdk-amd64 \(Java 17\).*install one"):
        find_java(dirs=(tmp_path,))


def test_this_machine_has_a_jdk_trino_runs_on() -> None:
    """Under /usr/lib/jvm, or the Java 25 runtime `make trino-java` installs: the Trino tests always find one."""
    java = find_java()
    assert (java_release_major(java.parents[1]) or 0) >= MIN_JAVA
