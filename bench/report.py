"""Turn the benchmarks' JSON results into ``bench/results/RESULTS.md`` and ``compaction.png``.

``compaction.json`` (``bench/compaction.py``) gets its own tables and chart. Every other
``*.json`` in the results directory (``partitioned.json``, ``parse.json``,
``hourly_run.json``, ...) is merged in as a section of its own: its ``markdown`` field
verbatim if it has one, otherwise a generic rendering of its fields.

    python bench/report.py [--results bench/results]
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import job_profile

log = logging.getLogger("bench.report")

RESULTS = Path(__file__).resolve().parent / "results"
ENGINES = ("floor", "ours", "floor_warm", "ours_warm", "duckdb", "polars", "delta")
#: How an engine is named in the report where its id is not its name.
LABELS = {"delta": "delta-rs", "floor_warm": "floor (warm)", "ours_warm": "ours (warm)"}
#: Ours' runs (bold in the tables) and the ratio each other engine's row shows (default ``ours/<engine>``).
OURS = ("ours", "ours_warm")
RATIO_OF = {"floor_warm": "ours/floor (warm)"}
#: The engines ours is compared with in the ratio table, in this order.
PEERS = ("duckdb", "polars", "delta")
#: Other benchmarks' sections come in this order when present; any other JSON file after them.
KNOWN_ORDER = ("hourly_connect", "partitioned", "policy_day", "parse", "hourly_run")
#: Where ``bench/partitioned.py`` keeps its driver logs by default (``--work``/logs).
PARTITIONED_LOGS = Path(__file__).resolve().parent.parent / ".run" / "bench-partitioned" / "logs"
#: Written by this report from the driver logs, read back when the logs are gone.
PROFILE = "profile.json"
#: A compaction run of its own for the Spark peers (``bench/compaction.py --out bench/results/spark_peers.json``),
#: when they were measured apart from ``compaction.json``'s run: rendered as their section, not generically.
SPARK_PEERS = "spark_peers.json"
#: The Spark the Iceberg peers run on (``cdc_compaction.devtools.iceberg_spark.SPARK_VERSION``).
ICEBERG_SPARK = "4.1.4"
#: The Spark peers (``bench/spark_peer.py``) and how the report names them.
SPARK_PEER_LABELS = {
    "delta_cow": "delta-spark MERGE (copy-on-write)",
    "delta_dv": "delta-spark MERGE (deletion vectors)",
    # Iceberg's runtime has no build for Spark 4.2: these ran on the second Spark (make iceberg-spark), and say so.
    "iceberg_cow": "Iceberg MERGE INTO (copy-on-write) on Spark 4.1.4, not ours' 4.2",
    "iceberg_mor": "Iceberg MERGE INTO (merge-on-read) on Spark 4.1.4, not ours' 4.2",
}
#: What is not measured, and why: Maven Central had no build of these for Spark 4 (checked 2026-11-29 with
#: ``mvn -B dependency:get -Dartifact=<coordinate>`` and the artifact's ``maven-metadata.xml``).
SPARK_PEERS_MISSING = (
    "Hudi upsert (COW, MOR): no `org.apache.hudi:hudi-spark4.2-bundle_2.13`, nor a bundle for Spark 4.1 or 4.0 "
    "(`hudi-spark4.1-bundle_2.13`, `hudi-spark4.0-bundle_2.13`) or `hudi-spark4-bundle_2.13`; the newest bundle is "
    "`hudi-spark3.5-bundle_2.13:1.1.1`, for Spark 3.5. "
    "Checked 2026-11-29 with `mvn -B dependency:get -Dartifact=<coordinate>` and each artifact's "
    "`maven-metadata.xml` (HTTP 404)."
)
#: A change of at most this share of the keys is "tiny": what ours takes over the floor there is the fixed part
#: of a compaction (stages, driver time), whatever the change; issue 38's target for it, warm, in seconds.
TINY_FRACTION = 0.001
FIXED_TARGET_S = 3.0
#: Issue 38's target for the change feed: a compaction with ``change_feed`` on takes at most this times as long.
FEED_TARGET = 1.10


def _num(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------- compaction
def compaction_table(data: dict[str, Any]) -> str:
    """One row per dataset and engine: wall, rows/s, CPU, peak memory, output files."""
    rows = []
    for d in data["datasets"]:
        for engine in ENGINES:
            j = d["jobs"].get(engine)
            if j is None:
                continue
            out = j.get("output", {})
            ratio = d["ratios"].get(RATIO_OF.get(engine, f"ours/{engine}")) if engine not in OURS else None
            name = LABELS.get(engine, engine)
            rows.append(
                [
                    d["dataset"],
                    f"{d['input_rows']:,}",
                    f"**{name}**" if engine in OURS else name,
                    _num(j["wall_s"]),
                    _num(j["rows_per_s"]),
                    _num(j["cpu_s"]),
                    _num(j["peak_rss_mb"], 0),
                    _num(ratio, 2),
                    _num(out.get("files")),
                    f"{_num(out.get('min_mb'))} / {_num(out.get('median_mb'))} / {_num(out.get('max_mb'))}",
                ]
            )
    header = [
        "dataset",
        "input rows",
        "engine",
        "wall s",
        "rows/s",
        "CPU s",
        "peak MB",
        "ours / engine (wall)",
        "files",
        "file MB min / median / max",
    ]
    return _table(header, rows)


def ratio_table(data: dict[str, Any]) -> str:
    """One row per dataset: the ratios, the target, whether ours and the peers wrote the same rows."""
    target = data.get("target_ours_over_floor", 1.3)
    rows = []
    for d in data["datasets"]:
        r = d["ratios"]
        of = r.get("ours/floor")
        rows.append(
            [
                d["dataset"],
                _num(of, 2),
                _num(r.get("ours/floor (cpu)"), 2),
                "yes" if of is not None and of <= target else "no",
                *[_num(r.get(f"ours/{p}"), 2) for p in PEERS],
                f"{d['checksums']['ours']['rows']:,} rows, {d['checksums']['ours']['tombstones']:,} tombstones"
                + (" - same in every engine" if d["checksums_match"] else " - **DIFFERENT**"),
            ]
        )
    header = [
        "dataset",
        "ours / floor",
        "ours / floor (CPU)",
        f"<= {target}x",
        *[f"ours / {LABELS.get(p, p)}" for p in PEERS],
        "output (checksum)",
    ]
    return _table(header, rows)


def has_warm(data: dict[str, Any]) -> bool:
    """True if the run measured floor and ours warm too (in a Spark Connect server)."""
    return any("ours_warm" in d["jobs"] for d in data.get("datasets", []))


def warm_table(data: dict[str, Any]) -> str:
    """One row per dataset: ours / floor cold and warm side by side, warm ours against the peers, the warm runs."""
    rows = []
    for d in data["datasets"]:
        r, jobs = d["ratios"], d["jobs"]
        floor, ours = jobs.get("floor_warm") or {}, jobs.get("ours_warm") or {}
        rows.append(
            [
                d["dataset"],
                _num(r.get("ours/floor"), 2),
                _num(r.get("ours/floor (warm)"), 2),
                _num(r.get("ours/floor (warm, cpu)"), 2),
                *[_num(r.get(f"ours/{p} (warm)"), 2) for p in PEERS],
                _num(floor.get("wall_s")),
                _num(ours.get("wall_s")),
                ", ".join(_num(x) for x in floor.get("runs_wall_s", [])) or "-",
                ", ".join(_num(x) for x in ours.get("runs_wall_s", [])) or "-",
                _num(d["steps"].get("warm_warmup_s")),
            ]
        )
    header = [
        "dataset",
        "ours / floor (cold)",
        "ours / floor (warm)",
        "ours / floor (warm, CPU)",
        *[f"ours (warm) / {LABELS.get(p, p)}" for p in PEERS],
        "floor warm s",
        "ours warm s",
        "floor warm runs s",
        "ours warm runs s",
        "warm-up s (floor + ours)",
    ]
    return _table(header, rows)


def warm_markdown(data: dict[str, Any]) -> list[str]:
    """The warm section's text and table (nothing if the run measured cold only)."""
    if not has_warm(data):
        return []
    server = data.get("connect_server", {})
    repeats = data.get("settings", {}).get("warm_repeats")
    return [
        "",
        "Cold and warm side by side: cold is spark-submit (a JVM per job, its start included); warm runs the "
        f"same floor and ours in one Spark Connect server ({server.get('url', '?')}, master "
        f"{server.get('master', '?')}, driver memory {server.get('driver_memory', '?')}; started once for the "
        f"run in {server.get('start_s', '?')} s, not counted), ours as the `spark_connect` engine runs it "
        "(a fresh server session per run), the floor in such a session. Per dataset one untimed warm-up of each, "
        f"then {repeats} rounds of floor then ours; the median run counts (its wall time: session opened to "
        "closed; its CPU: client + server). The peers' times are their own runs above (no JVM either).",
        "",
        warm_table(data),
    ]


def steps_table(data: dict[str, Any]) -> str:
    """The pipeline's other steps (not in the ratios), and the initial loads."""
    rows = []
    for d in data["datasets"]:
        s = d["steps"]
        rows.append(
            [
                d["dataset"],
                _num(s.get("ensure_tables_s"), 2),
                _num(s.get("plan_s"), 2),
                _num(d["jobs"]["ours"]["wall_s"]),
                _num(s.get("validate_s"), 2),
            ]
        )
    for load in data.get("initial_loads", []):
        s = load["steps"]
        rows.append(
            [
                f"initial load {load['table']} ({load['rows']:,} events)"
                + (f", cached from {load.get('made_at')}" if load.get("reused_from_cache") else ""),
                _num(s.get("ensure_tables_s"), 2),
                _num(s.get("plan_s"), 2),
                _num(load["compact"]["wall_s"]),
                _num(s.get("validate_s"), 2),
            ]
        )
    return _table(["run", "ensure_tables s", "plan s", "compact (spark-submit) s", "validate s"], rows)


def has_feed(data: dict[str, Any]) -> bool:
    """True if the run measured ours with the change feed on too (``bench/compaction.py --change-feed``)."""
    return any("ours_feed" in d["jobs"] for d in data.get("datasets", []))


def feed_table(data: dict[str, Any]) -> str:
    """One row per dataset: ours with the feed on over off, cold and warm, the feed's rows, publish's fallback diff."""
    rows = []
    for d in data["datasets"]:
        r, jobs = d["ratios"], d["jobs"]
        if "ours_feed" not in jobs:
            continue
        fed, fed_warm = jobs["ours_feed"], jobs.get("ours_feed_warm") or {}
        rows.append(
            [
                d["dataset"],
                f"{_num(jobs['ours']['wall_s'])} / {_num(fed['wall_s'])}",
                _num(r.get("ours_feed/ours"), 2),
                f"{_num((jobs.get('ours_warm') or {}).get('wall_s'))} / {_num(fed_warm.get('wall_s'))}",
                _num(r.get("ours_feed/ours (warm)"), 2),
                ", ".join(_num(x) for x in fed_warm.get("runs_wall_s", [])) or "-",
                _num(sum(((fed.get("feed") or {}).get("rows") or {}).values())),
                _num(d["steps"].get("publish_diff_s"), 1),
            ]
        )
    header = [
        "dataset",
        "cold s (off / on)",
        "on / off (cold)",
        "warm s (off / on)",
        "on / off (warm)",
        "feed-on warm runs s",
        "feed rows",
        "publish's fallback diff s",
    ]
    return _table(header, rows)


def feed_markdown(data: dict[str, Any]) -> list[str]:
    """The change feed's price: text and table (nothing if the run did not measure it)."""
    if not has_feed(data):
        return []
    return [
        "",
        "The change feed's price: ours again on the same planned files with the plan's `change_feed` on, cold "
        "(one more spark-submit) and warm (in the same rounds as floor and ours, the median run). Its feed must "
        "equal the diff `publish` falls back to for a commit without one (both versions paired in DuckDB, "
        f"`changes.write_feed`), timed here in the bench's process. Target: on / off <= {FEED_TARGET:.2f}.",
        "",
        feed_table(data),
    ]


def has_spark_peers(data: dict[str, Any]) -> bool:
    return any(p in d["jobs"] for d in data.get("datasets", []) for p in SPARK_PEER_LABELS)


def spark_peers_table(data: dict[str, Any]) -> str:
    """One row per dataset and Spark peer: ours / peer cold and warm, the peer's phases, its warm runs."""
    rows = []
    for d in data["datasets"]:
        r, jobs = d["ratios"], d["jobs"]
        for peer, name in SPARK_PEER_LABELS.items():
            if peer not in jobs:
                continue
            cold, warm = jobs[peer], jobs.get(f"{peer}_warm") or {}
            rows.append(
                [
                    d["dataset"],
                    name,
                    _num(r.get(f"ours/{peer}"), 2),
                    _num(r.get(f"ours/{peer} (warm)"), 2),
                    _num(r.get(f"ours+read/{peer}+read (warm)"), 2),
                    f"{_num(jobs['ours']['wall_s'])} / {_num(cold['wall_s'])}",
                    f"{_num((jobs.get('ours_warm') or {}).get('wall_s'))} / {_num(warm.get('wall_s'))}",
                    _num(warm.get("merge_s")),
                    _num(warm.get("read_s")),
                    _num(warm.get("ours_read_s")),
                    ", ".join(_num(x) for x in warm.get("runs_wall_s", [])) or "-",
                    "same as ours" if d["checksums"].get(peer) == d["checksums"]["ours"] else "**DIFFERENT**",
                ]
            )
    header = [
        "dataset",
        "peer",
        "ours / peer (cold)",
        "ours / peer (warm)",
        "ours + read / peer + read (warm)",
        "cold s (ours / peer)",
        "warm s (ours / peer)",
        "peer MERGE s (warm)",
        "peer read s (warm)",
        "ours read s (warm)",
        "peer warm runs s",
        "checksum",
    ]
    return _table(header, rows)


def spark_peers_markdown(data: dict[str, Any]) -> list[str]:
    """The Spark peers' text and table (nothing if the run had none), and what is not available."""
    if not has_spark_peers(data):
        return []
    host = data.get("host", {})
    return [
        "",
        "The Spark peers, on the same planned files, the same pinned Spark "
        f"(PySpark {data.get('host', {}).get('pyspark')}, jars {data.get('host', {}).get('delta-spark', '?')}) "
        "and ours' own spark-submit command line plus Delta's jars and conf (`bench/spark_peer.py`): the base is "
        "loaded into a Delta table per variant before any timing, then the increment's winners are MERGEd into a "
        "fresh copy of it (`MERGE INTO ... WHEN MATCHED AND newer ... UPDATE SET * / DELETE WHEN NOT MATCHED "
        "INSERT *`, expired tombstones deleted). Cold: one spark-submit each, JVM start included, like ours'. "
        "Warm: one long-lived JVM per peer, an untimed warm-up, then the repeats, each into a fresh copy; "
        "ours warm is ours in the Spark Connect server. With deletion vectors the peer's time includes one full "
        "read of the table after the MERGE (every column hashed), and ours + read adds one full read of ours' "
        "output done the same way in the peer's JVM. The table's rows after the MERGE (cold and warm) must have "
        "ours' checksum, or the run fails.",
        *(
            [
                "",
                f"Iceberg's peers ran on Spark {host.get('iceberg-peers-spark', ICEBERG_SPARK)}, not on ours' PySpark "
                f"{host.get('pyspark')} (jars {host.get('iceberg-spark', '?')}): "
                "Iceberg's Spark runtime has no build for Spark 4.2, so ours / Iceberg compares two Spark versions. "
                "The same command line, run by the second Spark's spark-submit (`make iceberg-spark`); a Hadoop "
                "catalog (`type=hadoop`) in the run's directory; `write.merge.mode`, `write.update.mode` and "
                "`write.delete.mode` all copy-on-write or all merge-on-read (format version 2: position delete files, "
                "so merge-on-read's time includes one full read like deletion vectors'); a fresh copy is the table "
                "set back to its base snapshot.",
            ]
            if any(p in d["jobs"] for d in data.get("datasets", []) for p in ("iceberg_cow", "iceberg_mor"))
            else []
        ),
        "",
        spark_peers_table(data),
        "",
        f"Not measured: {SPARK_PEERS_MISSING}",
    ]


def compaction_markdown(data: dict[str, Any]) -> str:
    host = data.get("host", {})
    settings = data.get("settings", {})
    lines = [
        "## Compaction",
        "",
        f"Run {data.get('generated_at', '?')} at commit `{data.get('git', '?')}` on {host.get('cpus')} CPUs, "
        f"{host.get('memory_gb')} GB RAM (load average {host.get('loadavg_start')} at the start, "
        f"{host.get('loadavg_end')} at the end); PySpark {host.get('pyspark')}, DuckDB {host.get('duckdb')}, "
        f"Polars {host.get('polars')}, delta-rs (deltalake) {host.get('deltalake', '-')}. "
        f"Spark driver memory {settings.get('driver_memory')}, "
        f"target file size {settings.get('target_file_mb')} MB; {data.get('total_s')} s in all.",
        "",
        "Wall time is the whole job (spark-submit: JVM start included), rows/s is input rows (base + increment "
        "events) per wall second, peak MB the largest RSS of the job's process tree (sampled every 100 ms; for a "
        "warm run the Spark Connect server's, which holds its heap between runs). "
        "delta-rs MERGEs the increment into a Delta table holding the base (written before its timed run, as a "
        "table that exists already), deletes the expired tombstones and vacuums the replaced files.",
        "",
        compaction_table(data),
        "",
        ratio_table(data),
        *warm_markdown(data),
        *fixed_markdown(data),
        *feed_markdown(data),
        *spark_peers_markdown(data),
        "",
        "The pipeline's other steps (not part of the ratios):",
        "",
        steps_table(data),
    ]
    return "\n".join(lines) + "\n"


def fixed_parts(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per base size and cold / warm: the fixed and the proportional part of ours over the floor.

    The fixed part is ours' wall time over the floor's at the size's tiniest change (at most
    ``TINY_FRACTION`` of the keys): the stages and driver time a compaction pays whatever it merges.
    The proportional part of each larger change is what ours takes over the floor beyond that, also
    per 100,000 increment events. A size without a tiny change gets no row: its gap cannot be split.
    """
    by_size: dict[int, list[dict[str, Any]]] = {}
    for d in data.get("datasets", []):
        if "base_rows" in d and "change_fraction" in d:  # older results carry neither
            by_size.setdefault(int(d["base_rows"]), []).append(d)
    out = []
    for rows, datasets in sorted(by_size.items()):
        datasets.sort(key=lambda d: float(d["change_fraction"]))
        tiny = datasets[0]
        if float(tiny["change_fraction"]) > TINY_FRACTION:
            continue
        for how, floor, ours in (("cold", "floor", "ours"), ("warm", "floor_warm", "ours_warm")):
            if floor not in tiny["jobs"] or ours not in tiny["jobs"]:
                continue
            fixed = tiny["jobs"][ours]["wall_s"] - tiny["jobs"][floor]["wall_s"]
            larger = []
            for d in datasets[1:]:
                if floor in d["jobs"] and ours in d["jobs"]:
                    over = d["jobs"][ours]["wall_s"] - d["jobs"][floor]["wall_s"]
                    events = int(d["increment_rows"])
                    larger.append(
                        {
                            "dataset": d["dataset"],
                            "over_floor_s": round(over, 2),
                            "proportional_s": round(over - fixed, 2),
                            "per_100k_events_s": round((over - fixed) * 100_000 / events, 2) if events else None,
                        }
                    )
            out.append(
                {"base_rows": rows, "how": how, "tiny": tiny["dataset"], "fixed_s": round(fixed, 2), "larger": larger}
            )
    return out


def fixed_markdown(data: dict[str, Any]) -> list[str]:
    """The fixed and proportional parts' text and table (nothing if no size has a tiny change)."""
    parts = fixed_parts(data)
    if not parts:
        return []
    rows = []
    for p in parts:
        head = [f"{p['base_rows']:,}", p["how"], f"{p['tiny']}: {_num(p['fixed_s'], 2)}"]
        for item in p["larger"]:
            over, prop, per = (_num(item[k], 2) for k in ("over_floor_s", "proportional_s", "per_100k_events_s"))
            rows.append([*head, item["dataset"], over, prop, per])
        if not p["larger"]:
            rows.append([*head, "-", "-", "-", "-"])
    return [
        "",
        f"The fixed and the proportional part: ours' wall time over the floor's at the size's tiniest change "
        f"(at most {TINY_FRACTION:.1%} of the keys) is the fixed part; at a larger change, what is over the floor "
        "beyond it is the proportional part (also per 100,000 increment events).",
        "",
        _table(
            [
                "base rows",
                "run",
                "fixed part s (tiny change)",
                "dataset",
                "ours - floor s",
                "proportional part s",
                "per 100k events s",
            ],
            rows,
        ),
    ]


def compaction_chart(data: dict[str, Any], path: Path) -> None:
    """Wall time and peak memory per dataset and engine, as grouped bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = [d["dataset"] for d in data["datasets"]]
    engines = [e for e in ENGINES if any(e in d["jobs"] for d in data["datasets"])]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(len(engines), 1)
    for ax, key, title in (
        (axes[0], "wall_s", "wall time (s, lower is better)"),
        (axes[1], "peak_rss_mb", "peak memory of the job's processes (MB)"),
    ):
        for i, engine in enumerate(engines):
            values = [d["jobs"].get(engine, {}).get(key, 0) for d in data["datasets"]]
            xs = [x + (i - (len(engines) - 1) / 2) * width for x in range(len(datasets))]
            bars = ax.bar(xs, values, width, label=LABELS.get(engine, engine))
            if key == "wall_s":
                ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax.set_xticks(range(len(datasets)), datasets)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    fig.suptitle("CDC compaction: ours vs. a read+write floor and peer engines (same files, one run)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------- targets
def spark_peer_targets(data: dict[str, Any]) -> list[list[str]]:
    """The issue's target against the Spark peers: ours faster than delta-spark's copy-on-write MERGE, cold and warm."""
    rows = []
    for d in data.get("datasets", []):
        for key, how in (("ours/delta_cow", "cold"), ("ours/delta_cow (warm)", "warm")):
            ratio = d["ratios"].get(key)
            if ratio is not None:
                rows.append(
                    [
                        f"compaction {d['dataset']} {how}",
                        f"ours faster than delta-spark MERGE (copy-on-write): ours / peer < 1 ({how})",
                        _num(ratio, 2),
                        "yes" if ratio < 1 else "**no**",
                    ]
                )
    return rows


def targets_table(results: Path) -> str:
    """One row per target: what it asks, what was measured, met or not (every JSON's ``target``/``met``).

    The compaction benchmark has one row per dataset (ours / floor against its target); the others
    carry their own ``target`` text and ``met`` flag, written by the script that measured them.
    """
    rows: list[list[str]] = []
    comp = results / "compaction.json"
    if comp.exists():
        data = json.loads(comp.read_text(encoding="utf-8"))
        target = data.get("target_ours_over_floor", 1.3)
        for d in data.get("datasets", []):
            of = d["ratios"].get("ours/floor")
            met = of is not None and of <= target
            rows.append(
                [
                    f"compaction {d['dataset']}",
                    f"ours / floor (wall) <= {target}",
                    f"{_num(of, 2)} (CPU {_num(d['ratios'].get('ours/floor (cpu)'), 2)})",
                    "yes" if met else "**no**",
                ]
            )
            warm = d["ratios"].get("ours/floor (warm)")
            if warm is not None:
                # The same target with no JVM start on either side (a Spark Connect server).
                rows.append(
                    [
                        f"compaction {d['dataset']} warm",
                        f"ours / floor (wall, warm Spark Connect) <= {target}",
                        f"{_num(warm, 2)} (CPU {_num(d['ratios'].get('ours/floor (warm, cpu)'), 2)})",
                        "yes" if warm <= target else "**no**",
                    ]
                )
        for d in data.get("datasets", []):
            for key, how in (("ours_feed/ours", "cold"), ("ours_feed/ours (warm)", "warm")):
                ratio = d["ratios"].get(key)
                if ratio is not None:
                    rows.append(
                        [
                            f"compaction {d['dataset']} change feed, {how}",
                            f"ours with the feed / without <= {FEED_TARGET:.2f} ({how})",
                            _num(ratio, 2),
                            "yes" if ratio <= FEED_TARGET else "**no**",
                        ]
                    )
        for p in fixed_parts(data):
            if p["how"] == "warm":
                rows.append(
                    [
                        f"compaction {p['base_rows']:,} rows, fixed part",
                        f"ours - floor at a tiny change ({p['tiny']}, warm) <= {FIXED_TARGET_S:g} s",
                        f"{_num(p['fixed_s'], 2)} s",
                        "yes" if p["fixed_s"] <= FIXED_TARGET_S else "**no**",
                    ]
                )
    for name in ("compaction.json", SPARK_PEERS):
        if (results / name).exists():
            rows += spark_peer_targets(json.loads((results / name).read_text(encoding="utf-8")))
    for p in sorted(results.glob("*.json")):
        if p.name == "compaction.json":
            continue
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or "target" not in data:
            continue
        measured = data.get("measured") or _measured(data)
        rows.append([p.stem, str(data["target"]), str(measured), "yes" if data.get("met") else "**no**"])
    return _table(["benchmark", "target", "measured", "met"], rows) if rows else ""


def _measured(data: dict[str, Any]) -> str:
    """The metrics a target names (``run_wall_seconds <= 60`` -> that metric), else its ratios, as text."""
    flat: dict[str, Any] = {}
    for k, v in (data.get("metrics") or {}).items():
        if isinstance(v, dict):
            flat.update({f"{k}.{k2}": v2 for k2, v2 in v.items() if not isinstance(v2, dict | list)})
        elif not isinstance(v, list):
            flat[k] = v
    target = str(data.get("target", ""))
    # Metric names in the target's text (``spark_connect plan_to_refresh_view_seconds`` names
    # ``spark_connect_plan_to_refresh_view_seconds``): the metrics that end with one of them.
    names = [t for t in re.findall(r"[a-z][a-z0-9_]+", target) if "_" in t]
    named = {k: v for k, v in flat.items() if any(k.endswith(n) for n in names)}
    chosen = named or {k: v for k, v in flat.items() if "ratio" in k}
    return "; ".join(f"{k} {_num(v, 2)}" for k, v in chosen.items())


def scaling_chart(results: Path, path: Path) -> bool:
    """Touched-only vs full-rewrite job time per table size (``partitioned.json``) and the day under each
    compaction policy (``policy_day.json``), side by side. False when neither result is there."""
    part = results / "partitioned.json"
    day = results / "policy_day.json"
    if not part.exists() and not day.exists():
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    if part.exists():
        metrics = json.loads(part.read_text(encoding="utf-8")).get("metrics", {})
        sizes = sorted(metrics, key=int)
        xs = [int(s) / 1e6 for s in sizes]
        for key, label in (
            ("full_rewrite_job_s", "full rewrite"),
            ("touched_clustered_job_s", "touched only, clustered keys"),
            ("touched_scattered_job_s", "touched only, scattered keys"),
        ):
            ys = [metrics[s].get(key) for s in sizes]
            if any(y is not None for y in ys):
                axes[0].plot(xs, ys, marker="o", label=label)
        axes[0].set_xlabel("base rows (millions)")
        axes[0].set_ylabel("job seconds (JVM start excluded)")
        axes[0].set_title("partitioned table, fixed change size")
        axes[0].grid(alpha=0.3)
        axes[0].legend()
    if day.exists():
        tables = json.loads(day.read_text(encoding="utf-8")).get("tables", {})
        for name, t in tables.items():
            runs = t.get("runs", [])
            total, ys = 0.0, []
            for r in runs:
                total += float(r.get("wall_s") or 0)
                ys.append(total)
            axes[1].plot(
                range(1, len(ys) + 1),
                ys,
                marker=".",
                label=f"{name} ({sum(bool(r.get('compacted')) for r in runs)} compactions)",
            )
        axes[1].set_xlabel("hour of the day")
        axes[1].set_ylabel("cumulative run seconds")
        axes[1].set_title("a day of hourly runs under each compaction policy")
        axes[1].grid(alpha=0.3)
        axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------- others
def _generic(obj: Any, depth: int = 0) -> str:
    """A readable Markdown rendering of another benchmark's JSON (no known layout)."""
    if isinstance(obj, dict):
        scalars = {k: v for k, v in obj.items() if not isinstance(v, dict | list)}
        parts = []
        if scalars:
            parts.append(_table(["field", "value"], [[str(k), _num(v, 3)] for k, v in scalars.items()]))
        for k, v in obj.items():
            if isinstance(v, dict | list) and depth < 2:
                parts.append(f"**{k}**\n\n{_generic(v, depth + 1)}")
        return "\n\n".join(parts)
    if isinstance(obj, list) and obj and all(isinstance(x, dict) for x in obj):
        keys: list[str] = []
        for x in obj:
            keys += [k for k, v in x.items() if k not in keys and not isinstance(v, dict | list)]
        return _table(keys, [[_num(x.get(k), 3) for k in keys] for x in obj])
    return "```\n" + json.dumps(obj, indent=1)[:4000] + "\n```"


# ---------------------------------------------------------------------- profiles
def collect_profiles(results: Path, partitioned_logs: Path = PARTITIONED_LOGS) -> list[dict[str, Any]]:
    """The driver-log profile of each compared pair of runs of this results directory's benchmarks.

    Compaction: floor and ours per dataset (their logs are named in ``compaction.json``).
    Partitioned: the full rewrite and the touched-only runs per size (``partitioned.py``'s log
    names). Saved to ``profile.json`` so that the report can be written again once the logs
    (under ``.run/``, not kept) are gone.
    """
    runs: list[dict[str, Any]] = []
    comp = results / "compaction.json"
    if comp.exists():
        for d in json.loads(comp.read_text(encoding="utf-8")).get("datasets", []):
            for engine in ("floor", "ours"):
                job = d["jobs"].get(engine) or {}
                p = job_profile.profile(job["log_file"]) if job.get("log_file") else None
                if p:
                    runs.append({"benchmark": "compaction", "run": f"{d['dataset']} {engine}", **p})
    part = results / "partitioned.json"
    if part.exists():
        for size in json.loads(part.read_text(encoding="utf-8")).get("sizes", []):
            n = size["rows"]
            label = f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n:,}"
            names = {"full rewrite (flat)": f"flat_{n}_change.log"}
            names |= {f"touched-only ({k})": f"parted_{k}_{n}_change.log" for k in size.get("touched_only", {})}
            for what, name in names.items():
                p = job_profile.profile(partitioned_logs / name)
                if p:
                    runs.append({"benchmark": "partitioned", "run": f"{label} {what}", **p})
    saved = results / PROFILE
    if runs:
        saved.write_text(json.dumps(runs, indent=1) + "\n", encoding="utf-8")
    elif saved.exists():
        runs = json.loads(saved.read_text(encoding="utf-8"))
    return runs


def profile_markdown(runs: list[dict[str, Any]]) -> str:
    """Counts and times per run, then each run's longest call sites."""
    rows = [
        [
            r["benchmark"],
            r["run"],
            _num(r["spark_jobs"]),
            _num(r["stages"]),
            _num(r["tasks"]),
            _num(r["stage_s"], 2),
            _num(r["longest_stage_s"], 2),
            _num(r["own_s"], 2),
            # Overlapping stages can sum to more than the time they cover: then nothing is known outside them.
            _num(max(0.0, round(r["own_s"] - r["stage_s"], 2)) if r.get("own_s") is not None else None, 2),
            _num(r["listing_s"], 2),
        ]
        for r in runs
    ]
    header = ["benchmark", "run", "Spark jobs", "stages", "tasks", "in stages s", "longest stage s"]
    header += ["job's own s", "outside stages s", "file listing s"]
    sites = [
        [
            r["run"],
            _num(t["stages"]),
            _num(t["s"], 2),
            ", ".join(_num(x, 2) for x in t.get("longest_s", [])),
            t["site"].replace("|", "\\|"),
        ]
        for r in runs
        if r["run"].endswith(" ours") or "touched" in r["run"]
        for t in r["top"]
    ]
    return "\n".join(
        [
            "## Where the time goes",
            "",
            "From each job's Spark driver log in this run (`bench/job_profile.py`): Spark jobs (adaptive "
            "execution's map-stage jobs included), stages run (skipped ones not) and tasks; "
            "seconds in stages (summed: adaptive execution may run two at once) and the longest one; the job's "
            "own time from its `compacting` to its `compacted` log line (no JVM or session start; the floor "
            "writes no such lines) and what of it was outside any stage (planning, listing, metastore and Python "
            "between Spark jobs; 0 where overlapping stages sum to more than the job's own time).",
            "",
            _table(header, rows),
            "",
            "The call sites that took longest in ours and in the touched-only runs (stages Spark starts on its "
            "own threads, such as adaptive execution's query stages and writes, carry no Python line):",
            "",
            _table(["run", "stages", "s", "longest stages s", "call site"], sites),
            "",
        ]
    )


def other_sections(results: Path) -> list[str]:
    files = [p for p in results.glob("*.json") if p.name not in ("compaction.json", PROFILE, SPARK_PEERS)]
    rank = {name: i for i, name in enumerate(KNOWN_ORDER)}
    sections = []
    for p in sorted(files, key=lambda p: (rank.get(p.stem, len(rank)), p.stem)):
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            sections.append(f"## {p.stem}\n\n`{p.name}` is unreadable: {exc}\n")
            continue
        body = data.get("markdown") if isinstance(data, dict) else None
        title = data.get("title", p.stem) if isinstance(data, dict) else p.stem
        sections.append(f"## {title}\n\nFrom `{p.name}`.\n\n{body if isinstance(body, str) else _generic(data)}\n")
    return sections


def write_report(results: Path = RESULTS, partitioned_logs: Path = PARTITIONED_LOGS) -> Path:
    """Write ``RESULTS.md`` (and ``compaction.png``) from the JSON files in ``results``."""
    parts = ["# Benchmark results", "", "Written by `make bench` (`bench/report.py`); do not edit by hand.", ""]
    targets = targets_table(results)
    if targets:
        parts += ["## Targets", "", targets, ""]
    if scaling_chart(results, results / "scaling.png"):
        parts += ["![partitioned scaling and the policy day](scaling.png)", ""]
    comp = results / "compaction.json"
    if comp.exists():
        data = json.loads(comp.read_text(encoding="utf-8"))
        if data.get("datasets"):
            compaction_chart(data, results / "compaction.png")
            parts += [compaction_markdown(data), "![compaction](compaction.png)", ""]
    peers = results / SPARK_PEERS
    if peers.exists():
        data = json.loads(peers.read_text(encoding="utf-8"))
        host = data.get("host", {})
        parts += [
            "## Compaction against the Spark peers",
            "",
            f"A compaction run of its own (`{SPARK_PEERS}`): {data.get('generated_at', '?')} at commit "
            f"`{data.get('git', '?')}`, sizes {data.get('settings', {}).get('sizes')}, warm repeats "
            f"{data.get('settings', {}).get('warm_repeats')}, load average {host.get('loadavg_start')} at the start "
            f"and {host.get('loadavg_end')} at the end on {host.get('cpus')} CPUs; {data.get('total_s')} s in all.",
            *spark_peers_markdown(data),
            "",
        ]
    parts += other_sections(results)
    runs = collect_profiles(results, partitioned_logs)
    if runs:
        parts.append(profile_markdown(runs))
    out = results / "RESULTS.md"
    out.write_text("\n".join(parts).rstrip() + "\n", encoding="utf-8")
    log.info("wrote %s", out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--partitioned-logs", type=Path, default=PARTITIONED_LOGS, help="bench/partitioned.py's driver logs"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    write_report(args.results, args.partitioned_logs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
