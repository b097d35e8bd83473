"""app/seams/mode.py against the pinned mode-streaming: the flow control and worker members it
overrides are the source it was written against, and the state it reads is still there."""

from __future__ import annotations

import inspect

import faust
import mode
from mode import worker as mode_worker
from mode.utils import queues

from app.seams import mode as seam
from tests.unit.seams_upstream import assigns, changed, fingerprint, parameters

SOURCES = {
    "FlowControlEvent.resume": (queues.FlowControlEvent.resume, "4dcdc1253fd0dcb4"),
    "Worker._sentinel_task": (mode_worker.Worker._sentinel_task, "6e66058cf3e1b616"),
    "faust.Worker.on_setup_root_logger": (faust.Worker.on_setup_root_logger, "0d468284fb5c8880"),
}


def test_each_method_the_seam_overrides_is_the_source_it_was_written_against() -> None:
    expected = {name: digest for name, (_, digest) in SOURCES.items()}
    found = {name: fingerprint(obj) for name, (obj, _) in SOURCES.items()}
    assert found == expected, changed(expected, found, "mode-streaming")


def test_the_members_relied_on_are_there() -> None:
    assert assigns(queues.FlowControlEvent, "__init__", "_suspend")
    assert assigns(queues.FlowControlEvent, "__init__", "_resume")
    assert parameters(queues.FlowControlEvent.is_active) == ["self"]
    assert parameters(queues.FlowControlEvent.clear) == ["self"]
    assert parameters(mode_worker.Worker._sentinel_task) == ["self"]
    assert parameters(mode_worker.Worker.on_setup_root_logger) == ["self", "logger", "level"]
    # where mode calls the two: Worker._setup_logging and Worker._shutdown_loop
    assert "self.on_setup_root_logger(" in inspect.getsource(mode_worker.Worker._setup_logging)
    assert "self._sentinel_task()" in inspect.getsource(mode_worker.Worker._shutdown_loop)
    assert assigns(faust.Worker, "__init__", "spinner")
    assert assigns(mode.Service, "__init__", "_stopped")  # Faust's fetch loop, replayed, reads it


def test_the_seams_flow_control_resumes_like_modes_but_clears_only_after_a_suspension() -> None:
    flow = seam.FlowControl()  # starts suspended, as Faust's
    cleared: list[bool] = []
    flow.clear = lambda: cleared.append(True)  # type: ignore[method-assign]
    flow.resume()
    assert flow.is_active() and cleared == [True]
    flow.resume()
    assert cleared == [True]  # not suspended since: nothing cleared
