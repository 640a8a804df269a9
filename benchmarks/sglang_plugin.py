"""What a call through kernelbot's SGLang plugin costs next to SGLang's own path, per layer and shape.

Run with the SGLang test environment's python (`.ci/sglang_env.sh`):

    .venv-sglang/bin/python benchmarks/sglang_plugin.py [--rounds 15] [--iters 300]

It writes a pack of the library's C++ kernels (RMSNorm at hidden 256, SiluAndMul at width 2048, RotaryEmbedding
with 4 query and 2 key heads of 64, verified shapes of 4 and 32 rows), loads the plugin through SGLang's own
`load_plugins()` on SGLang's CPU platform, and times each call both ways in interleaved rounds: the layer called
as a model calls it (hook, routing, the pack's kernel) and `forward_native` (what SGLang runs on a CPU without
AMX). Medians over rounds; µs per call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HIDDEN, WIDTH, EPS = 256, 2048, 1e-6
HEAD, Q_WIDTH, K_WIDTH = 64, 256, 128
ROPE_INIT = [HEAD, HEAD, 2048, 10000.0, True, "float32"]


def write_pack(pack_dir: Path) -> None:
    from kernelbot.kernel_library import FAMILIES
    from kernelbot.records import Pack, PackEntry

    (pack_dir / "kernels").mkdir(parents=True)
    entries = []
    for family, module, widths, init in (("rmsnorm", "RMSNorm", [HIDDEN], [HIDDEN, EPS, "float32"]),
                                         ("silu_and_mul", "SiluAndMul", [WIDTH], []),
                                         ("rotary_embedding", "RotaryEmbedding", [None, Q_WIDTH, K_WIDTH], ROPE_INIT)):
        for rows in (4, 32):
            cid = f"{family}_{rows}"
            shapes = [[rows] if w is None else [rows, w] for w in widths]
            entries.append(PackEntry(task_id=cid, candidate_id=cid, family=family, module_class=module,
                                     input_shapes=shapes, init_args=init, dtype="float32", backend="cpp",
                                     config={"grain": 16}, source_file=f"kernels/{cid}.py", source_hash="bench",
                                     verification="pass: benchmark", speedup=1.0))
            (pack_dir / entries[-1].source_file).write_text(FAMILIES[family].candidate_source("cpp", {"grain": 16}))
    pack = Pack(version="bench", run_id="bench", device="cpu", entries=entries)
    (pack_dir / "manifest.json").write_text(pack.model_dump_json())


def per_call_us(fn, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e6


def main(rounds: int = 15, iters: int = 300) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    import torch
    from sglang_child import _torchvision_ops  # the CPU wheel's torchvision needs two schemas declared

    from kernelbot.engine.router import COUNTS_ENV, PACK_ENV

    pack_dir = Path(tempfile.mkdtemp(prefix="kb-bench-")) / "pack"
    write_pack(pack_dir)
    os.environ.update({"SGLANG_PLUGINS": "kernelbot_pack", PACK_ENV: str(pack_dir),
                       COUNTS_ENV: str(pack_dir.parent / "counts"), "SGLANG_USE_CPU_ENGINE": "1"})
    _torchvision_ops()
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.rotary_embedding import RotaryEmbedding

    torch.manual_seed(0)
    norm, silu = RMSNorm(HIDDEN, eps=EPS), SiluAndMul()
    rope = RotaryEmbedding(*ROPE_INIT[:5], torch.float32)
    cases = []
    for rows in (4, 32):
        x, r, g = torch.randn(rows, HIDDEN), torch.randn(rows, HIDDEN), torch.randn(rows, WIDTH)
        cases += [(f"RMSNorm [{rows}, {HIDDEN}]", lambda x=x: norm(x), lambda x=x: norm.forward_native(x)),
                  (f"RMSNorm + residual [{rows}, {HIDDEN}]", lambda x=x, r=r: norm(x, r),
                   lambda x=x, r=r: norm.forward_native(x, r)),
                  (f"SiluAndMul [{rows}, {WIDTH}]", lambda g=g: silu(g), lambda g=g: silu.forward_native(g))]
        qkv = torch.randn(rows, Q_WIDTH + 2 * K_WIDTH)  # q and k as SGLang passes them: slices of qkv
        p, q, k = torch.randint(0, 2048, (rows,)), qkv[:, :Q_WIDTH], qkv[:, Q_WIDTH:Q_WIDTH + K_WIDTH]
        cases.append((f"RotaryEmbedding [{rows}] q {Q_WIDTH} k {K_WIDTH}", lambda p=p, q=q, k=k: rope(p, q, k),
                      lambda p=p, q=q, k=k: rope.forward_native(p, q, k)))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of {rounds} rounds x {iters} calls")
    print(f"{'call':34s} {'plugin + pack µs':>17s} {'forward_native µs':>18s} {'ratio':>7s}")
    with torch.inference_mode():
        for name, hooked, native in cases:
            hooked(), native()  # load the kernel, warm the caches
            times: dict[str, list[float]] = {"hooked": [], "native": []}
            for _ in range(rounds):
                times["hooked"].append(per_call_us(hooked, iters))
                times["native"].append(per_call_us(native, iters))
            h, n = statistics.median(times["hooked"]), statistics.median(times["native"])
            print(f"{name:34s} {h:17.1f} {n:18.1f} {n / h:6.2f}x")
    from kernelbot.engine import sglang_plugin

    custom = sglang_plugin._ROUTER.custom if sglang_plugin._ROUTER else {}
    print("calls into the pack:", json.dumps({k: v.calls for k, v in custom.items()}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--iters", type=int, default=300, help="calls per round and variant")
    args = parser.parse_args()
    main(args.rounds, args.iters)
