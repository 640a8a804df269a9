"""Generic tasks for a served engine's layers no family covers (engine/generic_layers.py through the router of
engine/router.py), on stand-in layers shaped like vLLM's CustomOps: a capture extracts the layer's native
forward into a reference that runs without the engine, checked against the engine's own output; a pack's generic
kernel takes exactly the captured call of layers built alike; the planner makes tasks from the captures. The real
engine runs the same code in tests/test_vllm_served.py."""

from __future__ import annotations

import contextlib

import pytest
import torch
from helpers import generic_pack
from torch import nn

from kernelbot.agent.tasks.plan import ServedTasks
from kernelbot.engine import router as routing
from kernelbot.engine.generic_layers import layer_variant
from kernelbot.engine.router import generic_spec, router_from_env
from kernelbot.kernel_library.base import GENERIC
from kernelbot.loading import load_module
from kernelbot.records import GenericCapture, Hotspot, Pack

HIDDEN = 64

lib = torch.library.Library("kbtest_engine", "FRAGMENT")  # an op only "the engine" defines
lib.define("scale(Tensor x) -> Tensor")
lib.impl("scale", lambda x: x * 2, "CompositeExplicitAutograd")


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm as vLLM's CustomOp has it: a native forward (pure PyTorch), and the engine's own path (here
    the same numbers computed in another order, as an engine's fused kernel would)."""

    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(hidden) * 0.1)
        self.variance_epsilon = eps

    def forward_native(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is not None:
            x = x + residual
            residual = x
        f = x.float()
        out = (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
               * (1.0 + self.weight.float())).to(x.dtype)
        return out if residual is None else (out, residual)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        summed = x if residual is None else x + residual
        f = summed.float()
        scale = (f.square().sum(-1, keepdim=True) / f.shape[-1] + self.variance_epsilon) ** -0.5
        out = (f * scale * (self.weight.float() + 1.0)).to(x.dtype)
        return out if residual is None else (out, summed)


class EngineScale(nn.Module):
    """A layer whose native forward calls an op only the engine's process defines."""

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.kbtest_engine.scale(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def _router(monkeypatch, tmp_path, *, capture: bool, pack: Pack | None = None):
    for name in (routing.PACK_ENV, routing.CAPTURE_ENV, routing.COUNTS_ENV):
        monkeypatch.delenv(name, raising=False)
    if capture:
        monkeypatch.setenv(routing.CAPTURE_ENV, str(tmp_path / "counts"))
    if pack is not None:
        monkeypatch.setenv(routing.PACK_ENV, str(tmp_path / "pack"))
        monkeypatch.setenv(routing.COUNTS_ENV, str(tmp_path / "counts"))
    targets = {cls.__name__: [generic_spec(cls)] for cls in (GemmaRMSNorm, EngineScale)}
    router = router_from_env("vllm", targets, contextlib.nullcontext)
    assert router is not None
    return router, targets


def _call(router, targets, layer, *args):
    return router.handle(targets[type(layer).__name__], layer, layer.forward, args, {})


def _captured(monkeypatch, tmp_path) -> tuple[GemmaRMSNorm, list[GenericCapture]]:
    router, targets = _router(monkeypatch, tmp_path, capture=True)
    norm = GemmaRMSNorm(HIDDEN, 1e-6)
    with torch.no_grad():
        for _ in range(3):
            x, residual = torch.randn(4, HIDDEN, dtype=torch.bfloat16), torch.randn(4, HIDDEN, dtype=torch.bfloat16)
            want = norm(x, residual)
            got = _call(router, targets, norm, x, residual)
            assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))  # capture changes nothing
        _call(router, targets, norm, torch.randn(4, HIDDEN, dtype=torch.bfloat16))
    return norm, router.report().generic


def test_a_capture_extracts_the_layers_native_forward_into_a_reference_that_runs_without_the_engine(
        monkeypatch, tmp_path):
    norm, captures = _captured(monkeypatch, tmp_path)
    by_tensors = {len(c.signature.tensors): c for c in captures}
    assert sorted(by_tensors) == [1, 2] and by_tensors[2].calls == 3 and by_tensors[1].calls == 1
    capture = by_tensors[2]
    assert capture.reference and not capture.why and capture.variant == layer_variant(norm)
    path = tmp_path / "reference.py"
    path.write_text(capture.reference)
    reference = load_module(path, "kb_test_served_generic_ref")
    model = reference.Model(*reference.get_init_inputs())
    model.load_state_dict({"weight": norm.weight.detach()})
    x, residual = reference.get_inputs()
    with torch.no_grad():
        got, want = model(x, residual), norm.forward_native(x, residual)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_a_native_forward_that_calls_an_op_only_the_engine_defines_is_refused_with_the_reason(monkeypatch, tmp_path):
    router, targets = _router(monkeypatch, tmp_path, capture=True)
    _call(router, targets, EngineScale(), torch.randn(4, HIDDEN))
    (capture,) = router.report().generic
    assert not capture.reference and "kbtest_engine" in capture.why


def test_a_call_first_seen_while_the_profiler_runs_is_counted_not_extracted(monkeypatch, tmp_path):
    router, targets = _router(monkeypatch, tmp_path, capture=True)
    with torch.profiler.profile():
        _call(router, targets, GemmaRMSNorm(HIDDEN, 1e-6), torch.randn(4, HIDDEN))
    (capture,) = router.report().generic
    assert capture.calls == 1 and not capture.reference and "profiler" in capture.why


def test_layers_built_with_other_attributes_are_other_variants():
    a, b, c = GemmaRMSNorm(HIDDEN, 1e-6), GemmaRMSNorm(HIDDEN, 1e-6), GemmaRMSNorm(HIDDEN, 1e-5)
    assert layer_variant(a) == layer_variant(b) != layer_variant(c)
    assert layer_variant(GemmaRMSNorm(2 * HIDDEN, 1e-6)) != layer_variant(a)


def test_a_generic_kernel_takes_exactly_the_captured_call_of_layers_built_alike(monkeypatch, tmp_path):
    norm, captures = _captured(monkeypatch, tmp_path / "capture")
    capture = next(c for c in captures if len(c.signature.tensors) == 2)
    router, targets = _router(monkeypatch, tmp_path, capture=False,
                              pack=generic_pack(tmp_path / "pack", capture, "GemmaRMSNorm"))
    twin, other = GemmaRMSNorm(HIDDEN, 1e-6), GemmaRMSNorm(HIDDEN, 1e-5)
    twin.load_state_dict(norm.state_dict())
    bf16 = dict(dtype=torch.bfloat16)
    with torch.no_grad():
        for layer in (norm, twin):
            for _ in range(3):
                x, residual = torch.randn(4, HIDDEN, **bf16), torch.randn(4, HIDDEN, **bf16)
                got, want = _call(router, targets, layer, x, residual), layer(x, residual)
                torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
        _call(router, targets, norm, torch.randn(5, HIDDEN, **bf16), torch.randn(5, HIDDEN, **bf16))
        _call(router, targets, norm, torch.randn(4, HIDDEN, **bf16))
        _call(router, targets, other, torch.randn(4, HIDDEN, **bf16), torch.randn(4, HIDDEN, **bf16))
    report = router.report()
    assert report.custom["k"].calls == 6 and not report.unrouted
    assert report.fallback["GemmaRMSNorm"] == {"call signature not in the pack": 2,
                                               "layer attributes not in the pack": 1}


def _hotspot(cls: str, family: str | None = None) -> Hotspot:
    return Hotspot(id="h00", module_class=cls, module_paths=[], family=family, input_dims=[[HIDDEN]],
                   dtype="bfloat16", calls=40, total_us=900.0, share=0.3, flops=0.0, bytes=0.0, floor_us=1.0,
                   score_us=899.0)


def test_the_planner_makes_a_task_per_frequent_extracted_call_and_says_why_a_layer_has_none(monkeypatch, tmp_path):
    _, captures = _captured(monkeypatch, tmp_path)
    refused = GenericCapture(engine_class="EngineScale", variant="v", dtype="float32",
                             signature=captures[0].signature, calls=9, why="its native forward calls kbtest ops")
    norm = _hotspot("GemmaRMSNorm")
    frequent, rare = (next(c for c in captures if c.calls == n) for n in (3, 1))
    captures = [frequent.model_copy(update={"calls": 30}), rare]  # fewer than a tenth of the top's calls: no task
    assert [p.task.id for p in ServedTasks("vllm", [], captures).build(norm, [])] == ["h00-gemmarmsnorm-4x64"]
    captures[1] = rare.model_copy(update={"calls": 3})
    source = ServedTasks("vllm", [], [*captures, refused])
    assert source.refuse(norm) is None
    planned = source.build(norm, [])
    assert [p.task.id for p in planned] == ["h00-gemmarmsnorm-4x64", "h00-gemmarmsnorm-4x64-v2"]
    assert all(p.task.family == GENERIC and p.task.layer_variant and p.reference for p in planned)
    assert source.build(norm, [p.task for p in planned]).reason.startswith("its captured calls are planned")
    assert "kbtest ops" in source.refuse(_hotspot("EngineScale"))
    assert "no seam of vllm" in source.refuse(_hotspot("Sampler"))
    assert ServedTasks("vllm", [], captures, generic_refused="no LLM").refuse(norm) == "no LLM"


@pytest.mark.parametrize("cls", [GemmaRMSNorm, EngineScale])
def test_a_generic_spec_matches_calls_by_the_native_forwards_parameter_names(cls):
    spec = generic_spec(cls)
    assert spec is not None and spec.family == GENERIC and spec.params[0] == "x"
