"""What kernels can gain at most in a model served by vLLM on this host, measured, beside what they gain: for each model
(the built-in one and served.py's SmolLM2-135M shape by default), in bf16 at `--batch` sequences:

- the decode step as the server runs it: a stock vLLM server (the model's seeded weights, `kernelbot optimize`'s
  server flags) under served.py's load; inter-token latency p50, tok/s, and the cores its worker is bound to;
- the model's forward and LM head in that step, and a plain read of the weights it streams: the same engine in one
  process (vLLM's in-process executor) bound to the worker's cores (engine/serving/ceiling.py);
- the step's weight GEMMs alone (every projection of every layer and the LM head, distinct weights as the model
  streams them) on the worker's one thread: vLLM's own oneDNN GEMM, kernelbot's small-M GEMM, and the stream
  ceiling (a plain sum reading the same bytes);
- the served gain those imply: the step with vLLM's GEMMs replaced by kernelbot's, by GEMMs at the stream ceiling,
  with the forward only reading its weights (a step, and the load's throughput with prefill as measured), and with
  the whole forward taking no time at all (no kernel can beat that).

    .venv-vllm/bin/python benchmarks/served_ceiling.py [--models llama-tiny,smollm2-135m] [--batch 8] [--rounds 3]
                                                       [--prompt-len 32] [--output-len 32] [--smallest]

--models takes built-in names, served.py's config names and model directories (benchmarks/models/qwen2.5-0.5b at
real scale: --prompt-len 512 --output-len 128).

Runs under the vLLM environment's Python (.ci/vllm_env.sh): it imports vLLM. --smallest: llama-micro, one round (a
smoke run of this script, not a measurement). Nothing else should run meanwhile: the figures are timings.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from served import model_argument

from kernelbot.engine import builtin_spec
from kernelbot.engine.serving.apis import VLLMAPI, ServerSetup
from kernelbot.engine.serving.ceiling import measure_ceiling
from kernelbot.engine.serving.load import Workload, run_load
from kernelbot.engine.serving.served_engine import served_memory, served_model_dir
from kernelbot.engine.serving.server import Launch, ServerProcess, free_port
from kernelbot.engine.serving.sizing import ServerLimits
from kernelbot.hardware import host
from kernelbot.kernel_library.linear.cpp import LinearCpp
from kernelbot.records import ServingMetrics


def best_of(fn: Callable[[], object], repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def weight_shapes(model_dir: Path) -> list[tuple[int, int]]:
    """[N, K] of every weight a decode step multiplies (a Llama-shaped config): each layer's QKV, output, gate/up and
    down projections, then the LM head."""
    c = json.loads((model_dir / "config.json").read_text())
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    kv_heads, head_dim = c.get("num_key_value_heads") or heads, c.get("head_dim") or hidden // heads
    layer = [((heads + 2 * kv_heads) * head_dim, hidden), (hidden, heads * head_dim),
             (2 * c["intermediate_size"], hidden), (hidden, c["intermediate_size"])]
    return [*layer * c["num_hidden_layers"], (c["vocab_size"], hidden)]


def gemm_step_seconds(shapes: list[tuple[int, int]], rows: int) -> dict[str, float]:
    """One decode step's weight GEMMs on one thread: vLLM's oneDNN, kernelbot's small-M GEMM, the stream ceiling."""
    import vllm._custom_ops as ops

    torch.set_num_threads(1)
    weights = [torch.randn(n, k).to(torch.bfloat16) for n, k in shapes]
    xs = {k: torch.randn(rows, k).to(torch.bfloat16) for _n, k in shapes}
    inputs = [xs[k] for _n, k in shapes]
    handlers = [ops.create_onednn_mm(w.t(), 32) for w in weights]
    ours = []
    for w in weights:
        kernel = LinearCpp(w.shape[1], w.shape[0], False, "bfloat16")
        kernel.weight.data.copy_(w)
        ours.append(kernel.bound(torch.bfloat16))
    as_float = [w.view(torch.float32) if w.shape[1] % 2 == 0 else w.float() for w in weights]  # same bytes read
    return {
        "onednn": best_of(lambda: [ops.onednn_mm(h, x, None) for h, x in zip(handlers, inputs, strict=True)]),
        "kernelbot": best_of(lambda: [f(x) for f, x in zip(ours, inputs, strict=True)]),
        "stream": best_of(lambda: [f.sum() for f in as_float]),
        "bytes": float(sum(w.numel() * 2 for w in weights)),
    }


def served_step(model_dir: Path, vocab: int, args: argparse.Namespace, work: Path, workload: Workload,
                limits: ServerLimits) -> tuple[ServingMetrics, list[int]]:
    """Stock vLLM under served.py's load: its median round (by tok/s), and the cores it binds its worker to."""
    api = VLLMAPI()
    setup = ServerSetup(model_dir=model_dir, dtype="bfloat16", limits=limits)
    program = [args.engine_python, "-m", api.module]
    launch = Launch(name="vllm", command=lambda port: api.command(program, setup, port), env=api.environment(setup))
    with ServerProcess(launch, work / "server.log", free_port(18300)) as server:
        server.wait_ready()
        run_load(api, server.url, workload, vocab)
        rounds = []
        for _ in range(args.rounds):
            server.settle()
            rounds.append(run_load(api, server.url, workload, vocab))
        cores = server.bound_cores()
    return sorted(rounds, key=lambda r: r.output_throughput)[len(rounds) // 2], cores


def measure(name: str, args: argparse.Namespace, work: Path) -> str:
    spec, _ = builtin_spec(model_argument(name, work), dtype="bfloat16", batch=args.batch,
                           prompt_len=args.prompt_len, decode_steps=args.output_len)
    workload = Workload(num_prompts=4 * args.batch, input_len=args.prompt_len, output_len=args.output_len,
                        concurrency=args.batch)
    limits = served_memory(spec, workload).limits  # the servers kernelbot starts are sized so too
    model_dir = served_model_dir(spec, work / name)
    vocab = spec.vocab
    stock, cores = served_step(model_dir, vocab, args, work / name, workload, limits)
    ceiling = measure_ceiling([args.engine_python], model_dir, "bfloat16", workload.concurrency, workload.input_len,
                              workload.output_len, limits, vocab, stock, cores)
    timed = gemm_step_seconds(weight_shapes(model_dir), args.batch)
    gemm = {k: v * 1e3 if k != "bytes" else v for k, v in timed.items()}
    step, forward = ceiling.step_ms, ceiling.forward_ms

    def gain(saved_ms: float) -> str:
        return f"{step / max(step - saved_ms, 1e-9):.2f}x"

    stream_gbps = gemm["bytes"] / gemm["stream"] / 1e6
    return (f"| {name} | {step:.1f} | {stock.output_throughput:.0f} | {','.join(map(str, cores)) or 'all'} | "
            f"{forward:.1f} ({forward / step:.0%}) | {ceiling.read_ms} ({ceiling.read_gbps} GB/s) | "
            f"{gemm['onednn']:.1f} | {gemm['kernelbot']:.1f} | {gemm['stream']:.1f} ({stream_gbps:.1f} GB/s) | "
            f"{gain(gemm['onednn'] - gemm['kernelbot'])} | {gain(gemm['onednn'] - gemm['stream'])} | "
            f"{ceiling.read_gain or '—'}x; {ceiling.load_read_gain or '—'}x | {gain(forward)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama-tiny,smollm2-135m")
    parser.add_argument("--engine-python", default=os.environ.get("VLLM_PYTHON", ".venv-vllm/bin/python"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=32, help="prompt tokens per request")
    parser.add_argument("--output-len", type=int, default=32, help="generated tokens per request")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smallest", action="store_true")
    args = parser.parse_args()
    models = ["llama-micro"] if args.smallest else args.models.split(",")
    if args.smallest:
        args.rounds, args.batch, args.prompt_len, args.output_len = 1, 4, 8, 8
    args.engine_python = str(Path(args.engine_python).absolute())
    start = host.sample()
    print(f"bf16, batch {args.batch}, {args.prompt_len} + {args.output_len} tokens")
    print("| model | served step (ITL p50, ms) | served tok/s | worker cores | forward + LM head on them, ms (share) | "
          "a read of its weights there, ms | GEMMs on one thread: vLLM oneDNN, ms | kernelbot, ms | stream ceiling, "
          "ms | gain at kernelbot's GEMMs | at the stream ceiling | forward at the read: a step; the load | "
          "forward free |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="kb_ceiling_") as tmp:
        for name in models:
            print(measure(name, args, Path(tmp)), flush=True)
    load = host.host_load(since=start)
    print(f"host over the run: load average {load.load_1m} on {load.cpu_count} CPUs; this run and its servers "
          f"{load.own_cores} cores, other processes {load.others_cores} cores")


if __name__ == "__main__":
    main()
