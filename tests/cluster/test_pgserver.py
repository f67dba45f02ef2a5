"""The PostgreSQL test server itself: starts, hands out isolated databases, answers SQL."""

from __future__ import annotations

import psycopg

from pgserver import PostgresServer


def test_fresh_databases_are_isolated(postgres_server: PostgresServer) -> None:
    first, second = postgres_server.create_database(), postgres_server.create_database()
    with psycopg.connect(first, autocommit=True) as con:
        con.execute("CREATE TABLE t (x int)")
        con.execute("INSERT INTO t VALUES (1)")
        assert con.execute("SELECT sum(x) FROM t").fetchone() == (1,)
    with psycopg.connect(second, autocommit=True) as con:
        row = con.execute("SELECT count(*) FROM pg_tables WHERE tablename = 't'").fetchone()
        assert row == (0,)
