"""A throwaway PostgreSQL server on loopback (Debian's package), for tests and benchmarks.

PostgreSQL refuses to run as root, and CI runs as root: the cluster's files are then handed to the
``postgres`` user the package creates and the server runs as that user. Each test that wants
isolation asks for a fresh database on the one server of the session.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import psycopg

from support import free_port


def postgres_bin_dir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` live: Debian keeps them out of PATH, per major version."""
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), reverse=True
    )
    for path in candidates:
        if (path / "initdb").exists() and (path / "pg_ctl").exists():
            return path
    found = shutil.which("pg_ctl")
    return Path(found).resolve().parent if found else None


class PostgresServer:
    """``initdb`` + ``pg_ctl start`` in a temporary directory; :meth:`stop` removes everything."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="gpuscope-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.user = "gpuscope"
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            os.chmod(self.root, 0o755)
            shutil.chown(self.root, "postgres", "postgres")

    def _run(self, *args: str) -> None:
        cmd = [str(self.bin_dir / args[0]), *args[1:]]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stdout}{done.stderr}")

    def start(self) -> PostgresServer:
        self._run("initdb", "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8", "--no-sync")
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-o", options, "-w", "start")
        return self

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """A fresh, empty database; returns its DSN."""
        name = name or f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.dsn(), autocommit=True) as con:
            con.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def log(self) -> str:
        path = self.root / "log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
