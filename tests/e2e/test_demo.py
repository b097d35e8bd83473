"""`orderly demo` end to end: the simulator drives all three gateways through outages, retries,
duplicates and reordering, and every read model must match the gateways' truth (exit 0)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.stack.process import free_port


def test_demo_matches_the_gateways_truth(tmp_path: Path) -> None:
    env = {**os.environ, "ORDERLY_DATA_DIR": str(tmp_path / ".orderly"),
           "ORDERLY_KAFKA": f"127.0.0.1:{free_port()}",
           "ORDERLY_POSTGRES_DSN": f"postgresql://postgres@127.0.0.1:{free_port()}/postgres",
           "ORDERLY_INGEST_PORT": str(free_port()), "ORDERLY_PARTITIONS": "3"}
    result = subprocess.run([sys.executable, "-m", "app.cli", "demo", "--scale", "0.25"], env=env,
                            capture_output=True, text=True, timeout=400, check=False)
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-4000:]
    assert "all read models match the gateways' truth" in out
    for line in ("pg deposits", "pg withdrawals", "user balances", "card payments", "paymos resources"):
        assert any(row.startswith(line) and row.rstrip().endswith("OK") for row in out.splitlines()), line
    # the run really was chaotic: retries and stale deliveries happened
    pg_row = next(row for row in out.splitlines() if row.startswith("pg "))
    attempts, accepted, retries = (int(x) for x in pg_row.split()[1:4])
    assert retries > 0 and attempts > accepted
