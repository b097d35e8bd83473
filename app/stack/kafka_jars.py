"""The Kafka broker's jars: fetched from their lock into a cache; the lock rewritten (embedded stack layer).

The jars are pinned by kafka-jars.lock (coordinates and SHA-256 sums), fetched from Maven Central
with plain HTTPS GETs and cached, so only the first start on a machine downloads anything; neither
Maven nor Java has to be installed. `python -m app.stack.kafka fetch|lock` runs :func:`main`.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from app.stack.jars import MAVEN_CENTRAL, LockedJar, fetch_locked, format_lock, lock_digest, read_lock, sha256_of
from app.stack.java import find_java

HERE = Path(__file__).parent
KAFKA_VERSION = "4.1.1"
DEFAULT_CACHE = Path.home() / ".cache" / "orderly"
LOCK_FILE = HERE / "kafka-jars.lock"

log = logging.getLogger("orderly.stack")


def ensure_jars(cache_dir: Path = DEFAULT_CACHE, version: str = KAFKA_VERSION, *,
                base_url: str = MAVEN_CENTRAL, lock_file: Path = LOCK_FILE) -> Path:
    """Return the folder holding the broker's classpath, fetching it on first use.

    The jars are exactly those of ``kafka-jars.lock``, fetched over HTTPS from Maven Central (or
    ``base_url``, any folder laid out like it, ``file://`` included) and checked against its SHA-256
    sums; no Maven is needed. The cache is marked with the lock's digest, so a changed lock refetches
    (reusing the jars that did not change) and a cache from an older Orderly is checked once.
    """
    target = cache_dir / f"kafka-{version}"
    libs = target / "libs"
    done = target / ".complete"
    jars = read_lock(lock_file)
    if f"org.apache.kafka:kafka_2.13:{version}" not in {j.coordinates for j in jars}:
        raise ValueError(f"{lock_file} does not pin Kafka {version}: regenerate it with "
                         "`python -m app.stack.kafka lock` (needs Maven)")
    marker = f"lock {lock_digest(jars)}\n"
    if _read(done) == marker:
        return libs
    target.mkdir(parents=True, exist_ok=True)
    with (target / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test sessions on one machine fetch once
        if _read(done) == marker:
            return libs
        done.unlink(missing_ok=True)
        started = time.monotonic()
        counts = fetch_locked(jars, libs, base_url=base_url, reuse=libs)
        log.info("kafka %s: %d jars downloaded from %s, %d reused, all SHA-256 checked (%.1fs)",
                 version, counts["downloaded"], base_url, counts["reused"], time.monotonic() - started)
        done.write_text(marker)
    return libs


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def lock_from_maven(version: str = KAFKA_VERSION, lock_file: Path = LOCK_FILE) -> list[LockedJar]:
    """Resolve ``kafka-pom.xml`` with Maven and write the lock file (maintainers, when upgrading).

    The one place Maven is still used: ``dependency:list`` names each jar's coordinates and
    ``dependency:copy-dependencies`` gives the files whose sums are locked.
    """
    if shutil.which("mvn") is None:
        raise RuntimeError("regenerating the lock file resolves kafka-pom.xml with Maven: install mvn first")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        pom = work / "pom.xml"
        pom.write_text((HERE / "kafka-pom.xml").read_text().replace("@KAFKA_VERSION@", version))
        listing = work / "list.txt"
        result = subprocess.run(
            ["mvn", "-q", "-B", "-f", str(pom), "dependency:list", "dependency:copy-dependencies",
             "-DincludeScope=runtime", f"-DoutputFile={listing}", f"-DoutputDirectory={work / 'libs'}"],
            capture_output=True, text=True, check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"resolving Kafka {version} with Maven failed:\n{result.stdout}\n{result.stderr}")
        jars = []
        for line in listing.read_text().splitlines():
            parts = line.strip().split(":")
            if len(parts) != 5 or parts[2] != "jar":  # group:artifact:jar:version:scope
                continue
            group, artifact, _, jar_version, _ = parts
            path = work / "libs" / f"{artifact}-{jar_version}.jar"
            jars.append(LockedJar(group, artifact, jar_version, sha256_of(path)))
        copied = sorted(p.name for p in (work / "libs").iterdir())
        if copied != sorted(j.filename for j in jars):
            raise RuntimeError(f"Maven copied {copied}, but listed {sorted(j.filename for j in jars)}")
    header = (f"The Apache Kafka {version} broker's runtime classpath (app/stack/kafka-pom.xml resolved by Maven),\n"
              "one jar a line: group:artifact:version sha256. Fetched from Maven Central and checked by\n"
              "app/stack/kafka_jars.py. Regenerate with `python -m app.stack.kafka lock` (needs Maven).")
    lock_file.write_text(format_lock(jars, header))
    return jars


def main(argv: list[str]) -> int:
    """`python -m app.stack.kafka fetch` fetches the jars and finds the Java (used by the Makefile);
    `python -m app.stack.kafka lock` rewrites kafka-jars.lock from kafka-pom.xml with Maven."""
    parser = argparse.ArgumentParser(prog="python -m app.stack.kafka")
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser("fetch", help="fetch and check the locked jars; report the Java the broker uses")
    fetch.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE,
                       help=f"where the jars are cached (default {DEFAULT_CACHE})")
    fetch.add_argument("--base-url", default=MAVEN_CENTRAL,
                       help="a Maven repository (https:// or file://) to fetch from (default Maven Central)")
    commands.add_parser("lock", help="resolve kafka-pom.xml with Maven and rewrite kafka-jars.lock")
    args = parser.parse_args(argv)
    if args.command == "lock":
        jars = lock_from_maven()
        print(f"{LOCK_FILE}: {len(jars)} jars")
        return 0
    started = time.monotonic()
    libs = ensure_jars(args.cache_dir, base_url=args.base_url)
    print(f"kafka {KAFKA_VERSION} jars in {libs} ({time.monotonic() - started:.1f}s)")
    print(f"kafka runs on {find_java().describe()}")
    return 0
