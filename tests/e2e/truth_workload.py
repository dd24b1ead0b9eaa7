"""The seeded workload of the PostgreSQL-truth tests, shared by every source they run through.

PostgreSQL is the oracle: a test runs :class:`Workload` against a real table, lands the changes its
source (wal2json, Debezium) delivers, compacts, and compares the lake with :func:`snapshot`, the
table's ``SELECT *``.  Nothing here comes from the project's code: these are SQL statements and their
results.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

#: The long transaction's rows have ids from here on; the workload leaves them alone.
LONG_IDS = 1000
TRANSACTIONS_PER_HOUR = 30
KEY_SPACE = range(1, 61)
#: The columns of ``students`` that PostgreSQL and the lake share; op, ts_ms and lsn exist only in the lake.
DATA_TYPES = {"id": "int", "full_name": "string", "grade": "int"}
#: The kinds of statement every keyed run must have made (``Workload.kinds``); keyless runs add "duplicate".
KINDS = {"insert", "update", "delete", "rekey", "multi", "reinsert", "bulk"}


class Workload:
    """Random transactions on a students table; it reads the current keys from PostgreSQL to pick valid ones.

    ``table`` is the table's (quoted) name.  Its first three columns are ``id``, ``full_name`` and
    ``grade``; any further column takes its default on insert and is left alone, except that
    ``rekey_set`` (SQL such as ``, bio = bio || ''``) is added to a key change's ``SET``.
    """

    def __init__(
        self,
        conn: Any,
        rng: random.Random,
        duplicates: bool = False,
        table: str = "students",
        rekey_set: str = "",
    ) -> None:
        self.conn = conn
        self.rng = rng
        #: A table without a key may hold equal rows: insert copies of existing ones too.
        self.duplicates = duplicates
        self.table = table
        self.rekey_set = rekey_set
        self.committed = 0
        self.rolled_back = 0
        self.kinds: Counter[str] = Counter()

    def _keys(self, cur: Any) -> tuple[list[int], list[int]]:
        # Not the long transaction's rows (LONG_ROWS): never touched, a loss of them stays visible.
        cur.execute(f"SELECT id FROM {self.table} WHERE id < %s", (LONG_IDS,))
        live = sorted(r[0] for r in cur.fetchall())
        free = sorted(set(KEY_SPACE) - set(live))
        return live, free

    def _name(self) -> str | None:
        return None if self.rng.random() < 0.1 else f"student-{self.rng.randrange(10**6)}"

    def _grade(self) -> int | None:
        return None if self.rng.random() < 0.1 else self.rng.randrange(1, 13)

    def statement(self, cur: Any) -> None:
        t = self.table
        live, free = self._keys(cur)
        # Inserts keep the table around 30 rows, so there is always something to update and delete.
        kinds = ["insert"] * (6 if len(live) < 30 else 1)
        if live:
            kinds += ["update", "update", "delete", "rekey", "multi", "reinsert", "bulk"]
            kinds += ["duplicate"] * self.duplicates
        if not free:
            kinds = [k for k in kinds if k not in ("insert", "rekey")]
        kind = self.rng.choice(kinds)
        self.kinds[kind] += 1
        if kind == "insert":
            cur.execute(f"INSERT INTO {t} VALUES (%s, %s, %s)", (self.rng.choice(free), self._name(), self._grade()))
        elif kind == "update":
            cur.execute(
                f"UPDATE {t} SET full_name = %s, grade = %s WHERE id = %s",
                (self._name(), self._grade(), self.rng.choice(live)),
            )
        elif kind == "delete":
            cur.execute(f"DELETE FROM {t} WHERE id = %s", (self.rng.choice(live),))
        elif kind == "rekey":
            # The key itself changes: Debezium emits a delete of the old key and a create of the new.
            cur.execute(
                f"UPDATE {t} SET id = %s{self.rekey_set} WHERE id = %s", (self.rng.choice(free), self.rng.choice(live))
            )
        elif kind == "multi":
            key = self.rng.choice(live)
            for _ in range(self.rng.randrange(2, 5)):
                cur.execute(
                    f"UPDATE {t} SET grade = %s, full_name = %s WHERE id = %s", (self._grade(), self._name(), key)
                )
        elif kind == "duplicate":
            cur.execute(f"INSERT INTO {t} SELECT * FROM {t} WHERE id = %s LIMIT 1", (self.rng.choice(live),))
        elif kind == "reinsert":
            key = self.rng.choice(live)
            cur.execute(f"DELETE FROM {t} WHERE id = %s", (key,))
            cur.execute(f"INSERT INTO {t} VALUES (%s, %s, %s)", (key, self._name(), self._grade()))
        else:  # bulk: one statement, many rows
            cur.execute(
                f"UPDATE {t} SET grade = coalesce(grade, 0) + 1 WHERE id < %s AND id %% 7 = %s",
                (LONG_IDS, self.rng.randrange(7)),
            )

    def hour(self, transactions: int = TRANSACTIONS_PER_HOUR) -> None:
        for _ in range(transactions):
            with self.conn.cursor() as cur:
                for _ in range(self.rng.randrange(1, 5)):
                    self.statement(cur)
            if self.rng.random() < 0.15:
                self.conn.rollback()  # never happened: the source must not show it
                self.rolled_back += 1
            else:
                self.conn.commit()
                self.committed += 1


def snapshot(conn: Any, table: str = "students", columns: list[str] | None = None) -> list[dict[str, Any]]:
    """PostgreSQL's rows of ``table`` now (``columns``: default the ``DATA_TYPES`` ones): the expected result."""
    columns = columns or list(DATA_TYPES)
    with conn.cursor() as cur:
        cur.execute(f"SELECT {', '.join(columns)} FROM {table}")
        rows = [dict(zip(columns, r, strict=True)) for r in cur.fetchall()]
    conn.commit()
    return rows


def data_only(rows: list[dict[str, Any]], columns: Any = DATA_TYPES) -> list[dict[str, Any]]:
    """Only the ``columns`` of each row (the lake's rows have op, LSN and bookkeeping columns too)."""
    return [{k: r.get(k) for k in columns} for r in rows]


# ------------------------------------------------------------------ through Debezium (test_debezium_truth.py)
#: The increment formats the Debezium truth test lands the connector's records as, one lake each.
DEBEZIUM_FORMATS = ("json", "avro", "parquet", "avro-registry")
#: The variant whose records a second connector writes with Apicurio's AvroConverter in the Confluent wire format,
#: their schemas in the stack's schema registry; it lands as ``format: avro`` files of the registry's writer schema.
REGISTRY_FORMAT = "avro-registry"


def debezium_topic_prefix(fmt: str) -> str:
    """The connector's ``topic.prefix`` whose topics the ``fmt`` lake lands: the registry variant has its own."""
    return "cdcreg" if fmt == REGISTRY_FORMAT else "cdc"


def registry_format(fmt: str) -> str:
    """The registry's ``format`` of the ``fmt`` lake (the registry variant lands Avro files)."""
    return "avro" if fmt == REGISTRY_FORMAT else fmt


KEYED, KEYLESS = "students", "students_keyless"
#: The tables of the connector (``table.include.list``, the publication).
DEBEZIUM_TABLES = [f"public.{KEYED}", f"public.{KEYLESS}"]
#: A TOAST value: 12,800 characters of md5 hex, different per row.
BIO_DEFAULT = "repeat(md5(random()::text), 400)"
DEBEZIUM_DDL = [
    f"CREATE TABLE {KEYED} (id int PRIMARY KEY, full_name text, grade int, bio text DEFAULT {BIO_DEFAULT})",
    # Out of line and uncompressed: an update that leaves bio alone sends it as "unchanged toast", and
    # Debezium as the placeholder __debezium_unavailable_value.
    f"ALTER TABLE {KEYED} ALTER COLUMN bio SET STORAGE EXTERNAL",
    f"CREATE TABLE {KEYLESS} (id int, full_name text, grade int)",
    # No key: the whole old row of an update or delete is sent only under FULL.
    f"ALTER TABLE {KEYLESS} REPLICA IDENTITY FULL",
]
#: A key change also rewrites bio: the new key's create would otherwise carry the placeholder, with no
#: earlier event of that key to take the value from (pgoutput does not send an unchanged TOAST value).
KEYED_REKEY_SET = ", bio = bio || ''"
KEYED_TYPES = {**DATA_TYPES, "bio": "string"}


def landing_group(fmt: str) -> str:
    """The landing consumer's group of format ``fmt``: one group per format reads the same topics."""
    return f"truth-{fmt}"


def debezium_registry_doc(fmt: str, table: str, lake: Any) -> dict[str, Any]:
    """The registry entry of ``table`` landed as ``fmt``: Debezium's envelope, the debezium preset's order.

    Both tables declare the source position that survives a killed Connect worker's re-delivery:
    ``__commit_lsn`` (``source.sequence``'s first LSN) and ``__lsn`` (the keyed table's order), and the
    keyless one ``__row`` too (its identity: a snapshot's rows share one LSN); never the Kafka offset,
    which a re-sent record gets anew."""
    from cdc_compaction.devtools import conformance as conf

    columns: list[dict[str, str]] = [{"name": n, "type": t} for n, t in DATA_TYPES.items()]
    if table == KEYED:
        fields: dict[str, Any] = {
            "primary_key": ["id"],
            # The placeholder Debezium sends for a TOAST column an update left alone: the key keeps its value.
            "unchanged": {"columns": ["bio"]},
            "schema_changes": "evolve",
        }
        columns += [
            {"name": "bio", "type": "string"},
            {"name": "__op", "type": "string"},
            {"name": "__commit_lsn", "type": "bigint"},
            {"name": "__lsn", "type": "bigint"},
            {"name": "__deleted", "type": "string"},
        ]
    else:
        fields = {"mode": "keyless"}
        columns += [{"name": f"_before_{n}", "type": t} for n, t in DATA_TYPES.items()]
        columns += [{"name": n, "type": "bigint"} for n in ("__commit_lsn", "__lsn", "__row")]
        columns += [{"name": "__op", "type": "string"}]
    scn = conf.Scenario(
        path=lake / "unused.json",
        name=f"dbz_{table}_{fmt.replace('-', '_')}",
        about=f"{table} through Debezium, landed as {fmt}",
        table={"columns": columns, **fields},
        steps=[],
    )
    doc = conf.registry_doc(scn, lake)
    return {**doc, "source": "debezium", "format": registry_format(fmt), "envelope": "debezium"}
