"""`orderly demo --keep` end to end: the simulator drives all five gateways through outages,
retries, duplicates and reordering, twice: first with the gateways' GET APIs answering 404, so every
read model must be what the documents say the reducers alone reach, then answering the truth, when
the fetcher may sync parked card payments. Then the stack and the console stay up on the demo's data
until Ctrl-C (exit 0 only if both passes matched). While it is up, `orderly export` of its decisions
run through the DuckDB worked example (docs/analytics/delivery_order.sql) must count per gateway what
the demo's own table counted for that pass, and what the test counts from the exported rows."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import duckdb
import pyarrow.parquet as pq

from app.stack.process import port_is_free, spare_port

SQL = Path(__file__).resolve().parents[2] / "docs" / "analytics" / "delivery_order.sql"
GATEWAYS = ("pg", "card", "paymos", "stripe", "adyen")


def read_until(proc: subprocess.Popen[str], marker: str, timeout_s: float) -> str:
    """The process's output up to and including the first line holding ``marker``."""
    lines: list[str] = []
    found = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if marker in line:
                found.set()
                return
        found.set()

    threading.Thread(target=pump, daemon=True).start()
    found.wait(timeout_s)
    out = "".join(lines)
    assert marker in out, f"no {marker!r} within {timeout_s} s:\n{out[-4000:]}"
    return out


def passes(out: str) -> list[str]:
    """Each pass's report, from its title to its verdict: the 404 pass, then the truth pass."""
    found = list(re.finditer(r"^Orderly demo, fetch API (\S+) .*?^(?:all read models match|MISMATCH).*?$", out,
                             re.MULTILINE | re.DOTALL))
    assert [m.group(1) for m in found] == ["404", "truth"], out[-4000:]
    return [m.group(0) for m in found]


def fetches(table: str) -> dict[str, int]:
    line = re.search(r"^fetches: card GET /payments/\{ref\} (\d+) \(answered 200 for (\d+) payments\), "
                     r"pg GET /v1/pay/events (\d+); card payments synced: (\d+)$", table, re.MULTILINE)
    assert line is not None, table
    return dict(zip(("requests", "answered", "backfills", "synced"), map(int, line.groups()), strict=True))


def column(table: str, gateway: str, name: str) -> int:
    """One gateway's count in a pass's table (its header: gateway deliveries ... stale dup parked→ synced)."""
    header = next(row for row in table.splitlines() if row.startswith("gateway ")).replace("dup sent", "dup_sent")
    row = next(row for row in table.splitlines() if row.startswith(f"{gateway} "))
    return int(row.split()[header.split().index(name)])


def card_column(table: str, name: str) -> int:
    return column(table, "card", name)


def from_rows(path: Path) -> dict[str, Counter[str]]:
    """Per gateway, counted here from the exported decisions (not by the SQL): each delivery once,
    its outcome the one of its highest ``seq``; the merchant's correlations apart (``correlation``
    plus their outcome: the demo's table counts them, the SQL leaves them out)."""
    columns = ["gateway", "resource_id", "delivery_id", "seq", "outcome", "event_type"]
    decided: dict[tuple[str, str], dict[int, str]] = {}
    correlations: set[tuple[str, str]] = set()
    for r in pq.read_table(path, columns=columns).to_pylist():
        decided.setdefault((r["gateway"], r["delivery_id"]), {})[r["seq"]] = r["outcome"]
        if r["event_type"] == "correlation.registered":
            correlations.add((r["gateway"], r["delivery_id"]))
    counts = {g: Counter[str]() for g in GATEWAYS}
    for (gateway, delivery), outcomes in decided.items():
        last = outcomes[max(outcomes)]
        if (gateway, delivery) in correlations:
            counts[gateway][f"correlation {last}"] += 1
            continue
        parked = "parked" in outcomes.values()
        counts[gateway].update(deliveries=1, parked=parked, still_parked=parked and last == "parked",
                               parked_kept=parked and last in ("parked", "unparked"))
    return counts


def check_the_duckdb_example(data_dir: Path, helped: str, target: Path) -> None:
    """`orderly export --topic decisions` of the kept namespace (found through stack.json), run
    through docs/analytics/delivery_order.sql: its counts per gateway against the demo's table for
    the kept pass (stale, dup and synced count each delivery's current outcome, as the SQL's stale,
    duplicate and fetched do) and against the exported rows (deliveries, parked: the table's
    ``parked→`` holds only the parked ones released as applied or still parked, the SQL's every one)."""
    bare = {k: v for k, v in os.environ.items() if not k.startswith("ORDERLY_")}
    done = subprocess.run([sys.executable, "-m", "app.cli", "export", "--topic", "decisions", "--to", str(target)],
                          env={**bare, "ORDERLY_DATA_DIR": str(data_dir)}, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0 and "_truth.decisions: " in done.stdout, done.stdout + done.stderr[-2000:]
    db = duckdb.connect()
    db.execute(f"CREATE VIEW decisions AS SELECT * FROM read_parquet('{target}')")
    result = db.execute(SQL.read_text())
    header = [d[0] for d in result.description]
    sql = {g: Counter[str]() for g in GATEWAYS}
    for row in result.fetchall():  # a row per gateway and day: summed over the days
        found = dict(zip(header, row, strict=True))
        sql[found["gateway"]].update({k: found[k] for k in ("deliveries", "parked", "still_parked", "fetched",
                                                            "stale", "duplicate")})
    rows = from_rows(target)
    for g in GATEWAYS:
        # the table counts the merchant's correlations too (pg's, as deliveries of the gateway)
        table = {"stale": column(helped, g, "stale") - rows[g]["correlation stale"],
                 "duplicate": column(helped, g, "dup") - rows[g]["correlation duplicate"],
                 "fetched": column(helped, g, "synced") - rows[g]["correlation synced"],
                 "deliveries": rows[g]["deliveries"], "parked": rows[g]["parked"],
                 "still_parked": rows[g]["still_parked"]}
        assert {k: sql[g][k] for k in table} == table, (g, sql[g], rows[g], helped)
        assert column(helped, g, "parked→") == rows[g]["parked_kept"] + rows[g]["correlation parked"], g
    # not vacuous: the demo's chaos shows in the SQL's counts
    assert all(sql[g]["deliveries"] > 0 for g in GATEWAYS), sql
    assert sum(sql[g]["stale"] for g in GATEWAYS) > 0 and sum(sql[g]["duplicate"] for g in GATEWAYS) > 0, sql
    assert sql["card"]["parked"] > 0 and sql["card"]["fetched"] > 0, sql


def get(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_demo_matches_the_gateways_truth_and_keeps_the_console_up(tmp_path: Path) -> None:
    data_dir = tmp_path / ".orderly"
    ports = {name: spare_port() for name in ("kafka", "postgres", "ingest", "admin")}
    env = {**os.environ, "ORDERLY_DATA_DIR": str(data_dir), "ORDERLY_KAFKA": f"127.0.0.1:{ports['kafka']}",
           "ORDERLY_POSTGRES_DSN": f"postgresql://postgres@127.0.0.1:{ports['postgres']}/postgres",
           "ORDERLY_INGEST_PORT": str(ports["ingest"]), "ORDERLY_ADMIN_PORT": str(ports["admin"]),
           "ORDERLY_PARTITIONS": "3"}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "demo", "--scale", "0.25", "--keep"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    try:
        out = read_until(proc, "commands:", 400)
        no_help, helped = passes(out)
        for fetch_api, table in (("404", no_help), ("truth", helped)):
            assert f"all read models match what the documents expect with the fetch API {fetch_api}" in table, table
            for line in ("pg deposits", "pg withdrawals", "user balances", "card payments", "paymos resources",
                         "stripe payment intents", "adyen payments"):
                row = next(row for row in table.splitlines() if row.startswith(line))
                resources, match, at_truth = (int(x) for x in row[len(line):].split()[:3])
                # every event was delivered in the end, so the documents' expectation is the truth
                assert resources == match == at_truth > 0 and row.endswith("OK"), (fetch_api, row)
            # the run really was chaotic: retries and stale deliveries happened, for every gateway
            for gw in GATEWAYS:
                gw_row = next(row for row in table.splitlines() if row.startswith(f"{gw} "))
                attempts, accepted, retries = (int(x) for x in gw_row.split()[1:4])
                assert retries > 0 and attempts > accepted, (fetch_api, gw_row)
        # with the API answering 404 nothing was synced: the card payments are the reducer's alone
        fetched = fetches(no_help)
        assert (fetched["answered"], fetched["synced"]) == (0, 0), fetched
        assert card_column(no_help, "synced") == 0
        # answering the truth, every payment the API answered holds one synced event
        fetched = fetches(helped)
        assert 0 < fetched["synced"] == fetched["answered"] <= fetched["requests"], fetched
        assert card_column(helped, "synced") >= fetched["synced"]  # a decision per payment synced, at least

        # kept up: the console URL and the token are printed, and they work on the demo's data
        admin_url = f"http://127.0.0.1:{ports['admin']}"
        token = json.loads((data_dir / "stack.json").read_text())["credentials"]["ORDERLY_ADMIN_TOKEN"]
        assert f"console:     {admin_url}/  (admin token: {token})" in out and f"ORDERLY_ADMIN_TOKEN={token}" in out
        assert stat.S_IMODE((data_dir / "stack.json").stat().st_mode) == 0o600
        deadline = time.monotonic() + 60  # the demo's merchant takes every effect
        while True:
            status, body = get(f"{admin_url}/api/overview", token)
            assert status == 200
            overview = json.loads(body)
            if overview["effects_pending"] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert overview["deliveries"]["total"]["applied"] > 0
        assert (overview["effects_pending"], overview["effects_dead"]) == (0, 0) and overview["effects_delivered"] > 0
        assert get(f"{admin_url}/api/overview")[0] == 401
        status, page = get(f"{admin_url}/login")
        assert status == 200 and 'name="token"' in page
        # the operator commands find the demo's namespace through stack.json, with no Kafka or
        # PostgreSQL in their environment
        bare = {k: v for k, v in os.environ.items() if not k.startswith("ORDERLY_")}
        listed = subprocess.run([sys.executable, "-m", "app.cli", "effects", "list", "--state", "delivered"],
                                env={**bare, "ORDERLY_DATA_DIR": str(data_dir)}, capture_output=True, text=True,
                                timeout=60, check=False)
        assert listed.returncode == 0 and "deposit:" in listed.stdout, listed.stdout[-2000:] + listed.stderr[-2000:]
        check_the_duckdb_example(data_dir, helped, tmp_path / "decisions.parquet")
        assert proc.poll() is None  # still up
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
        code = proc.wait(90)
    assert code == 0
    deadline = time.monotonic() + 10
    while not all(port_is_free(p) for p in ports.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [name for name, p in ports.items() if not port_is_free(p)] == []
    assert not (data_dir / "stack.json").exists()
