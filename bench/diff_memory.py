"""The change diff's peak resident memory at a table's size, in a fresh process (issue 38 item 2).

Two versions of ``bench/partitioned.py``'s 13 columns (files of 250,000 rows; the newer one with 1 % of
the keys updated and 0.1 % deleted) are diffed by ``pipeline.changes.VersionDiff`` as ``changes`` and the
publish's fallback feed diff them, and the change is written to a local Parquet file. The process's own
high-water mark (``VmHWM``) is printed as JSON, with the imports' alone.

    python bench/diff_memory.py generate ROWS DIR          # the two versions, DIR/before and DIR/after
    python bench/diff_memory.py run DIR [--via files|arrow]  # files: DuckDB reads them (what the diff does);
                                                             # arrow: the rows copied in as record batches
                                    [--bucket-rows N]        # pair in buckets above N rows a version
                                                             # (VersionDiff.BUCKET_ROWS), at a smaller size
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.insert(0, str(ROOT / "bench"))

ROWS_PER_FILE = 250_000


def hwm_mb() -> float:
    """This process's own peak resident set (as ``bench/scale_task.py`` measures a task)."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def generate(rows: int, directory: Path) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from partitioned import _rows, day_of

    for side in ("before", "after"):
        (directory / side).mkdir(parents=True, exist_ok=True)
    for i, start in enumerate(range(0, rows, ROWS_PER_FILE)):
        ids = np.arange(start, min(rows, start + ROWS_PER_FILE), dtype=np.int64)
        table = _rows(np.random.default_rng([rows, i]), ids, day_of(ids, rows, 100, "clustered"), "c", ids)
        pq.write_table(table, directory / "before" / f"part-{i:05d}.parquet")
        ts = table.column("ts_ms").to_numpy().copy()
        ts[ids % 100 == 7] += 10**9  # 1 % updated
        after = table.set_column(table.schema.get_field_index("ts_ms"), "ts_ms", pa.array(ts))
        pq.write_table(after.filter(pa.array(ids % 1000 != 3)), directory / "after" / f"part-{i:05d}.parquet")


def run(directory: Path, via: str, bucket_rows: int | None = None) -> dict[str, float | int]:
    import duckdb  # noqa: F401 - the imports' own memory is no part of the diff's
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cdc_compaction.pipeline.changes import CHANGE_TYPE, VersionDiff, _empty_batch

    imports = hwm_mb()
    start = time.monotonic()

    def batches(side: str) -> Iterator[Any]:  # record batches, as the diff took them before it read files
        for f in sorted((directory / side).glob("*.parquet")):
            pf = pq.ParquetFile(f)
            yield _empty_batch(pf.schema_arrow)
            yield from pf.iter_batches(batch_size=8_192)

    rows = 0
    if bucket_rows:
        VersionDiff.BUCKET_ROWS = bucket_rows
    with VersionDiff("bench.diff_memory", ["id"]) as d:
        for side in ("before", "after"):
            if via == "files":
                d.load_files(side, (str(p) for p in sorted((directory / side).glob("*.parquet"))), list, side)
            else:
                d.load(side, batches(side), side)
        loaded = time.monotonic()
        types = d.union("after", "before")
        columns = list(types)
        schema = pa.schema([*(pa.field(n, t) for n, t, _ in types.values()), pa.field(CHANGE_TYPE, pa.string())])
        sel = ", ".join([*(f"c{i}" for i in range(len(columns))), "kind"])
        sql = f"SELECT {sel} FROM ({d.changes_sql('before', 'after', columns)}) ORDER BY {d.order_by()}"
        with pq.ParquetWriter(str(directory / "change.parquet"), schema) as writer:
            for batch in d.execute(sql, schema):
                writer.write_batch(batch)
                rows += batch.num_rows
    return {
        "via": via,
        "imports_mb": round(imports, 1),
        "peak_mb": round(hwm_mb(), 1),
        "changed_rows": rows,
        "wall_s": round(time.monotonic() - start, 1),
        "load_s": round(loaded - start, 1),
        "pair_s": round(time.monotonic() - loaded, 1),
        "bucket_rows": VersionDiff.BUCKET_ROWS,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    gen = sub.add_parser("generate")
    gen.add_argument("rows", type=int)
    gen.add_argument("directory", type=Path)
    r = sub.add_parser("run")
    r.add_argument("directory", type=Path)
    r.add_argument("--via", choices=("files", "arrow"), default="files")
    r.add_argument("--bucket-rows", type=int, help="pair in buckets above this many rows a version")
    args = parser.parse_args(argv)
    if args.what == "generate":
        generate(args.rows, args.directory)
    else:
        sys.stdout.write(json.dumps(run(args.directory, args.via, args.bucket_rows)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
