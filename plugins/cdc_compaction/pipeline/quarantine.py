"""The quarantine: refused change events and files, kept with their reasons, and re-ingested after a fix.

Two kinds of entries live under ``<storage_root>/quarantine/`` (see README, "Quarantine"):

``rows/<version>/``
    events the compaction that made ``<version>`` refused row by row (null key, null
    ordering value, unknown op code).  Parquet with the registry columns plus
    ``_cdc_increment``, ``_cdc_file``, ``_cdc_pos``, ``_cdc_reject_reason``; the manifest
    counts them by reason and by source file.

``files/<plan>/``
    whole files a plan set aside (``on_bad_file: quarantine``): unreadable, or a schema
    that does not fit the registry.  Byte-for-byte copies under their increment name.

Re-ingesting puts the events back into the landing area, so the next run compacts
them under the normal rule -- the rule does not depend on arrival order, so late is
fine.  Rows go back into their original increment as ``reingest-<entry>-NNNNN.parquet``
(in their original order); files go back under their own name, or a fixed copy does.
Every manifest records when it was re-ingested, and an entry is re-ingested once.

Re-ingesting is resumable: the manifest first records the intent (every target file and
its size), then the files are landed one by one, and the entry is marked re-ingested at
the end.  A re-ingest killed half-way is finished by running it again: files of the
intent that are already in place are kept, the missing ones are landed.  Targets must be
increments of the table's layout (``increment_2026112209``), never another path.
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cdc_compaction.core.docs import doc_ref
from cdc_compaction.core.exceptions import QuarantineError
from cdc_compaction.core.inputs import arrow_schema
from cdc_compaction.core.lake import Lake
from cdc_compaction.core.landing import increment_hour, is_data, layout_example
from cdc_compaction.core.storage import read_parquet, storage_for
from cdc_compaction.job.faults import fault_point

log = logging.getLogger(__name__)

MANIFEST = "_manifest.json"
#: A version directory name: ``v00000001-<plan>``, or ``v00000001-<plan>-<attempt>``.
_VERSION = re.compile(r"^v(\d{8})-([0-9a-z]+(?:-[0-9a-z]+)?)$")


def _now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass
class Entry:
    """One quarantine entry as listed to people."""

    id: str
    kind: str
    path: str
    count: int
    reasons: dict[str, int]
    created_at: str
    reingested_at: str | None

    def line(self) -> str:
        status = f"re-ingested {self.reingested_at}" if self.reingested_at else "waiting"
        unit = "rows" if self.kind == "rows" else "files"
        return f"{self.id:<40} {self.count:>7} {unit:<5} {status:<40} {json.dumps(self.reasons, sort_keys=True)}"


class Quarantine:
    """One table's quarantine area."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self.storage = lake.storage
        self.root = lake.layout.quarantine

    # -- writing ------------------------------------------------------------------
    def _manifest_path(self, d: str) -> str:
        return posixpath.join(d, MANIFEST)

    def _read_manifest(self, d: str) -> dict[str, Any] | None:
        path = self._manifest_path(d)
        if not self.storage.exists(path):
            return None
        return json.loads(self.storage.read_text(path))

    def _write_manifest(self, d: str, doc: dict[str, Any]) -> None:
        self.storage.write_text(self._manifest_path(d), json.dumps(doc, indent=1, sort_keys=True))

    def set_aside_file(self, plan_id: str, increment: str, name: str, src: str, size: int, reason: str) -> str:
        """Move one refused landed file into ``files/<plan_id>``: copy, record, verify, delete."""
        d = self.lake.layout.quarantined_files_dir(plan_id)
        dst = posixpath.join(d, increment, name)
        if not (self.storage.exists(dst) and self.storage.size(dst) == size):
            self.storage.copy(src, dst)
        if self.storage.size(dst) != size:
            raise QuarantineError(f"quarantined copy {dst} has {self.storage.size(dst)} bytes, {src} has {size}")
        doc = self._read_manifest(d) or {
            "kind": "files",
            "table": self.lake.cfg.qualified_name,
            "plan_id": plan_id,
            "created_at": _now(),
            "files": [],
            "reingested_at": None,
        }
        if not any(f["increment"] == increment and f["name"] == name for f in doc["files"]):
            doc["files"].append(
                {"increment": increment, "name": name, "size": size, "reason": reason, "original_path": src}
            )
            self._write_manifest(d, doc)
        # The manifest names the copy before the original goes: a crash here leaves both, never neither.
        self.storage.delete(src)
        return dst

    def _rows_manifest(self, version: str, seq: int, stats: dict[str, Any], created_at: str) -> dict[str, Any]:
        return {
            "kind": "rows",
            "table": self.lake.cfg.qualified_name,
            "version": version,
            "commit": seq,
            "created_at": created_at,
            "rows": int(stats["rejected_rows"]),
            "by_reason": stats.get("rejected_by_reason", {}),
            "by_file": stats.get("rejected_by_file", {}),
            "reingested_at": None,
        }

    def record_rows(self, version: str, seq: int, stats: dict[str, Any]) -> None:
        """Write the manifest of a committed version's refused rows (idempotent)."""
        d = self.lake.layout.quarantine_dir(version)
        if int(stats.get("rejected_rows", 0)) <= 0 or self._read_manifest(d) is not None:
            return
        self._write_manifest(d, self._rows_manifest(version, seq, stats, _now()))

    def _committed_rows_doc(self, version: str) -> dict[str, Any] | None:
        """The manifest of ``rows/<version>`` as ``record_rows`` writes it, if the commit records say so.

        A publish that crashed after its commit record has not written the manifest yet (the
        next run's archive step does), but its rows were refused for real all the same: the
        commit record decides, not the manifest.  None for rows of a version that was never
        committed (they are still pending; cleanup deletes them).
        """
        m = _VERSION.match(version)
        commit = self.lake.read_commit(int(m.group(1))) if m else None
        if commit is None or commit.version != version or int(commit.stats.get("rejected_rows", 0)) <= 0:
            return None
        return self._rows_manifest(version, commit.seq, commit.stats, commit.committed_at or _now())

    # -- reading ------------------------------------------------------------------
    def entries(self) -> list[Entry]:
        """Every entry; read-only (a missing manifest of committed rows is written by re-ingesting)."""
        out = []
        for kind in ("rows", "files"):
            for e in self.storage.list_dir(posixpath.join(self.root, kind)):
                doc = self._read_manifest(e.path) if e.is_dir else None
                if doc is None and e.is_dir and kind == "rows":
                    doc = self._committed_rows_doc(e.name)
                if doc is None:
                    continue  # rows of a version that was never committed: not refused for real
                if kind == "rows":
                    count, reasons = int(doc["rows"]), dict(doc["by_reason"])
                else:
                    count, reasons = len(doc["files"]), {}
                    for f in doc["files"]:
                        key = f["reason"].split(":")[0]
                        reasons[key] = reasons.get(key, 0) + 1
                out.append(
                    Entry(f"{kind}/{e.name}", kind, e.path, count, reasons, doc["created_at"], doc["reingested_at"])
                )
        return out

    def entry(self, entry_id: str) -> tuple[Entry, dict[str, Any]]:
        for e in self.entries():
            if e.id == entry_id:
                doc = self._read_manifest(e.path) or self._committed_rows_doc(posixpath.basename(e.path))
                assert doc is not None
                return e, doc
        known = ", ".join(e.id for e in self.entries()) or "none"
        raise QuarantineError(
            f"{self.lake.cfg.qualified_name} has no quarantine entry {entry_id!r} (entries: {known}); "
            "list them with `cdc-compaction quarantine list <db.table>`"
        )

    # -- re-ingesting -------------------------------------------------------------
    def reingest(self, entry_id: str, source: str | None = None, force: bool = False) -> list[str]:
        """Put an entry's events back into the landing area; return the files written there.

        ``source`` replaces the quarantined data with a corrected copy: for ``rows/``, a
        Parquet file or directory with the registry columns (and ``_cdc_increment``, to
        keep each row's increment); for ``files/``, a directory laid out like the entry
        (``<increment>/<file name>``).  Resumable: a re-ingest that was killed half-way is
        finished by calling it again (with the same ``source``).
        """
        entry, doc = self.entry(entry_id)
        if doc.get("reingested_at") and not force:
            raise QuarantineError(
                f"{entry_id} of {self.lake.cfg.qualified_name} was re-ingested at {doc['reingested_at']}; "
                "doing it again would land its events twice (harmless for the table, but noisy). "
                "Pass --force if that is what you want"
            )
        cfg = self.lake.cfg
        if entry.kind == "rows" and (cfg.format != "parquet" or cfg.envelope != "flattened"):
            # Rows go back as flattened Parquet files, which a table reading another form refuses as bad files.
            raise QuarantineError(
                f"{entry_id} of {cfg.qualified_name}: its rows would land as flattened Parquet, but the table reads "
                f"format {cfg.format} with envelope {cfg.envelope} ({doc_ref('concepts', 'input-formats')}); nothing "
                "was landed. "
                "To bring them back, fix the records in the landed file (its name and line are in the quarantined "
                "rows: _cdc_file, _cdc_pos) and land the fixed file in a new increment"
            )
        targets = self._rows_targets(entry, source) if entry.kind == "rows" else self._files_targets(doc, source)
        for t in targets:
            self._check_target(entry_id, t)
        planned = [{"increment": t.increment, "name": t.name, "size": t.size} for t in targets]
        intent = doc.get("reingest_intent")
        if intent and intent["files"] != planned:
            raise QuarantineError(
                f"{entry_id} of {self.lake.cfg.qualified_name}: an interrupted re-ingest started at "
                f"{intent['started_at']} from {intent['source'] or 'the quarantined copy'} would land "
                f"{_names(intent['files'])}, this one {_names(planned)}. Nothing was landed now: re-run it with "
                f"the same source ({'--from ' + intent['source'] if intent['source'] else 'no --from'}) to finish it"
            )
        if not intent:
            # The intent goes first: a re-ingest killed after it is finished by the next call.
            doc["reingest_intent"] = {"started_at": _now(), "source": source, "files": planned}
            self._write_manifest(entry.path, doc)
        written = []
        for i, t in enumerate(targets):
            written.append(self._land(entry_id, t, resuming=bool(intent)))
            if i == 0:
                fault_point("quarantine.after_first_reingested_file", self.lake.cfg.qualified_name)
        self._mark_complete(targets)
        doc["reingested_at"] = _now()
        doc["reingested_files"] = written
        doc.pop("reingest_intent", None)
        self._write_manifest(entry.path, doc)
        log.info("%s: re-ingested %s into %d landing files", self.lake.cfg.qualified_name, entry_id, len(written))
        return written

    def _check_target(self, entry_id: str, t: _Target) -> None:
        """Refuse a target outside the table's increments (``..``, ``/``, a name off the layout)."""
        cfg = self.lake.cfg
        if increment_hour(cfg, t.increment) is None:
            raise QuarantineError(
                f"{entry_id} of {cfg.qualified_name}: {t.increment!r} is not an increment name of the layout "
                f"{cfg.increments.prefix}{cfg.increments.time_format} (e.g. {layout_example(cfg)}), so its events "
                "would never be compacted (or would land outside the landing area). Nothing was landed: fix the "
                "_cdc_increment column (rows) or the directory name (files) of the source and pass it with --from"
            )
        # Landed under a name the plan would not read, the events would wait in the landing area forever.
        if "/" in t.name or not is_data(cfg, t.name):
            raise QuarantineError(
                f"{entry_id} of {cfg.qualified_name}: {t.name!r} is not a plain data file name; nothing was "
                "landed. Rename the file in the --from directory"
            )

    def _land(self, entry_id: str, t: _Target, resuming: bool) -> str:
        """Write one whole file into the landing area, the way a sink does (complete or absent).

        When finishing an interrupted re-ingest, a file of its intent that is in the landing
        area already (same size), or was compacted and archived since, is not landed again.
        """
        dst = posixpath.join(self.lake.layout.incremental, t.increment, t.name)
        if resuming:
            done = dst if self.storage.exists(dst) and self.storage.size(dst) == t.size else self._archived(t)
            if done is not None:
                log.info(
                    "%s: %s of %s was landed by an interrupted re-ingest", self.lake.cfg.qualified_name, done, entry_id
                )
                return dst
        if self.storage.exists(dst):
            raise QuarantineError(
                f"{entry_id} of {self.lake.cfg.qualified_name}: {dst} exists already in the landing area, so "
                "nothing more was landed; move that file away (or, for a files/ entry, pass a corrected copy "
                "with --from) and re-run"
            )
        if t.copy_from is not None:
            self.storage.copy(t.copy_from, dst)
        else:
            self.storage.write_bytes(dst, t.data or b"")
        return dst

    def _archived(self, t: _Target) -> str | None:
        """Where the archive keeps ``t`` if a run compacted it since it was landed, else None."""
        for c in self.storage.list_dir(self.lake.layout.archive):
            path = posixpath.join(c.path, t.increment, t.name)
            if c.is_dir and self.storage.exists(path) and self.storage.size(path) == t.size:
                return path
        return None

    def _mark_complete(self, targets: list[_Target]) -> None:
        cfg = self.lake.cfg
        if cfg.increments.completion == "marker":
            for inc in sorted({t.increment for t in targets}):
                d = posixpath.join(self.lake.layout.incremental, inc)
                self.storage.write_text(posixpath.join(d, cfg.increments.marker_file), "")

    def _rows_targets(self, entry: Entry, source: str | None) -> list[_Target]:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        from cdc_compaction.core.schema import effective_config

        # Refused rows carry the columns the source added (schema_changes: evolve): land those too.
        cfg = effective_config(self.lake.cfg, self.lake.storage)
        # --from may name a local file even for a lake on S3, or the reverse.
        where = source or entry.path
        table = read_parquet(storage_for(where, cfg.storage_conn_id), where)
        if "_cdc_increment" not in table.column_names:
            raise QuarantineError(
                f"{source} has no _cdc_increment column: keep it from the quarantined rows so every row "
                "goes back into its own increment (the tie-break between equal ordering values depends on it)"
            )
        missing = [c for c in cfg.column_names if c not in table.column_names]
        if missing:
            raise QuarantineError(f"{source or entry.path} lacks the registry columns {missing}")
        order = [(c, "ascending") for c in ("_cdc_increment", "_cdc_file", "_cdc_pos") if c in table.column_names]
        table = table.sort_by(order)
        schema = arrow_schema(cfg)
        tag = hashlib.sha1(entry.id.encode()).hexdigest()[:8]
        targets = []
        for inc in sorted(set(table.column("_cdc_increment").to_pylist()), key=str):
            if not isinstance(inc, str):
                raise QuarantineError(
                    f"{entry.id} of {cfg.qualified_name}: {source or entry.path} has rows whose _cdc_increment is "
                    f"{inc!r}, not an increment name; nothing was landed. Set it (e.g. {layout_example(cfg)}) and "
                    "pass the file with --from"
                )
            part = table.filter(pc.equal(table.column("_cdc_increment"), inc)).select(cfg.column_names)
            try:
                part = part.cast(schema)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise QuarantineError(
                    f"{source or entry.path}: rows for {inc} do not fit the registry's column types ({exc})"
                ) from exc
            buf = pa.BufferOutputStream()
            pq.write_table(part, buf)
            data = buf.getvalue().to_pybytes()
            targets.append(_Target(inc, f"reingest-{tag}-{len(targets):05d}.parquet", len(data), data=data))
        return targets

    def _files_targets(self, doc: dict[str, Any], source: str | None) -> list[_Target]:
        d = self.lake.layout.quarantined_files_dir(doc["plan_id"])
        # A corrected copy may live elsewhere (a local directory for a lake on S3): read it
        # through its own storage; the quarantine's own copy is copied inside the lake.
        src_storage = storage_for(source, self.lake.cfg.storage_conn_id) if source else self.storage
        targets = []
        for f in doc["files"]:
            src = posixpath.join(source or d, f["increment"], f["name"])
            if not src_storage.exists(src):
                raise QuarantineError(f"{src} does not exist: put the corrected file there, or omit --from")
            if source:
                with src_storage.open_read(src) as fh:
                    data = fh.read()
                targets.append(_Target(f["increment"], f["name"], len(data), data=data))
            else:
                targets.append(_Target(f["increment"], f["name"], self.storage.size(src), copy_from=src))
        return targets


def _names(files: list[dict[str, Any]]) -> str:
    return ", ".join(f"{f['increment']}/{f['name']} ({f['size']} bytes)" for f in files) or "nothing"


@dataclass(frozen=True)
class _Target:
    """One file a re-ingest lands: where, how big, and its bytes or the lake file to copy."""

    increment: str
    name: str
    size: int
    data: bytes | None = None
    copy_from: str | None = None
