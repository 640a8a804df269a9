"""Static-cache decode, the loop a CUDA graph replays on GPUs: it decodes the same tokens as the eager engine (for
every zoo architecture, sliding windows and experts included), runs again from a reset cache, and on a CPU the graph
itself is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_zoo import ZOO, write_model_dir

from kernelbot import KernelbotError
from kernelbot.engine.models import resolve_spec
from kernelbot.engine.torch_engine import TorchEngine

WORKLOAD = dict(dtype="float32", batch=2, prompt_len=10, decode_steps=5)  # 15 positions: past the zoo's window of 8


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("zoo")
    return {name: write_model_dir(root, name) for name in ZOO}


@pytest.mark.parametrize("name", list(ZOO))
def test_static_decode_gives_the_eager_engines_tokens(zoo, name):
    engine = TorchEngine(resolve_spec(str(zoo[name]), **WORKLOAD)[0])
    eager = engine.run_workload()
    static = engine.static_decode(graphs=False)
    first, again = static.run_workload(), static.run_workload()  # the second run starts from a reset cache
    assert first.shape == (2, 1 + WORKLOAD["decode_steps"])
    assert torch.equal(first, eager), ZOO[name].exercises
    assert torch.equal(again, eager)


def test_a_graph_on_a_cpu_is_refused_in_one_line():
    engine = TorchEngine(resolve_spec("llama-tiny", dtype="float32", batch=2, prompt_len=4, decode_steps=2)[0])
    with pytest.raises(KernelbotError, match="needs a GPU") as caught:
        engine.static_decode(graphs=True).run_workload()
    assert "\n" not in str(caught.value)


def test_graph_decode_is_timed_in_the_same_rounds_and_reported_beside_the_others(tmp_path):
    from finished_run import fake_run

    from kernelbot.agent.measure.end_to_end import time_end_to_end
    from kernelbot.agent.report.markdown import render_markdown
    from kernelbot.records import Pack

    engine = TorchEngine(resolve_spec("llama-micro", dtype="float32", batch=1, prompt_len=3, decode_steps=2)[0])
    static = engine.static_decode(graphs=False)  # what a GPU replays, run plainly: the rounds treat it alike
    times = time_end_to_end(engine, Pack(version="empty", run_id="r", device="cpu", entries=[]), tmp_path, 3, None,
                            static)
    assert len(times.graph_decode) == len(times.eager) == 3 and all(t > 0 for t in times.graph_decode)
    report = fake_run(tmp_path / "run").model_copy(update={"graph_decode_ms": 42.5})
    assert "| CUDA-graph decode (static cache) | 42.5 |" in render_markdown(report)
    assert "CUDA-graph" not in render_markdown(report.model_copy(update={"graph_decode_ms": None}))


def test_a_sliding_window_model_gets_no_graph_and_a_one_line_reason(zoo):
    engine = TorchEngine(resolve_spec(str(zoo["mistral"]), **WORKLOAD)[0])
    with pytest.raises(KernelbotError, match="sliding-window") as caught:
        engine.static_decode(graphs=True)
    assert "\n" not in str(caught.value)


def test_a_captured_step_is_kept_only_when_its_replays_decode_the_plain_loops_tokens(zoo, monkeypatch):
    """The capture stood in for on the CPU: a faithful one (the step itself) is kept; one whose replays go stale (the
    first step's token forever, as a step with state in Python would replay) is refused."""
    from kernelbot.hardware.device import DeviceChoice

    engine = TorchEngine(resolve_spec(str(zoo["llama"]), **WORKLOAD)[0])
    monkeypatch.setattr(DeviceChoice, "capture", lambda self, step: step)
    assert torch.equal(engine.static_decode(graphs=True).run_workload(), engine.run_workload())

    def stale(self, step):
        step()
        first = step.__self__.next_token.clone()
        return lambda: step.__self__.next_token.copy_(first)

    monkeypatch.setattr(DeviceChoice, "capture", stale)
    with pytest.raises(KernelbotError, match="decoded other tokens"):
        engine.static_decode(graphs=True)
