"""Deterministic synthetic CDC data for the compaction benchmark.

A 20-column table (a ``bigint`` key, Debezium's ``op`` and ``ts_ms``, strings, doubles,
timestamps, booleans, an int) in two parts, both written with pyarrow as the CDC sink
would land them (one directory per increment, several Parquet files each):

* ``initial/increment_2026010100/``: the initial snapshot of ``base_rows`` keys (op ``r``)
  plus deletes of 0.5 % of them. The benchmark lands it and compacts it through the real
  pipeline once, so the base the measurements start from is a base the pipeline made
  (``base_rows`` rows, 0.5 % of them tombstones) with a real commit record.
* ``changes_<pct>/increment_2026013101/``: one hourly increment touching
  ``change_fraction`` of the keys: updates (a quarter of the keys updated twice, some with
  the exact same ``ts_ms`` so the file / row-position tie-break decides), deletes, inserts
  (some updated again in the same hour), out-of-order events older than the base (they
  must lose, also against tombstones), and a few refused rows (null key, null ``ts_ms``,
  unknown op).

Everything comes from ``numpy.random.default_rng`` streams seeded with ``(seed, base_rows,
...)``, so the same arguments give the same rows on every machine. The initial part does
not depend on ``change_fraction``: datasets of one base size share it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

DATABASE = "bench"
INITIAL_INCREMENT = "increment_2026010100"
CHANGE_INCREMENT = "increment_2026013101"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
#: Base events fall in [T0, T0 + 30 d); the change increment's events after that hour, late ones before T0.
BASE_SPAN_MS = 30 * DAY_MS
CHANGE_START_MS = T0_MS + BASE_SPAN_MS + HOUR_MS
TOMBSTONE_FRACTION = 0.005
ROWS_PER_INITIAL_FILE = 500_000
CHANGE_FILES = 8
#: Shares of the touched keys in the change increment.
MIX = {"update": 0.70, "delete": 0.10, "insert": 0.15, "late": 0.05}
SEED = 20260101
GENERATOR_VERSION = 1

COLUMNS: list[dict[str, str]] = [
    {"name": "id", "type": "bigint", "comment": "primary key"},
    {"name": "op", "type": "string", "comment": "Debezium op code"},
    {"name": "ts_ms", "type": "bigint", "comment": "event time, ms since the epoch"},
    {"name": "customer_id", "type": "bigint"},
    {"name": "account_no", "type": "string"},
    {"name": "full_name", "type": "string"},
    {"name": "email", "type": "string"},
    {"name": "city", "type": "string"},
    {"name": "country", "type": "string"},
    {"name": "status", "type": "string"},
    {"name": "notes", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "balance", "type": "double"},
    {"name": "score", "type": "double"},
    {"name": "discount", "type": "double"},
    {"name": "created_at", "type": "timestamp"},
    {"name": "updated_at", "type": "timestamp"},
    {"name": "is_active", "type": "boolean"},
    {"name": "is_verified", "type": "boolean"},
    {"name": "quantity", "type": "int"},
]
_ARROW = {"bigint": pa.int64(), "int": pa.int32(), "string": pa.string(), "double": pa.float64()}
_ARROW |= {"boolean": pa.bool_(), "timestamp": pa.timestamp("us", tz="UTC")}
SCHEMA = pa.schema([(c["name"], _ARROW[c["type"]]) for c in COLUMNS])


def registry_doc(table: str, storage_root: str, **spark: Any) -> dict[str, Any]:
    """The registry entry of a benchmark table (compact whatever landed, at once)."""
    return {
        "database": DATABASE,
        "table": table,
        "description": "Synthetic CDC table of the compaction benchmark (bench/datagen.py).",
        "columns": COLUMNS,
        "primary_key": ["id"],
        "order_by": ["ts_ms"],
        "op_column": "op",
        "storage_root": storage_root,
        "increments": {"settle_seconds": 0, "wait_for_hour_end": False},
        "schedule": None,
        "retries": 0,
        "spark": spark,
    }


# ------------------------------------------------------------------------ values
def _pool(rng: np.random.Generator, n: int, min_len: int, max_len: int, alphabet: str) -> pa.Array:
    letters = np.array(list(alphabet))
    lengths = rng.integers(min_len, max_len + 1, n)
    chars = rng.choice(letters, int(lengths.sum()))
    out, i = [], 0
    for ln in lengths:
        out.append("".join(chars[i : i + ln]))
        i += ln
    return pa.array(out, pa.string())


def _with_nulls(rng: np.random.Generator, arr: pa.Array, fraction: float) -> pa.Array:
    mask = pa.array(rng.random(len(arr)) < fraction)
    return pc.if_else(mask, pa.scalar(None, arr.type), arr)


def _events(rng: np.random.Generator, ids: np.ndarray, ts_ms: np.ndarray, ops: np.ndarray) -> pa.Table:
    """One row per event, values drawn from ``rng``; ``ids`` may be -1 for a NULL key."""
    n = len(ids)
    pools = np.random.default_rng(SEED)  # the same vocabularies for every table part
    first = _pool(pools, 300, 3, 10, "abcdefghijklmnopqrstuvwxyz")
    last = _pool(pools, 700, 4, 14, "abcdefghijklmnopqrstuvwxyz")
    cities = _pool(pools, 400, 4, 16, "abcdefghijklmnopqrstuvwxyz ")
    countries = _pool(pools, 60, 2, 2, "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    notes = _pool(pools, 5000, 20, 120, "abcdefghijklmnopqrstuvwxyz     .,0123456789")
    statuses = pa.array(["active", "pending", "suspended", "closed", "review"])

    fi = pa.array(rng.integers(0, len(first), n))
    li = pa.array(rng.integers(0, len(last), n))
    first_names = first.take(fi)
    customer = rng.integers(1, 2_000_000, n)
    cust_str = pc.cast(pa.array(customer), pa.string())
    id_arr = pa.array(ids, pa.int64(), mask=ids < 0)
    ts_arr = pa.array(ts_ms, pa.int64(), mask=ts_ms < 0)
    created_us = (T0_MS - rng.integers(0, 5 * 365 * DAY_MS, n)) * 1000
    cols = {
        "id": id_arr,
        "op": pa.array(ops, pa.string()),
        "ts_ms": ts_arr,
        "customer_id": pa.array(customer, pa.int64()),
        "account_no": pc.binary_join_element_wise("AC", pc.utf8_lpad(cust_str, 10, "0"), ""),
        "full_name": pc.binary_join_element_wise(first_names, last.take(li), " "),
        "email": pc.binary_join_element_wise(first_names, ".", cust_str, "@example.com", ""),
        "city": cities.take(pa.array(rng.integers(0, len(cities), n))),
        "country": countries.take(pa.array(rng.integers(0, len(countries), n))),
        "status": statuses.take(pa.array(rng.integers(0, len(statuses), n))),
        "notes": _with_nulls(rng, notes.take(pa.array(rng.integers(0, len(notes), n))), 0.03),
        "amount": pa.array(np.round(rng.gamma(2.0, 50.0, n), 2)),
        "balance": pa.array(np.round(rng.normal(1000.0, 400.0, n), 2)),
        "score": pa.array(rng.random(n)),
        "discount": _with_nulls(rng, pa.array(np.round(rng.random(n) * 0.3, 3)), 0.2),
        "created_at": pa.array(created_us, pa.timestamp("us", tz="UTC")),
        "updated_at": pa.array(np.where(ts_ms < 0, T0_MS, ts_ms) * 1000, pa.timestamp("us", tz="UTC")),
        "is_active": pa.array(rng.random(n) < 0.8),
        "is_verified": pa.array(rng.random(n) < 0.5),
        "quantity": pa.array(rng.integers(0, 1000, n).astype(np.int32)),
    }
    return pa.table(cols, schema=SCHEMA)


def _write(table: pa.Table, directory: Path, files: int) -> list[dict[str, Any]]:
    """Split ``table`` into ``files`` Parquet files as a sink would: temp name, then rename."""
    directory.mkdir(parents=True, exist_ok=True)
    per = math.ceil(table.num_rows / files)
    out = []
    for i in range(files):
        part = table.slice(i * per, per)
        path = directory / f"part-{i:05d}.parquet"
        tmp = directory / f".part-{i:05d}.parquet.tmp"
        pq.write_table(part, tmp, compression="snappy")
        tmp.rename(path)
        out.append({"file": path.name, "rows": part.num_rows, "bytes": path.stat().st_size})
    return out


def _rng(seed: int, base_rows: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, base_rows, *stream])


def tombstoned_keys(base_rows: int, seed: int = SEED) -> np.ndarray:
    """The keys the initial load deletes (they are tombstones in the base)."""
    n = int(base_rows * TOMBSTONE_FRACTION)
    return np.sort(_rng(seed, base_rows, 1).choice(base_rows, n, replace=False) + 1)


# ------------------------------------------------------------------------ parts
def generate_initial(out_dir: str | os.PathLike[str], base_rows: int, seed: int = SEED) -> dict[str, Any]:
    """The initial load: a snapshot of ``base_rows`` keys plus deletes of 0.5 % of them."""
    rng = _rng(seed, base_rows, 0)
    ids = np.arange(1, base_rows + 1, dtype=np.int64)
    ts = T0_MS + rng.integers(0, BASE_SPAN_MS, base_rows)
    dead = tombstoned_keys(base_rows, seed)
    del_ts = ts[dead - 1] + rng.integers(1, HOUR_MS, len(dead))
    all_ids = np.concatenate([ids, dead])
    all_ts = np.concatenate([ts, del_ts])
    ops = np.array(["r"] * base_rows + ["d"] * len(dead), dtype=object)
    table = _events(rng, all_ids, all_ts, ops)
    directory = Path(out_dir) / "initial" / INITIAL_INCREMENT
    files = _write(table, directory, max(1, math.ceil(table.num_rows / ROWS_PER_INITIAL_FILE)))
    return {
        "increment": INITIAL_INCREMENT,
        "directory": str(directory),
        "rows": table.num_rows,
        "keys": base_rows,
        "tombstones": len(dead),
        "files": files,
    }


def generate_changes(
    out_dir: str | os.PathLike[str], base_rows: int, change_fraction: float, seed: int = SEED
) -> dict[str, Any]:
    """One hourly increment touching ``change_fraction`` of the keys (see the module docstring)."""
    rng = _rng(seed, base_rows, round(change_fraction * 1_000_000), 2)
    touched = max(20, round(base_rows * change_fraction))
    n_upd, n_del, n_ins = (round(touched * MIX[k]) for k in ("update", "delete", "insert"))
    n_late = touched - n_upd - n_del - n_ins
    existing = rng.permutation(base_rows)[: n_upd + n_del].astype(np.int64) + 1
    upd, dele = existing[:n_upd], existing[n_upd:]
    ins = np.arange(base_rows + 1, base_rows + 1 + n_ins, dtype=np.int64)
    span = HOUR_MS - 10_000
    upd_ts = CHANGE_START_MS + rng.integers(0, span // 2, n_upd)
    # A quarter of the updated keys change again later in the hour; 2 % of those at the same ts_ms.
    again = rng.choice(n_upd, n_upd // 4, replace=False)
    again_ts = upd_ts[again] + rng.integers(1, span // 2, len(again))
    ties = rng.random(len(again)) < 0.02
    again_ts[ties] = upd_ts[again][ties]
    ins_ts = CHANGE_START_MS + rng.integers(0, span // 2, n_ins)
    ins_again = rng.choice(n_ins, int(n_ins * 0.3), replace=False)
    # Late events: older than every base event; a fifth of them for tombstoned keys.
    dead = tombstoned_keys(base_rows, seed)
    n_late_dead = min(len(dead), n_late // 5)
    late = np.concatenate(
        [rng.choice(dead, n_late_dead, replace=False), rng.integers(1, base_rows + 1, n_late - n_late_dead)]
    )
    parts = [
        (upd, upd_ts, "u"),
        (upd[again], again_ts, "u"),
        (dele, CHANGE_START_MS + rng.integers(0, span, n_del), "d"),
        (ins, ins_ts, "c"),
        (ins[ins_again], ins_ts[ins_again] + rng.integers(1, span // 2, len(ins_again)), "u"),
        (late, T0_MS - rng.integers(1, DAY_MS, n_late), "u"),
        # Refused rows: null key, null ts_ms, unknown op (the job quarantines them).
        (np.array([-1, -1]), CHANGE_START_MS + np.array([1, 2]), "u"),
        (upd[:2], np.array([-1, -1]), "u"),
        (upd[2:4], CHANGE_START_MS + np.array([3, 4]), "x"),
    ]
    ids = np.concatenate([p[0] for p in parts])
    ts = np.concatenate([p[1] for p in parts]).astype(np.int64)
    ops = np.concatenate([np.full(len(p[0]), p[2], dtype=object) for p in parts])
    order = rng.permutation(len(ids))  # the sink writes events in no particular order
    table = _events(rng, ids[order], ts[order], ops[order])
    pct = f"{change_fraction * 100:g}".replace(".", "_")
    directory = Path(out_dir) / f"changes_{pct}pct" / CHANGE_INCREMENT
    files = _write(table, directory, CHANGE_FILES)
    return {
        "increment": CHANGE_INCREMENT,
        "directory": str(directory),
        "change_fraction": change_fraction,
        "rows": table.num_rows,
        "touched_keys": touched,
        "updates": n_upd,
        "repeated_updates": len(again),
        "same_ts_ties": int(ties.sum()),
        "deletes": n_del,
        "inserts": n_ins,
        "inserts_updated_again": len(ins_again),
        "late_events": n_late,
        "late_events_for_tombstones": n_late_dead,
        "refused_rows": 6,
        "files": files,
    }


def generate(
    out_dir: str | os.PathLike[str],
    base_rows: int,
    change_fraction: float,
    seed: int = SEED,
    *,
    reuse: bool = True,
) -> dict[str, Any]:
    """Write the initial load and one change increment under ``out_dir``; return the manifest.

    With ``reuse`` an existing part whose manifest matches (same generator version, rows,
    fraction and seed) is kept instead of being written again: the data is deterministic.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    manifest: dict[str, Any] = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    same = (
        reuse
        and manifest.get("version") == GENERATOR_VERSION
        and manifest.get("base_rows") == base_rows
        and manifest.get("seed") == seed
    )
    if not same:
        shutil.rmtree(out / "initial", ignore_errors=True)
        manifest = {"version": GENERATOR_VERSION, "base_rows": base_rows, "seed": seed, "changes": {}}
    if "initial" not in manifest or not Path(manifest["initial"]["directory"]).is_dir():
        manifest["initial"] = generate_initial(out, base_rows, seed)
    key = f"{change_fraction:g}"
    known = manifest["changes"].get(key)
    if known is None or not Path(known["directory"]).is_dir():
        manifest["changes"][key] = generate_changes(out, base_rows, change_fraction, seed)
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return {**manifest, "change": manifest["changes"][key]}


def read_dir(directory: str | os.PathLike[str]) -> pa.Table:
    """Every Parquet file of a directory, in file-name order (for checks and tests)."""
    files = sorted(p for p in Path(directory).iterdir() if p.suffix == ".parquet")
    return pa.concat_tables([pq.read_table(p) for p in files])


if __name__ == "__main__":  # pragma: no cover - a manual helper
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--base-rows", type=int, default=1_000_000)
    parser.add_argument("--change-fraction", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=SEED)
    a = parser.parse_args()
    m = generate(a.out_dir, a.base_rows, a.change_fraction, a.seed)
    print(json.dumps({k: v for k, v in m["change"].items() if k != "files"}, indent=1))  # noqa: T201
