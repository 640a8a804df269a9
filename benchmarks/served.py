"""The served loop's target, side by side: `kernelbot optimize --engine vllm` on the built-in model, on a
SmolLM2-135M-shaped config (30 layers, hidden 576, 9 heads, 3 KV heads), and (`--models mixtral`, `--models gemma`) on
a small Mixtral (hidden 512, 4 layers, 4 experts, top 2) or a Gemma of that size, each in bf16 on vLLM's CPU build;
prints stock vs packed decode throughput (median of the interleaved rounds), whether the rounds separate, fidelity,
which ops got accepted kernels with their calls in the server's processes, and the host's load over the rounds.

    python benchmarks/served.py [--engine-python .venv-vllm/bin/python] [--models llama-tiny,smollm2-135m,mixtral,gemma]
                                [--out DIR] [--rounds 7] [--max-tasks 12] [--smallest]

--smallest runs llama-micro with two families: a smoke run of this script, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from kernelbot.cli import main as kernelbot
from kernelbot.records import Report

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2_135M = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
                "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "rms_norm_eps": 1e-5,
                "rope_theta": 100000.0, "max_position_embeddings": 2048, "tie_word_embeddings": True}
# benchmarks/architectures.py's Mixtral (hidden 512, 4 layers, 4 experts, top 2): its experts through vLLM's MoE method
MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 512,
           "intermediate_size": 1376, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
           "vocab_size": 8192, "max_position_embeddings": 512, "num_local_experts": 4, "num_experts_per_tok": 2}
# a Gemma (v1) of the same size: its GemmaRMSNorm and GeluAndMul are vLLM CustomOps no family covers (generic tasks,
# their native forward the reference, extracted in vLLM's worker)
GEMMA = {"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "hidden_size": 512, "intermediate_size": 1376,
         "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 64,
         "vocab_size": 8192, "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 512,
         "rms_norm_eps": 1e-6}
CONFIGS = {"smollm2-135m": SMOLLM2_135M, "mixtral": MIXTRAL, "gemma": GEMMA}


def model_argument(name: str, work: Path) -> str:
    """A built-in name as it is; the configs above as config-only directories (seeded weights are written by the
    run)."""
    if name not in CONFIGS:
        return name
    directory = work / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(CONFIGS[name], indent=1))
    return str(directory)


def run(model: str, run_dir: Path, args: argparse.Namespace) -> Report:
    argv = ["optimize", "--engine", "vllm", "--engine-python", args.engine_python, "--model", model, "--dtype",
            "bfloat16", "--rounds", str(args.rounds), "--iterations", "1", "--no-compile", "--no-store",
            "--max-tasks", str(args.max_tasks), "--run-dir", str(run_dir)]
    if args.smallest:
        argv += ["--batch", "4", "--prompt-len", "16", "--decode-steps", "8", "--requests-per-round", "4",
                 "--families", "add_rmsnorm,paged_attention", "--min-share", "0"]
    if kernelbot(argv) != 0:
        raise SystemExit(f"kernelbot optimize failed for {model}; see {run_dir}/log.txt")
    return Report.model_validate_json((run_dir / "report.json").read_text())


def line(name: str, r: Report) -> str:
    s = r.serving
    assert s is not None
    ops = sorted({f"{k.op}:{k.calls}" for k in r.kernels if k.accepted})
    gain = f"{s.with_pack.output_throughput / s.stock.output_throughput:.2f}x"
    return (f"| {name} | {s.stock.output_throughput:.1f} | {s.with_pack.output_throughput:.1f} | {gain} | "
            f"{s.beyond_noise} | {r.fidelity.passed} | {len({o.split(':')[0] for o in ops})} ({', '.join(ops)}) | "
            f"{s.host.summary() if s.host else '—'} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--models", default="llama-tiny,smollm2-135m")
    parser.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temporary folder)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--max-tasks", type=int, default=12)
    parser.add_argument("--smallest", action="store_true")
    args = parser.parse_args()
    if not Path(args.engine_python).exists():
        print(f"benchmarks: no vLLM environment at {args.engine_python}; make it with .ci/vllm_env.sh",
              file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="kb-served-"))
    names = ["llama-micro"] if args.smallest else args.models.split(",")
    reports = {name: run(model_argument(name, out), out / name, args) for name in names}
    print("| model | stock tok/s | kernelbot tok/s | gain | rounds separate | fidelity passed | accepted ops "
          "(calls in the server) | host over the rounds |")
    print("|---|---:|---:|---:|---|---|---|---|")
    for name, report in reports.items():
        print(line(name, report))
    print(f"runs: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
