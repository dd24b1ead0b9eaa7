"""``job-package [--out DIR]``: build the Spark job's zip for spark-submit --py-files and print its path."""

from __future__ import annotations

import argparse


def _job_package(args: argparse.Namespace) -> int:
    from cdc_compaction.integrations.engine import job_package_dir
    from cdc_compaction.job import bundle

    print(bundle.build(args.out or job_package_dir()))
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``job-package``."""
    jp = sub.add_parser(
        "job-package",
        help="build the Spark job's zip for spark-submit --py-files (upload it next to spark.emr.application)",
    )
    jp.add_argument("--out", help="directory to write it to (default: $CDC_JOB_PACKAGE_DIR or .run/job-package)")
    jp.set_defaults(func=_job_package)
