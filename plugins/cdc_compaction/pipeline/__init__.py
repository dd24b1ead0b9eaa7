"""The steps of one compaction run, as plain functions, one module per responsibility.

The DAG wraps each step in a task; the in-process conformance runner, the CLI's ``step``
command and the benchmark call them directly -- all in the order :mod:`.order` writes
down once.  Each step is idempotent and safe to retry:

* ``ensure_tables`` (:mod:`.tables`) creates or extends the tables and views;
* ``plan`` (:mod:`.plan`) records the exact input files, so a retry reads the same input;
* ``compact`` (the Spark job; :mod:`.compact` in process) writes a new version directory
  beside the live one (never over it);
* ``validate`` (:mod:`.validate`) checks that version before anything is published;
* ``publish`` (:mod:`.publish`) creates the commit record (the one atomic decision), then
  moves the metastore location and the pointer; a retry rolls forward, never applies twice;
* ``archive`` (:mod:`.archive`) copies, verifies, then deletes -- only files of a committed version;
* ``refresh_view`` (:mod:`.views`) registers pending increments and keeps the views current.

Shared by them: :mod:`.runtime` (the runtime, the clock, plan files), :mod:`.pending`
(what the landing area holds for a run) and :mod:`.retention` (what may be deleted).

This package imports nothing itself: the DAG file reads :mod:`.order` at parse time,
which must not load Spark, the metastore client or pyarrow.
"""
