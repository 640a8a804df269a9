"""The open world's target, side by side: `kernelbot optimize --model DIR` (in-process) on small models of the
architectures the project was not built around — GPT-2 (Conv1D projections, fused c_attn, learned positions),
Mixtral (sparse MoE), GPT-NeoX (parallel residual, partial rotary), Gemma-2 (soft-capping, sliding window), Qwen2
(biased q/k/v) and BLOOM (ALiBi) — each from a config written here with seeded random weights, in bf16; prints each
run's eager and kernelbot times, their ratio, whether a pack shipped, fidelity, what was accepted and the host's load.

    python benchmarks/architectures.py [--models gpt2,mixtral,gpt-neox,gemma2,qwen2,bloom] [--out DIR]
                                       [--dtype bfloat16] [--max-tasks 8] [--rounds 7] [--compile] [--smallest]

Each run takes minutes on 2 cores (a 4-layer model of hidden 512, every family and generic tasks); run it on a quiet
host: the ratios are only as good as the host's load printed beside them. --smallest runs each model at hidden 64
and 2 layers in fp32, generic tasks only, one task and one round: a smoke run of this script, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from kernelbot.cli import main as kernelbot
from kernelbot.records import Report

SIZES = {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4, "num_attention_heads": 8,
         "num_key_value_heads": 4, "vocab_size": 8192, "max_position_embeddings": 512}
CONFIGS: dict[str, dict] = {
    "gpt2": {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 512, "n_layer": 4, "n_head": 8,
             "vocab_size": 8192, "n_positions": 512},
    "mixtral": {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", **SIZES, "num_local_experts": 4,
                "num_experts_per_tok": 2},
    "gpt-neox": {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
                 **{k: v for k, v in SIZES.items() if k != "num_key_value_heads"}, "hidden_act": "gelu",
                 "use_parallel_residual": True, "rotary_pct": 0.25},
    "gemma2": {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", **SIZES, "head_dim": 64,
               "sliding_window": 256, "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **SIZES},
    "bloom": {"architectures": ["BloomForCausalLM"], "model_type": "bloom", "hidden_size": 512, "n_layer": 4,
              "n_head": 8, "vocab_size": 8192},
}
SMALLEST = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 256, "head_dim": 16, "n_embd": 64, "n_layer": 2, "n_head": 4}


def model_dir(name: str, work: Path, smallest: bool) -> Path:
    config = CONFIGS[name] | ({k: v for k, v in SMALLEST.items() if k in CONFIGS[name]} if smallest else {})
    directory = work / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory


def run(name: str, work: Path, args: argparse.Namespace) -> Report:
    run_dir = work / f"run-{name}"
    argv = ["optimize", "--model", str(model_dir(name, work, args.smallest)), "--iterations", "1", "--no-store",
            "--run-dir", str(run_dir)]
    if args.smallest:
        argv += ["--dtype", "float32", "--families", "generic", "--max-tasks", "1", "--rounds", "1", "--batch", "2",
                 "--prompt-len", "8", "--decode-steps", "4", "--min-share", "0"]
    else:
        argv += ["--dtype", args.dtype, "--max-tasks", str(args.max_tasks), "--rounds", str(args.rounds)]
    if not args.compile:
        argv.append("--no-compile")
    if kernelbot(argv) != 0:
        raise SystemExit(f"kernelbot optimize failed for {name}; see {run_dir}/log.txt")
    return Report.model_validate_json((run_dir / "report.json").read_text())


def line(name: str, r: Report) -> str:
    accepted = sorted({f"{k.module}" for k in r.kernels if k.accepted})
    compiled = f"{r.speedup_vs_compiled:.2f}x" if r.speedup_vs_compiled else "—"
    return (f"| {name} | {r.baseline_ms:.1f} | {r.optimized_ms:.1f} | {r.speedup:.2f}x | {compiled} | "
            f"{len(accepted)} ({', '.join(accepted)}) | {r.fidelity.passed} | {r.host.summary() if r.host else '—'} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(CONFIGS))
    parser.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temporary folder)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-tasks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--compile", action="store_true", help="time torch.compile too (minutes more per model)")
    parser.add_argument("--smallest", action="store_true", help="a smoke run of this script, not a measurement")
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        print(f"architectures: unknown model {unknown[0]!r}; pick from {', '.join(CONFIGS)}", file=sys.stderr)
        return 2
    work = args.out or Path(tempfile.mkdtemp(prefix="kb-architectures-"))
    rows = [line(name, run(name, work, args)) for name in names]
    print("\n| model | eager ms | kernelbot ms | over eager | over torch.compile | accepted (modules) | fidelity "
          "passed | host over the rounds |\n|---|---:|---:|---:|---:|---|---|---|")
    print("\n".join(rows))
    print(f"\nruns under {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
