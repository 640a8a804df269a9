"""The served engines' router (engine/router.py) on stand-in layers with vLLM's signatures: which calls a pack
kernel takes, what falls back and why, what a capture records, and how it judges a layer against the family's
reference. The same router runs inside vLLM's and SGLang's processes (tests/test_vllm_served.py runs it there)."""

from __future__ import annotations

import torch
from torch import nn

from kernelbot.engine import router as routing
from kernelbot.engine import vllm_plugin
from kernelbot.engine.router import read_reports, router_from_env
from kernelbot.kernel_library import FAMILIES
from kernelbot.records import Pack, PackEntry

HIDDEN, EPS = 64, 1e-6


class RMSNorm(nn.Module):
    """vLLM's RMSNorm numerics (plain, and with its fused residual add), under vLLM's class name."""

    def __init__(self, hidden: int, eps: float, gemma: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(hidden) + 0.5)
        self.variance_epsilon, self.gemma = eps, gemma

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        summed = x.float() if residual is None else x.float() + residual.float()
        normed = summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        weight = 1 + self.weight if self.gemma else self.weight
        out = (normed.to(x.dtype) * weight).to(x.dtype)
        return out if residual is None else (out, summed.to(x.dtype))


def _entry(cid: str, family: str, shapes: list[list[int]]) -> PackEntry:
    return PackEntry(task_id=cid, candidate_id=cid, family=family, module_class="RMSNorm", input_shapes=shapes,
                     init_args=[HIDDEN, EPS, "float32"], dtype="float32", backend="cpp", config={"grain": 8},
                     source_file=f"kernels/{cid}.py", source_hash="test", verification="pass: test", speedup=1.5)


def _pack(pack_dir) -> None:
    (pack_dir / "kernels").mkdir(parents=True)
    entries = [_entry("norm", "rmsnorm", [[8, HIDDEN]]), _entry("add_norm", "add_rmsnorm", [[8, HIDDEN]] * 2),
               _entry("silu", "silu_and_mul", [[8, 32]]).model_copy(update={"module_class": "SiluAndMul",
                                                                             "init_args": []})]
    for e in entries:
        (pack_dir / e.source_file).write_text(FAMILIES[e.family].candidate_source("cpp", e.config))
    (pack_dir / "manifest.json").write_text(Pack(version="t", run_id="r", device="cpu", entries=entries)
                                            .model_dump_json())


def _router(monkeypatch, tmp_path, *, pack: bool, capture: bool) -> routing.Router:
    for name in (routing.PACK_ENV, routing.CAPTURE_ENV, routing.COUNTS_ENV):
        monkeypatch.delenv(name, raising=False)
    if pack:
        _pack(tmp_path / "pack")
        monkeypatch.setenv(routing.PACK_ENV, str(tmp_path / "pack"))
        monkeypatch.setenv(routing.COUNTS_ENV, str(tmp_path / "counts"))
    if capture:
        monkeypatch.setenv(routing.CAPTURE_ENV, str(tmp_path / "counts"))
    router = router_from_env("vllm", {"RMSNorm": vllm_plugin.LAYERS["RMSNorm"]})
    assert router is not None
    return router


def _call(router, layer, *args):
    return router.handle(vllm_plugin.LAYERS["RMSNorm"], layer, layer.forward, args, {})


def test_calls_the_pack_verified_go_to_its_kernels_and_the_rest_fall_back_with_the_reason(monkeypatch, tmp_path):
    router = _router(monkeypatch, tmp_path, pack=True, capture=False)
    norm = RMSNorm(HIDDEN, EPS)
    with torch.no_grad():
        for rows in (8, 3, 1):  # a batch has at most the rows the kernel was verified at
            x = torch.randn(rows, HIDDEN)
            torch.testing.assert_close(_call(router, norm, x), norm(x))
        x, residual = torch.randn(5, HIDDEN), torch.randn(5, HIDDEN) * 30
        (out, new_residual), (want, want_residual) = _call(router, norm, x, residual), norm(x, residual)
        torch.testing.assert_close(out, want)
        assert torch.equal(new_residual, want_residual)
        _call(router, norm, torch.randn(9, HIDDEN))
        _call(router, norm, torch.randn(4, HIDDEN).bfloat16())
        _call(router, RMSNorm(HIDDEN, 1e-5), torch.randn(4, HIDDEN))
        gemma = RMSNorm(HIDDEN, EPS, gemma=True)  # same class and arguments, other numerics
        for _ in range(2):
            x = torch.randn(4, HIDDEN)
            torch.testing.assert_close(_call(router, gemma, x), gemma(x))
    router.write(force=True)
    (report,) = read_reports(tmp_path / "counts")
    assert {k: v.calls for k, v in report.custom.items()} == {"norm": 3, "add_norm": 1}
    differs = [r for r in report.fallback["RMSNorm"] if r.startswith("the kernel's output differs")]
    assert len(differs) == 2 and sum(report.fallback["RMSNorm"][r] for r in differs) == 2
    assert {r: n for r, n in report.fallback["RMSNorm"].items() if r not in differs} == {
        "more rows than the pack's kernels were verified on": 1, "layer arguments, widths or dtype not in the pack": 2}
    assert report.unrouted == [{"candidate_id": "silu", "family": "silu_and_mul",
                                "reason": "no vllm layer takes a silu_and_mul kernel for SiluAndMul"}]


def test_a_capture_records_each_variant_with_its_rows_and_whether_the_reference_agrees(monkeypatch, tmp_path):
    router = _router(monkeypatch, tmp_path, pack=False, capture=True)
    llama, gemma = RMSNorm(HIDDEN, EPS), RMSNorm(HIDDEN, EPS, gemma=True)
    with torch.no_grad():
        for rows in (8, 8, 8, 40):
            _call(router, llama, torch.randn(rows, HIDDEN), torch.randn(rows, HIDDEN))
        _call(router, gemma, torch.randn(8, HIDDEN))
        _call(router, llama, torch.randn(8, HIDDEN))
    router.write(force=True)
    (report,) = read_reports(tmp_path / "counts")
    by = {c.family: c for c in report.captures}
    fused = by["add_rmsnorm"]
    assert fused.rows == {"8": 3, "40": 1} and fused.input_shapes == [[40, HIDDEN], [40, HIDDEN]]
    assert fused.init_args == [HIDDEN, EPS, "float32"] and fused.calls == 4 and fused.agrees
    # judged on its first call, the Gemma-style layer's: (1 + weight) is not the family's numerics
    assert by["rmsnorm"].calls == 2 and by["rmsnorm"].agrees is False
    assert "differs from the layer's own output" in by["rmsnorm"].why


def test_a_capture_keeps_the_calls_a_pack_kernel_ran_apart_from_the_engines_own(monkeypatch, tmp_path):
    router = _router(monkeypatch, tmp_path, pack=True, capture=True)
    norm = RMSNorm(HIDDEN, EPS)
    with torch.no_grad():
        for rows in (8, 8, 8, 40):  # the kernel takes up to 8 rows; 40 runs the engine's own path
            _call(router, norm, torch.randn(rows, HIDDEN))
    router.write(force=True)
    (report,) = read_reports(tmp_path / "counts")
    by = {c.kernel: c for c in report.captures if c.family == "rmsnorm"}
    assert by[""].rows == {"40": 1}
    assert by["norm"].rows == {"8": 2}  # the layer's first call of the kernel runs the probe (the engine's own path)


def test_the_rows_a_kernel_takes_follow_the_familys_free_dims():
    assert routing.fixed_dims("rotary_embedding", [[7], [7, 512], [7, 128]]) == [[], [512], [128]]
    assert routing.fixed_dims("rmsnorm", [[2, 3, 512]]) == routing.fixed_dims("rmsnorm", [[6, 512]])
    assert routing.fixed_dims("paged_attention", [[3, 8, 64], [90, 8, 128, 128], [3, 2], [3], [4]]) == [
        [8, 64], [8, 128, 128], [], [], []]


def test_a_kernel_slower_than_the_engines_own_path_in_the_engine_stops_taking_calls(monkeypatch, tmp_path):
    router = _router(monkeypatch, tmp_path, pack=True, capture=False)
    # the kernel takes 5 µs a call, the engine's own path 1 µs, on the calls timed side by side: PROBE_CALLS of each
    # path (one path timed a call), PROBE_EVERY apart once PROBE_AFTER calls have warmed both paths (an engine's first
    # calls of a shape are slow)
    monkeypatch.setattr(routing, "_timed", lambda path, run: (run(), 5e-6 if path == "kernel" else 1e-6))
    norm = RMSNorm(HIDDEN, EPS)
    taken = routing.PROBE_AFTER + routing.PROBE_EVERY * (2 * routing.PROBE_CALLS - 1) + 1
    with torch.no_grad():
        for i in range(taken + 3):
            x = torch.randn(4, HIDDEN)
            torch.testing.assert_close(_call(router, norm, x), norm(x))
            if i + 1 == routing.PROBE_AFTER:
                assert router.custom["norm"].timed == 0  # nothing timed while the engine's path warms
    router.write(force=True)
    (report,) = read_reports(tmp_path / "counts")
    norm_calls = report.custom["norm"]
    assert norm_calls.timed == routing.PROBE_CALLS and norm_calls.calls == taken
    assert norm_calls.kernel_us == 5.0 and norm_calls.engine_us == 1.0
    assert norm_calls.disabled.startswith("slower in the engine than its own path (5.0 vs 1.0 µs")
    assert report.fallback["RMSNorm"] == {norm_calls.disabled: 3}


def test_a_call_that_falls_back_settles_so_its_signature_skips_routing_and_is_still_counted(monkeypatch, tmp_path):
    router = _router(monkeypatch, tmp_path, pack=True, capture=False)
    norm = RMSNorm(HIDDEN, EPS)
    routed = []
    decide = router._decide
    monkeypatch.setattr(router, "_decide", lambda *a: routed.append(1) or decide(*a))
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(9, HIDDEN)  # more rows than the kernel was verified on: the engine's own path
            torch.testing.assert_close(_call(router, norm, x), norm(x))
        assert len(routed) == 1
        x = torch.randn(4, HIDDEN)  # another signature is routed afresh, to the kernel
        torch.testing.assert_close(_call(router, norm, x), norm(x))
        assert len(routed) == 2
        with torch.profiler.profile():  # a traced call runs the whole path, so the trace labels what ran
            _call(router, norm, torch.randn(9, HIDDEN))
        assert len(routed) == 3
    assert router.fallback["RMSNorm"] == {"more rows than the pack's kernels were verified on": 4}
    assert router.custom["norm"].calls == 1


def test_the_two_paths_are_compared_per_row_when_their_timed_calls_came_in_other_sizes(monkeypatch, tmp_path):
    # continuous batching: the engine's path happened to be timed on 897-row prefill chunks, the kernel's on 128-row
    # ones; per call the kernel looks 3x faster, per row it is twice as slow
    router = _router(monkeypatch, tmp_path, pack=True, capture=False)
    router.timings["norm"] = ([(897.0, 897)] * routing.PROBE_CALLS,
                              [(256.0, 128)] * (routing.PROBE_CALLS - 1) + [(1794.0, 897)])
    router._timed_call(_entry("norm", "rmsnorm", [[8, HIDDEN]]))
    calls = router.custom["norm"]
    assert (calls.engine_us, calls.kernel_us) == (897.0, 1794.0)  # at the median call's 897 rows
    assert calls.disabled.startswith("slower in the engine than its own path")


def test_only_the_path_that_runs_first_in_a_timed_call_is_timed_so_neither_finds_the_others_weights(monkeypatch,
                                                                                                     tmp_path):
    router = _router(monkeypatch, tmp_path, pack=True, capture=False)
    # cold (first in the call) the engine's path takes 10 µs and the kernel 8; warm (second) 1 and 0.5: what the model
    # sees is the cold pair, where timing both sides would mix in the warm ones
    order: list[str] = []

    def timed(path, run):
        order.append(path)
        cold = len(order) % 2 == 1
        return run(), {("engine", True): 10e-6, ("engine", False): 1e-6, ("kernel", True): 8e-6,
                       ("kernel", False): 0.5e-6}[path, cold]

    monkeypatch.setattr(routing, "_timed", timed)
    norm = RMSNorm(HIDDEN, EPS)
    with torch.no_grad():
        for _ in range(routing.PROBE_AFTER + routing.PROBE_EVERY * 2 * routing.PROBE_CALLS):
            _call(router, norm, torch.randn(4, HIDDEN))
    calls = router.custom["norm"]
    assert calls.timed == routing.PROBE_CALLS and not calls.disabled
    assert (calls.engine_us, calls.kernel_us) == (10.0, 8.0)
    firsts = order[2::2]  # after the untimed first call's pair, each timed call's first path alternates
    assert firsts.count("engine") == firsts.count("kernel") == routing.PROBE_CALLS


class RoutedExperts(nn.Module):
    """vLLM's FusedMoE experts under its class name: stacked w13 [E, 2I, H] (gate rows first) and w2 [E, H, I], kept
    as the plugin's MoE method keeps them, computed here densely (every expert on every token, then each token's
    chosen ones mixed): another way to the same numbers than the family's reference."""

    def __init__(self, hidden: int, inter: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k, self.global_num_experts, self.expert_map, self.activation = top_k, experts, None, "SILU"
        self._kernelbot_moe = (torch.randn(experts, 2 * inter, hidden) / hidden ** 0.5,
                               torch.randn(experts, hidden, inter) / inter ** 0.5)

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts=None, shared_experts_input=None):
        w13, w2 = self._kernelbot_moe
        gate, up = torch.einsum("th,eih->eti", x, w13).chunk(2, dim=-1)
        every = torch.einsum("eti,ehi->eth", torch.nn.functional.silu(gate) * up, w2)  # [E, T, H]
        chosen = every[topk_ids.long(), torch.arange(x.shape[0])[:, None]]  # [T, k, H]
        return (chosen * topk_weights[..., None]).sum(1)


def test_vllms_moe_experts_are_captured_when_the_reference_agrees_and_refused_with_shared_experts(monkeypatch,
                                                                                                  tmp_path):
    for name in (routing.PACK_ENV, routing.COUNTS_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(routing.CAPTURE_ENV, str(tmp_path / "counts"))
    router = router_from_env("vllm", {"RoutedExperts": [vllm_plugin.MOE]})
    layer = RoutedExperts(HIDDEN, 40, 4, 2)
    with torch.no_grad():
        for tokens, shared in ((8, None), (3, None), (8, nn.Identity())):
            ids = torch.stack([torch.randperm(4)[:2] for _ in range(tokens)]).to(torch.int32)
            weights = torch.softmax(torch.randn(tokens, 2), -1)
            router.handle([vllm_plugin.MOE], layer, layer.apply, (layer, torch.randn(tokens, HIDDEN), weights, ids,
                                                                  shared, None), {})
    router.write(force=True)
    (report,) = read_reports(tmp_path / "counts")
    by = {c.why: c for c in report.captures}
    plain = by[""]
    assert plain.family == "moe_experts" and plain.module_class == "MoERunner" and plain.agrees
    assert plain.init_args == [HIDDEN, 40, 4, 2, "float32"] and plain.rows == {"8": 1, "3": 1}
    assert by["shared experts run inside the call"].agrees is None  # refused, so never judged


INTER = 48


class _Projection(nn.Module):
    """A vLLM linear layer once loaded: its weight kept for kernelbot (vLLM's CPU method repacks its own), its
    forward (output, bias) as vLLM's linear layers return."""

    def __init__(self, out: int, inp: int, output_sizes: list[int] | None = None) -> None:
        super().__init__()
        self._kernelbot_weight = torch.randn(out, inp) / inp ** 0.5
        self.bias, self.tp_size, self.output_sizes = None, 1, output_sizes

    def forward(self, x: torch.Tensor):
        return x @ self._kernelbot_weight.T, None


MergedColumnParallelLinear = type("MergedColumnParallelLinear", (_Projection,), {})
RowParallelLinear = type("RowParallelLinear", (_Projection,), {})


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


class Qwen2MLP(nn.Module):
    """vLLM's Qwen2 MLP: merged gate-and-up, SiLU-and-mul, down (a model file's own class)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(2 * INTER, HIDDEN, [INTER, INTER])
        self.act_fn = SiluAndMul()
        self.down_proj = RowParallelLinear(HIDDEN, INTER)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up, _ = self.gate_up_proj(x)
        return self.down_proj(self.act_fn(gate_up))[0]


def _mlp_router(monkeypatch, tmp_path, by_structure: tuple) -> routing.Router:
    for name in (routing.PACK_ENV, routing.CAPTURE_ENV, routing.COUNTS_ENV):
        monkeypatch.delenv(name, raising=False)
    entry = _entry("mlp", "gated_mlp", [[8, HIDDEN]]).model_copy(update={
        "module_class": "Qwen2MLP", "init_args": [HIDDEN, INTER, "float32"], "config": {"grain": 4}})
    (tmp_path / "pack" / "kernels").mkdir(parents=True)
    (tmp_path / "pack" / entry.source_file).write_text(FAMILIES["gated_mlp"].candidate_source("cpp", entry.config))
    (tmp_path / "pack" / "manifest.json").write_text(Pack(version="t", run_id="r", device="cpu", entries=[entry])
                                                     .model_dump_json())
    monkeypatch.setenv(routing.PACK_ENV, str(tmp_path / "pack"))
    monkeypatch.setenv(routing.COUNTS_ENV, str(tmp_path / "counts"))
    router = router_from_env("vllm", {"RMSNorm": vllm_plugin.LAYERS["RMSNorm"]}, by_structure=by_structure)
    assert router is not None
    return router


def test_a_models_gated_mlp_is_found_by_its_parts_and_its_whole_call_goes_to_a_fused_kernel(monkeypatch, tmp_path):
    mlp, sharded = Qwen2MLP(), Qwen2MLP()
    sharded.down_proj.tp_size = 2  # its all-reduce runs in the down projection's forward: the fused kernel skips it
    gelu = Qwen2MLP()
    gelu.act_fn = type("GeluAndMul", (SiluAndMul,), {})()
    assert vllm_plugin._gated_mlp(mlp) and not vllm_plugin._gated_mlp(gelu)
    router = _mlp_router(monkeypatch, tmp_path, by_structure=(vllm_plugin.MLP,))
    with torch.no_grad():
        for rows in (8, 5, 9):
            x = torch.randn(rows, HIDDEN)
            torch.testing.assert_close(router.handle([vllm_plugin.MLP], mlp, mlp.forward, (x,), {}), mlp(x))
        router.handle([vllm_plugin.MLP], sharded, sharded.forward, (torch.randn(4, HIDDEN),), {})
    router.write(force=True)
    (report,) = read_reports(tmp_path / "counts")
    assert report.custom["mlp"].calls == 2 and not report.unrouted
    assert report.fallback["Qwen2MLP"] == {
        "more rows than the pack's kernels were verified on": 1,
        "tensor parallel (the down projection's all-reduce runs in its forward)": 1}
    # without the structural spec no layer class takes the entry: it is listed, not routed
    unrouted = _mlp_router(monkeypatch, tmp_path / "plain", by_structure=()).report().unrouted
    assert [u["candidate_id"] for u in unrouted] == ["mlp"]


def test_a_call_made_inside_a_captured_layers_own_path_is_captured_within_that_layer(monkeypatch, tmp_path):
    router = _router(monkeypatch, tmp_path, pack=False, capture=True)
    norm = RMSNorm(HIDDEN, EPS)

    class NormedMLP(Qwen2MLP):  # an enclosing layer whose own path calls a hooked one
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(_call(router, norm, x))

    mlp = NormedMLP()
    with torch.no_grad():
        for _ in range(2):
            router.handle([vllm_plugin.MLP], mlp, mlp.forward, (torch.randn(4, HIDDEN),), {})
        _call(router, norm, torch.randn(4, HIDDEN))
    router.write(force=True)
    (report,) = read_reports(tmp_path / "counts")
    norms = {c.within: c.calls for c in report.captures if c.family == "rmsnorm"}
    assert norms == {"NormedMLP": 2, "": 1}
    (enclosing,) = [c for c in report.captures if c.family == "gated_mlp"]
    assert enclosing.engine_class == "NormedMLP" and enclosing.within == "" and enclosing.calls == 2
