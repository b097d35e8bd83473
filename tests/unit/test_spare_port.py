"""``spare_port``: a port below the ephemeral range, with as many free after it as a cluster needs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.stack import process
from app.stack.process import spare_port


@pytest.fixture(autouse=True)
def nothing_handed_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a fresh process would: no port given yet."""
    monkeypatch.setattr(process, "_HANDED", set())


def test_a_span_of_ports_is_free_after_the_one_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """The brokers of `orderly dev --brokers 3` listen on a port and the next two: with every third
    port taken, the port given is one whose next two are free (the first alone once was checked)."""
    monkeypatch.setattr(process, "ephemeral_ports", lambda: (20100, 65535))
    taken = {p for p in range(20000, 20100) if p % 4 == 3}
    monkeypatch.setattr(process, "port_is_free", lambda port, host="127.0.0.1": port not in taken)
    for _ in range(50):
        monkeypatch.setattr(process, "_HANDED", set())  # every pick as a fresh process's
        port = spare_port(span=3)
        assert {port, port + 1, port + 2}.isdisjoint(taken) and port + 2 < 20100, port


def test_no_port_is_given_twice_by_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two picks before either server binds find the same ports free: the second must not get them.
    Three ports lie below the ephemeral range here; a fourth pick comes from inside it, a fifth
    finds nothing, and a span never overlaps a port given."""
    monkeypatch.setattr(process, "ephemeral_ports", lambda: (20003, 65535))
    monkeypatch.setattr(process, "port_is_free", lambda port, host="127.0.0.1": True)
    monkeypatch.setattr(process, "free_port", lambda host="127.0.0.1": 40000)
    assert sorted(spare_port() for _ in range(3)) == [20000, 20001, 20002]
    assert spare_port() == 40000
    with pytest.raises(RuntimeError, match="no 1 consecutive free ports"):
        spare_port()  # 40000 was given: nothing else is free
    monkeypatch.setattr(process, "_HANDED", {20001})
    monkeypatch.setattr(process, "free_port", lambda host="127.0.0.1": 40002)
    assert spare_port(span=2) == 40002  # 20000-20001 and 20001-20002 both hold the port given


def test_no_span_free_below_the_ephemeral_range_is_sought_above_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "ephemeral_ports", lambda: (20100, 65535))
    monkeypatch.setattr(process, "port_is_free", lambda port, host="127.0.0.1": port >= 20100)
    monkeypatch.setattr(process, "free_port", lambda host="127.0.0.1": 40000)
    assert spare_port(span=3) == 40000


def test_no_span_free_anywhere_is_an_error_that_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "ephemeral_ports", lambda: (20100, 65535))
    monkeypatch.setattr(process, "port_is_free", lambda port, host="127.0.0.1": port % 2 == 0)
    monkeypatch.setattr(process, "free_port", lambda host="127.0.0.1": 40000)
    with pytest.raises(RuntimeError, match="no 3 consecutive free ports"):
        spare_port(span=3)


def test_a_real_span_is_free_now() -> None:
    port = spare_port(span=3)
    assert all(process.port_is_free(port + i) for i in range(3))


def test_ports_above_the_ephemeral_range_count_too_and_a_span_never_passes_65535(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "ephemeral_ports", lambda: (1024, 65000))  # nothing free below it
    monkeypatch.setattr(process, "port_is_free", lambda port, host="127.0.0.1": True)
    for _ in range(50):
        port = spare_port(span=3)
        assert 65001 <= port and port + 2 <= 65535, port


def test_tests_and_benchmarks_give_their_servers_spare_ports() -> None:
    """A port from ``free_port`` lies in the ephemeral range: between the pick and the server's bind
    (a process started seconds later) any outgoing connection may take it. CI once failed so: a
    fetcher's metrics port taken, ``address already in use``, and four tests with it. Only a port
    this process binds at once may be one (its line says ``bound at once``)."""
    root = Path(__file__).resolve().parents[2]
    sources = [p for folder in ("tests", "bench") for p in (root / folder).rglob("*.py")
               if p.name != Path(__file__).name]
    calling = sorted(f"{p.relative_to(root).as_posix()}: {line.strip()}" for p in sources
                     for line in p.read_text(encoding="utf-8").splitlines()
                     if re.search(r"\bfree_port\(", line) and "bound at once" not in line)
    assert len(sources) > 100 and not calling, calling
