"""app/metrics.py: each process's registry names the process and carries its CPU, memory and start
time; a periodic reading that fails or hangs is logged and bounded, never stops its loop."""

from __future__ import annotations

import asyncio
import logging
import os
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app import metrics

PROCESSES = {metrics.IngestMetrics: "ingest", metrics.WorkerMetrics: "worker", metrics.ProjectorMetrics: "projector",
             metrics.EffectsMetrics: "effects", metrics.FetcherMetrics: "fetcher", metrics.AdminMetrics: "admin"}


@pytest.mark.parametrize("kind", list(PROCESSES), ids=list(PROCESSES.values()))
def test_every_process_names_itself_and_exports_its_own_resources(kind: type[metrics._Metrics]) -> None:
    body, _ = kind().render()
    samples = {s.name: s for family in text_string_to_metric_families(body.decode()) for s in family.samples}
    assert samples["orderly_process_info"].labels["process"] == PROCESSES[kind]
    assert samples["orderly_process_info"].value == 1.0
    # this test's own process: what a restart changes, and what CPU and memory alerts read
    with open(f"/proc/{os.getpid()}/stat") as f:
        start_ticks = float(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        boot = next(float(line.split()[1]) for line in f if line.startswith("btime"))
    assert samples["process_start_time_seconds"].value == pytest.approx(boot + start_ticks / os.sysconf("SC_CLK_TCK"))
    assert samples["process_start_time_seconds"].value < time.time()
    assert samples["process_resident_memory_bytes"].value > 1_000_000
    assert samples["process_cpu_seconds_total"].value > 0
    assert "python_info" in samples and "python_gc_collections_total" in samples


def test_the_consuming_processes_and_the_admin_export_lag_under_one_name() -> None:
    for kind in (metrics.WorkerMetrics, metrics.ProjectorMetrics, metrics.EffectsMetrics, metrics.FetcherMetrics,
                 metrics.AdminMetrics):
        m = kind()
        m.consumer_lag.labels("g", "t").set(7)
        assert m.registry.get_sample_value("orderly_consumer_lag", {"group": "g", "topic": "t"}) == 7.0, kind


async def test_a_reading_that_fails_or_hangs_is_logged_and_the_next_one_runs(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[float] = []

    async def read() -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise ConnectionError("broker away")
        if len(calls) == 2:
            await asyncio.sleep(3600)  # a request that never answers

    caplog.set_level(logging.INFO, logger="orderly.metrics")
    task = asyncio.create_task(metrics.every(0.05, read, "the test's gauge"))
    try:
        async with asyncio.timeout(5):
            while len(calls) < 4:
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
    assert calls[2] - calls[1] < 1.0  # the hanging reading was given up after its interval
    messages = [r.getMessage() for r in caplog.records if r.name == "orderly.metrics"]
    assert messages[:2] == ["the test's gauge not read: ConnectionError('broker away')",
                            "the test's gauge not read: TimeoutError()"]
