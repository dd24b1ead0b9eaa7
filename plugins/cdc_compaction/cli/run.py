"""Running a table's pipeline by hand, outside Airflow: ``step STEP DB.TABLE`` and ``rebuild DB.TABLE``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from cdc_compaction.cli.common import add_table_args, table_config
from cdc_compaction.core import settings
from cdc_compaction.pipeline.order import STEP_IDS


def _step(args: argparse.Namespace) -> int:
    """One step of a table's run, as its DAG task does it (the compaction in a local SparkSession)."""
    import json

    from cdc_compaction.core.lake import Lake
    from cdc_compaction.core.settings import MetastoreEndpoint
    from cdc_compaction.pipeline import order
    from cdc_compaction.pipeline.runtime import Runtime

    cfg = table_config(args)
    # host:port, thrift://host:port or h1,h2 (see settings.metastore_hosts), as a connection's host is written.
    endpoint = MetastoreEndpoint.parse(args.metastore)

    class _LazySession:
        """Starts Spark only for the steps that need it (a JVM costs 10-15 s)."""

        def _engine(self) -> Any:
            from cdc_compaction.integrations.engine import SessionEngine, local_session

            return SessionEngine(local_session(endpoint, args.warehouse, app_name=f"cdc-step-{args.step}"))

        def run_sql(self, c: Any, statements: list[str]) -> None:
            self._engine().run_sql(c, statements)

        def compact(self, plan: dict[str, Any]) -> dict[str, Any]:
            return self._engine().compact(plan)

    rt = Runtime(cfg=cfg, lake=Lake(cfg), metastore=endpoint, engine=_LazySession())
    step = order.step(args.step)
    if step.takes_plan and not args.plan:
        print(f"step {args.step} needs --plan (the path the plan step printed)", file=sys.stderr)
        return 2
    if args.force and step.id != order.PLAN:
        print("--force applies to the plan step only (it decides whether the run compacts)", file=sys.stderr)
        return 2
    if args.force:
        result = step.function()(rt, run_id=args.run_id, force=True)
    else:
        result = step.call(rt, args.plan or "", args.run_id)
    print(json.dumps(result, default=str))
    return 0


def _rebuild(args: argparse.Namespace) -> int:
    """``rebuild DB.TABLE``: replay the archived increments and compare with the live version (README, "Rebuild")."""
    from cdc_compaction.core.exceptions import CdcCompactionError
    from cdc_compaction.core.lake import Lake
    from cdc_compaction.core.settings import MetastoreEndpoint
    from cdc_compaction.integrations.engine import SessionEngine, local_session
    from cdc_compaction.pipeline.rebuild import check_rebuildable, rebuild
    from cdc_compaction.pipeline.runtime import Runtime

    try:
        cfg = table_config(args)
        check_rebuildable(cfg)  # before Spark starts: a JVM costs 10-15 s
        endpoint = MetastoreEndpoint.parse(args.metastore)
        engine = SessionEngine(local_session(endpoint, args.warehouse, app_name=f"cdc-rebuild-{cfg.qualified_name}"))
        rt = Runtime(cfg=cfg, lake=Lake(cfg), metastore=endpoint, engine=engine)
        report = rebuild(rt, since=args.since, publish=args.publish, force=args.force)
    except CdcCompactionError as exc:
        print(f"rebuild: {exc}", file=sys.stderr)
        return 1
    for line in report.lines():
        print(line)
    # Exit 1 on a difference: a scheduled verification fails loudly.
    return 0 if report.equal else 1


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``step`` and ``rebuild``."""
    st = sub.add_parser("step", help="run one step of a table's run by hand")
    st.add_argument("step", choices=STEP_IDS)
    add_table_args(st)
    st.add_argument("--plan", help="the plan file (the steps after plan that read it: compact, validate, ...)")
    st.add_argument("--run-id", default="manual", help="plan: the run id that owns the lease and the plan")
    st.add_argument(
        "--force",
        action="store_true",
        help="plan: compact whatever is pending, regardless of compaction.policy (the DAG param compact: force)",
    )
    st.add_argument(
        "--metastore", default=os.environ.get("CDC_METASTORE", "127.0.0.1:9083"), help="HOST:PORT or thrift://HOST:PORT"
    )
    st.add_argument("--warehouse", default=str(settings.PROJECT_ROOT / ".lake" / "warehouse"))
    st.set_defaults(func=_step)

    rb = sub.add_parser(
        "rebuild", help="recompute a table from its archived increments and compare it with the live one"
    )
    add_table_args(rb)
    rb.add_argument("--since", metavar="INCREMENT", help="start at the newest kept version before this increment")
    how = rb.add_mutually_exclusive_group()
    how.add_argument("--verify-only", action="store_true", help="compare only, publish nothing (the default)")
    how.add_argument("--publish", action="store_true", help="publish the rebuilt version as a new commit")
    rb.add_argument("--force", action="store_true", help="with --publish: publish even if it differs from live")
    rb.add_argument(
        "--metastore", default=os.environ.get("CDC_METASTORE", "127.0.0.1:9083"), help="HOST:PORT or thrift://HOST:PORT"
    )
    rb.add_argument("--warehouse", default=str(settings.PROJECT_ROOT / ".lake" / "warehouse"))
    rb.set_defaults(func=_rebuild)
