"""Jars from a Maven repository, pinned by a lock file of SHA-256 sums (embedded stack layer).

A lock file has one jar a line, ``group:artifact:version sha256``, and ``#`` comments. Each jar is
fetched with a plain GET of ``<base>/<group path>/<artifact>/<version>/<artifact>-<version>.jar``
into a temporary folder beside the destination; only when every sum matches is that folder moved
into place, so a destination is either the complete, verified set or absent. No Maven is needed.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
_PART = r"[A-Za-z0-9_.\-]+"
_LINE = re.compile(rf"^({_PART}):({_PART}):({_PART})\s+([0-9a-f]{{64}})$")


class ChecksumMismatchError(RuntimeError):
    """A downloaded jar is not the one the lock file pins."""


@dataclass(frozen=True)
class LockedJar:
    group: str
    artifact: str
    version: str
    sha256: str

    @property
    def coordinates(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"

    @property
    def filename(self) -> str:
        return f"{self.artifact}-{self.version}.jar"

    def url(self, base_url: str = MAVEN_CENTRAL) -> str:
        return "/".join([base_url.rstrip("/"), *self.group.split("."), self.artifact, self.version, self.filename])


def read_lock(path: Path) -> list[LockedJar]:
    jars = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        found = _LINE.match(line)
        if found is None:
            raise ValueError(f"{path}:{number}: expected 'group:artifact:version sha256', got {raw!r}")
        jars.append(LockedJar(*found.groups()))
    if len({j.filename for j in jars}) != len(jars):
        raise ValueError(f"{path}: two entries would write the same jar file")
    return jars


def lock_digest(jars: Iterable[LockedJar]) -> str:
    """One sum for a whole set: a cache built from another lock is told apart by it."""
    text = "".join(f"{j.coordinates} {j.sha256}\n" for j in sorted(jars, key=lambda j: j.coordinates))
    return hashlib.sha256(text.encode()).hexdigest()


def format_lock(jars: Iterable[LockedJar], header: str) -> str:
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += [f"{j.coordinates} {j.sha256}" for j in sorted(jars, key=lambda j: j.coordinates)]
    return "\n".join(lines) + "\n"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _contexts() -> list[ssl.SSLContext]:
    """The system's certificates first; certifi's bundle when they fail (python.org's macOS builds
    come without system certificates until their "Install Certificates" step is run)."""
    contexts = [ssl.create_default_context()]
    try:
        import certifi
    except ImportError:
        return contexts
    return [*contexts, ssl.create_default_context(cafile=certifi.where())]


def _download(url: str, dest: Path, attempts: int = 3, timeout: float = 60.0) -> str:
    """GET ``url`` into ``dest``; returns the SHA-256 of what was written."""
    contexts = _contexts()
    for attempt in range(1, attempts + 1):
        context = contexts[min(attempt - 1, len(contexts) - 1)]
        try:
            digest = hashlib.sha256()
            with urllib.request.urlopen(url, timeout=timeout, context=context) as response, dest.open("wb") as out:
                for chunk in iter(lambda: response.read(1 << 20), b""):
                    digest.update(chunk)
                    out.write(chunk)
            return digest.hexdigest()
        except urllib.error.HTTPError as exc:
            if exc.code == 404 or attempt == attempts:
                raise RuntimeError(f"downloading {url} failed: HTTP {exc.code} {exc.reason}") from exc
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            if attempt == attempts:
                raise RuntimeError(f"downloading {url} failed after {attempts} tries: {exc}") from exc
        time.sleep(attempt)
    raise AssertionError("unreachable")


def fetch_locked(jars: list[LockedJar], dest: Path, *, base_url: str = MAVEN_CENTRAL,
                 reuse: Path | None = None, workers: int = 4) -> dict[str, int]:
    """Make ``dest`` hold exactly ``jars``, each verified against its SHA-256.

    A jar already in ``reuse`` (an older copy of ``dest``) with the right sum is copied instead of
    downloaded. Returns how many jars were downloaded and reused. The caller serialises calls for
    one ``dest`` (a file lock): this function only makes sure no half-made folder is ever there.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    counts = {"downloaded": 0, "reused": 0}
    try:
        to_fetch = []
        for jar in jars:
            old = reuse / jar.filename if reuse is not None else None
            if old is not None and old.is_file() and sha256_of(old) == jar.sha256:
                shutil.copy2(old, staging / jar.filename)
                counts["reused"] += 1
            else:
                to_fetch.append(jar)

        def fetch(jar: LockedJar) -> None:
            got = _download(jar.url(base_url), staging / jar.filename)
            if got != jar.sha256:
                raise ChecksumMismatchError(
                    f"{jar.filename} ({jar.coordinates}) from {jar.url(base_url)} has SHA-256 {got}, but the "
                    f"lock file pins {jar.sha256}: nothing was installed. A proxy or mirror may have served "
                    f"another file; try again, or check the mirror")

        with ThreadPoolExecutor(max_workers=workers) as pool:
            for future in [pool.submit(fetch, jar) for jar in to_fetch]:
                future.result()
        counts["downloaded"] = len(to_fetch)
        # Belt and braces: what is about to be installed is exactly the lock, file by file.
        expected = {j.filename: j.sha256 for j in jars}
        present = {p.name: sha256_of(p) for p in staging.iterdir()}
        if present != expected:
            raise ChecksumMismatchError(f"the staged jars in {staging} do not match the lock file")
        staging.chmod(0o755)
        if dest.exists():
            old_copy = Path(tempfile.mkdtemp(prefix=f".{dest.name}-old-", dir=dest.parent))
            os.replace(dest, old_copy / dest.name)
            os.replace(staging, dest)
            shutil.rmtree(old_copy, ignore_errors=True)
        else:
            os.replace(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return counts
