"""A real PostgreSQL server for the tests: ``initdb`` in a temporary directory, listening on
a free loopback port, password authentication (so the tests can check that the password never
shows), stopped and removed at the end.

PostgreSQL refuses to run as root, and the test machines run as root: then the server runs as
the ``postgres`` user, on a directory it owns.  Without ``initdb`` on PATH the tests that need
a server are skipped, unless ``TENSORTUNE_REQUIRE_POSTGRES`` is set (CI sets it).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

PASSWORD = "pw-" + uuid.uuid4().hex[:12]
USER = "tt_user"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PostgresServer:
    root: Path
    port: int
    as_owner: list[str]

    @property
    def data(self) -> Path:
        return self.root / "data"

    def _pg_ctl(self, *args: str) -> None:
        subprocess.run([*self.as_owner, "pg_ctl", "-D", str(self.data), *args], check=True,
                       capture_output=True, timeout=120)  # fmt: skip

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off -c max_connections=60")  # fmt: skip
        self._pg_ctl("-l", str(self.root / "log"), "-o", options, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("-m", mode, "-w", "stop")

    def restart(self) -> None:
        """Stop (closing every client's connection) and start again."""
        self.stop("fast")
        self.start()

    def url(self, database: str, *, password: str | None = PASSWORD) -> str:
        secret = f":{password}" if password is not None else ""
        return f"postgresql://{USER}{secret}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)


def start_server() -> PostgresServer:
    root = Path(tempfile.mkdtemp(prefix="tensortune-pg-"))
    as_owner: list[str] = []
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(root, owner.pw_uid, owner.pw_gid)
        as_owner = ["runuser", "-u", "postgres", "--"]
    pwfile = root / "pwfile"
    pwfile.write_text(PASSWORD + "\n")
    if as_owner:
        os.chown(pwfile, pwd.getpwnam("postgres").pw_uid, -1)
    subprocess.run([*as_owner, "initdb", "-D", str(root / "data"), "-U", USER,
                    "--auth=scram-sha-256", f"--pwfile={pwfile}", "-E", "UTF8", "--no-sync"],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    server = PostgresServer(root, _free_port(), as_owner)
    server.start()
    return server


def stop_server(server: PostgresServer) -> None:
    try:
        server.stop("immediate")
    finally:
        shutil.rmtree(server.root, ignore_errors=True)


def available() -> bool:
    return shutil.which("initdb") is not None and shutil.which("pg_ctl") is not None
