"""The embedded stores' SQL, run on PostgreSQL: one seam instead of a second copy of the code.

The alert layer's state (:mod:`gpuscope.alert.statedb`, SQLite) and the lineage registry
(:mod:`gpuscope.lineage.registry`, DuckDB) write SQL in their embedded dialect. On a sharded hub
they run unchanged over :class:`PgSql`, which translates the few differences: ``?`` placeholders,
``INSERT OR REPLACE`` (an upsert on the table's key), ``rowid`` (a ``seq`` column) and
``lastrowid`` (``RETURNING`` the table's serial column). Tables live in the cluster's database
(:mod:`.schema`), so every hub reads and writes the same rows.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, TypeVar

import psycopg

from gpuscope.cluster.membership import connect
from gpuscope.cluster.schema import create_schema
from gpuscope.cluster.txretry import in_tx
from gpuscope.counters import Counters

T = TypeVar("T")

#: table -> (key columns, the other columns in table order): what ``INSERT OR REPLACE`` upserts
UPSERTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "silences": (("id",), ("doc", "ends_at")),
    "acks": (("alert_id",), ("doc",)),
    "lineage_runs": (("job",), ("started_at", "meta")),
    "lineage_checkpoints": (("job", "step"), ("manifest_hash", "path", "created_at")),
    "lineage_aliases": (("model", "alias"), ("version", "set_at")),
}
#: table -> serial column returned as ``lastrowid`` by an INSERT
SERIALS: dict[str, str] = {"history": "seq"}

_REPLACE = re.compile(r"^\s*INSERT OR REPLACE INTO (\w+)", re.IGNORECASE)
_INSERT = re.compile(r"^\s*INSERT INTO (\w+)", re.IGNORECASE)


@lru_cache(maxsize=256)
def translate(sql: str) -> str:
    """The PostgreSQL form of one statement in the embedded dialect."""
    out = re.sub(r"\browid\b", "seq", sql.replace("%", "%%").replace("?", "%s"))
    replace = _REPLACE.match(out)
    if replace:
        table = replace.group(1)
        if table not in UPSERTS:
            raise ValueError(f"INSERT OR REPLACE INTO {table}: its key is not declared in UPSERTS")
        keys, cols = UPSERTS[table]
        sets = ", ".join(f"{c} = excluded.{c}" for c in cols)
        out = _REPLACE.sub(f"INSERT INTO {table}", out, count=1)
        out += f" ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {sets}"
        return out
    insert = _INSERT.match(out)
    if insert and insert.group(1) in SERIALS and "RETURNING" not in out.upper():
        out += f" RETURNING {SERIALS[insert.group(1)]}"
    return out


class PgCursor:
    """A finished statement: its rows, how many it touched, and the serial id an INSERT got."""

    def __init__(self, cur: psycopg.Cursor[tuple[Any, ...]], returning: bool) -> None:
        self.rowcount = cur.rowcount
        self._rows: list[tuple[Any, ...]] = cur.fetchall() if cur.description is not None else []
        self.lastrowid: int | None = int(self._rows[0][0]) if returning and self._rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self._rows

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows[0] if self._rows else None


class PgSql:
    """One PostgreSQL connection that speaks the embedded dialect, shared by threads (one at a
    time), re-opened when the server dropped it. Every statement outside :meth:`tx` commits."""

    shared = True

    def __init__(self, dsn: str, counters: Counters | None = None) -> None:
        self.dsn = dsn
        self.counters = counters if counters is not None else Counters()
        self._lock = threading.RLock()
        self._con = self._open()

    def _open(self) -> psycopg.Connection[tuple[Any, ...]]:
        con = connect(self.dsn)
        create_schema(con, self.counters)  # this may be the first hub of the cluster, before it joins
        return con

    def _live(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._con.closed or self._con.broken:
            self._con = self._open()
        return self._con

    def execute(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] = (), /) -> PgCursor:
        text = translate(sql)
        with self._lock:
            cur = self._live().execute(text, parameters)
            return PgCursor(cur, " RETURNING " in text and _INSERT.match(text) is not None)

    @contextmanager
    def tx(self) -> Iterator[PgSql]:
        """One transaction, committed on exit (rolled back on error)."""
        with self._lock, self._live().transaction():
            yield self

    def transact(self, work: Callable[[PgSql], T]) -> T:
        """``work`` in one transaction, run again when PostgreSQL aborted it for a deadlock or a
        serialization failure (:func:`gpuscope.cluster.txretry.in_tx`)."""
        with self._lock:
            return in_tx(self._live(), lambda _con: work(self), self.counters)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.execute(sql, params).fetchall()

    def close(self) -> None:
        with self._lock:
            self._con.close()
