"""The `kernelbot` command: a thin layer over each stage."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from kernelbot import KernelbotError
from kernelbot.agent.llm.flags import add_llm_arguments
from kernelbot.agent.run_options import OptimizeOptions
from kernelbot.cli_runs import add_run_arguments, add_run_parsers, run_optimize
from kernelbot.engine.serving.serve_options import ServeOptions
from kernelbot.flags import default, options


def _optimize(args: argparse.Namespace) -> int:
    from kernelbot.agent.llm.flags import llm_options
    from kernelbot.agent.verify.compile_gate import checked_target
    from kernelbot.kernel_library.store import store_root

    if args.resume is not None and args.run_dir is not None:
        raise KernelbotError("--resume RUN_DIR names the run already; drop --run-dir")
    opts = options(OptimizeOptions, model=args.model, dtype=args.dtype, batch=args.batch, prompt_len=args.prompt_len,
                   decode_steps=args.decode_steps, lengths=args.lengths, seed=args.seed, run_dir=args.run_dir,
                   min_share=args.min_share,
                   max_tasks=args.max_tasks, timeout=args.timeout, e2e_rounds=args.rounds, compile=not args.no_compile,
                   families=args.families.split(",") if args.families else None, llm=llm_options(args),
                   budget_hours=args.budget_hours, iterations=args.iterations, max_task_minutes=args.max_task_minutes,
                   store=None if args.no_store else (args.store or store_root()), device=args.device,
                   cluster=args.cluster, serve=_serve_options(args), peak_tflops=args.peak_tflops,
                   peak_gbps=args.peak_gbps, target=checked_target(args.target) if args.target else None)
    if args.cluster is not None:
        from kernelbot.agent.cluster import require_ray

        require_ray()
        if args.resume is not None:
            _point_run_at_cluster(args.resume, args.cluster)
    from kernelbot.engine.models import model_argument
    from kernelbot.hardware.device import pick_device

    pick_device(args.device)  # no GPU for --device cuda: one line, exit 2, before any run directory exists

    # the model: a built-in name, or the model directory's absolute path
    return run_optimize(args, opts.model_copy(update={"model": model_argument(opts.model)}))


def _serve_options(args: argparse.Namespace) -> ServeOptions | None:
    """--engine vllm|sglang: how kernelbot starts the engine's servers (None: the model runs in this process)."""
    if args.engine == "torch":
        return None
    from kernelbot.engine.serving.serve_options import EngineKind

    if args.rounds < 5:
        raise KernelbotError(f"--rounds {args.rounds}: a served A/B needs at least 5 interleaved rounds")
    fields = {"engine": EngineKind(args.engine), "server_args": list(args.server_arg), "port": args.port,
              "tp": args.tp, "requests_per_round": args.requests_per_round}
    if args.engine_python:
        fields["python"] = shlex.split(args.engine_python)
    if args.launch_cmd:
        fields["launch"] = shlex.split(args.launch_cmd)
    return options(ServeOptions, **fields)


def _point_run_at_cluster(run_dir: Path, address: str) -> None:
    """`--resume RUN_DIR --cluster ADDRESS`: the run continues on this cluster (say, the head moved); the journal's
    options are what a resumed run reads."""
    from kernelbot.agent.journal.db import Journal

    if not (Path(run_dir) / "journal.sqlite").exists():
        return  # resume itself says what is wrong with the directory
    with Journal(Path(run_dir)) as journal:
        options = journal.meta("options")
        if options is not None:
            journal.set_meta("options", {**options, "cluster": address})


def _rank(args: argparse.Namespace) -> int:
    from kernelbot.profiler import render
    from kernelbot.profiler.rank import rank

    report = rank(args.trace, tflops=args.peak_tflops, gbps=args.peak_gbps, sort=args.sort)
    if args.plot:
        render.plot(report, args.plot, args.top)
    if args.format == "json":
        print(report.model_dump_json(indent=1))
    elif args.format == "csv":
        print(render.to_csv(report), end="")
    else:
        print(render.table(report, args.top))
    return 0


def _verify(args: argparse.Namespace) -> int:
    from kernelbot.agent.verify.compile_gate import checked_target, described
    from kernelbot.agent.verify.run import task_from_reference, verify

    if args.trials < 1 or args.timeout <= 0:
        raise KernelbotError("--trials must be at least 1 and --timeout positive")
    target = checked_target(args.target) if args.target else None  # one line, exit 2, for one no one knows
    device = args.device
    if device != "cpu":  # one line, exit 2: an unknown device, or a GPU this host does not have
        from kernelbot.hardware.device import pick_device

        choice = pick_device(device)
        device = choice.spec if ":" in device else choice.kind
    task = task_from_reference(args.reference)
    if not args.candidate.is_file():
        raise KernelbotError(f"{args.candidate}: no such candidate file")
    verdict = verify(task, args.reference, args.candidate, args.workdir or args.candidate.with_suffix(".verify"),
                     seed=args.seed, timeout=args.timeout, device=device, trials=args.trials, target=target,
                     require_deterministic=args.require_deterministic)
    if args.json:
        print(verdict.model_dump_json(indent=2))
    else:
        for c in verdict.checks:
            print(f"{c.status:8s} {c.id:18s} {c.detail}")
        for build in verdict.builds:
            print(f"build    {build.backend} for {build.target} [{build.specialization or '-'}] {described(build)}")
        for note in verdict.notes:
            print(f"note     {note}")
        print(f"{verdict.verdict.upper()} in {verdict.seconds:.1f} s (seed {verdict.seed})")
    return 0 if verdict.verdict == "pass" else 1


def _image(args: argparse.Namespace) -> int:
    from kernelbot.engine import image

    if args.image_command == "build":
        built = image.build(args.run_dir, args.base, args.tag, install=not args.no_install)
        print(f"built {built['tag']} ({built['id']}) run {built['run_id']} pack {built['pack_digest']}")
    elif args.image_command == "push":
        print(f"pushed {args.tag} {image.push(args.tag)}")
    else:
        for r in image.list_promotions(args.index):
            print(f"{r['date']}  {r['tag']}  {r['digest']}  run {r['run_id']}  model {r.get('model', '?')}")
    return 0


def _promote(args: argparse.Namespace) -> int:
    from kernelbot.engine import image

    r = image.promote(args.run_dir, args.base, args.tag, index=args.index, install=not args.no_install)
    print(f"promoted run {r['run_id']} as {r['tag']} {r['digest']} (index {args.index})")
    return 0


def _add_image_parsers(sub: argparse._SubParsersAction) -> None:
    from kernelbot.engine.image import DEFAULT_INDEX

    img = sub.add_parser("image", help="container images of a run's kernel pack").add_subparsers(
        dest="image_command", required=True)
    p = img.add_parser("build", help="the engine's base image + the pack + kernelbot + its activation")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--base", required=True, help="the engine's image, e.g. lmsysorg/sglang:v0.5.23")
    p.add_argument("--tag", required=True)
    p.add_argument("--no-install", action="store_true", help="copy kernelbot's wheel but do not pip install it "
                                                             "(bases without Python)")
    p = img.add_parser("push", help="push an image to its registry and print the digest")
    p.add_argument("tag")
    p = img.add_parser("list", help="the promotions index: tag, digest, run, date")
    p.add_argument("--index", type=Path, default=DEFAULT_INDEX)
    sub.choices["image"].set_defaults(func=_image)

    p = sub.add_parser("promote", help="refuse unverified or unfaithful packs; else build, push and index")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--base", required=True, help="the engine's image, e.g. lmsysorg/sglang:v0.5.23")
    p.add_argument("--tag", required=True, help="REGISTRY/REPO:TAG to push")
    p.add_argument("--index", type=Path, default=DEFAULT_INDEX)
    p.add_argument("--no-install", action="store_true")
    p.set_defaults(func=_promote)


TARGET_HELP = ("the GPU architecture candidates' Triton and CUDA kernels are compiled for ahead of time (registers, "
               "spills, shared memory; no GPU needed): default sm_90 (H100/H200) on a CPU, the GPU's own on a GPU")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelbot", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("optimize", help="profile, rank, generate, verify, benchmark and integrate kernels")
    p.add_argument("--model", default=default(OptimizeOptions, "model"),
                   help="built-in model (llama-tiny, the default; llama-micro) or a local "
                   "Hugging Face causal-LM directory (config.json, and *.safetensors when present; without them, "
                   "seeded random weights); served engines load the same model (written into the run when it has no "
                   "weights)")
    p.add_argument("--engine", choices=["torch", "vllm", "sglang"], default="torch",
                   help="torch: the model in this process (transformers; default); vllm, sglang: the model served by "
                        "that engine, whose servers kernelbot starts on loopback, loads, profiles and stops")
    p.add_argument("--dtype", default=default(OptimizeOptions, "dtype"),
                   help="auto (bf16 where the CPU has it, else fp32), float32, bfloat16")
    p.add_argument("--batch", type=int, default=default(OptimizeOptions, "batch"))
    p.add_argument("--prompt-len", type=int, default=default(OptimizeOptions, "prompt_len"))
    p.add_argument("--decode-steps", type=int, default=default(OptimizeOptions, "decode_steps"))
    p.add_argument("--lengths", choices=["fixed", "uniform", "chat"], default=default(OptimizeOptions, "lengths").value,
                   help="each request's prompt and output lengths, up to --prompt-len and --decode-steps: fixed (all "
                        "of them), uniform (from a quarter up), chat (long-tailed, seeded); served engines only")
    p.add_argument("--seed", type=int, default=default(OptimizeOptions, "seed"))
    p.add_argument("--run-dir", type=Path, default=None, help="where the run is written (default: runs/<id>)")
    p.add_argument("--max-tasks", type=int, default=default(OptimizeOptions, "max_tasks"))
    p.add_argument("--timeout", type=float, default=default(OptimizeOptions, "timeout"),
                   help="seconds per candidate job in the sandbox")
    p.add_argument("--rounds", type=int, default=default(OptimizeOptions, "e2e_rounds"),
                   help="interleaved end-to-end timing rounds")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile comparison")
    p.add_argument("--device", default=default(OptimizeOptions, "device"), metavar="auto|cpu|cuda|cuda:N",
                   help="where the model runs and candidates are verified and timed: auto (a GPU when one is visible, "
                        "else the CPU), cpu (C++ kernels), cuda (a GPU, KERNELBOT_GPU's or the first; Triton "
                        "kernels), cuda:N (the N-th GPU this process sees, for the model and the candidates)")
    p.add_argument("--target", default=None, metavar="sm_XY", help=TARGET_HELP)
    p.add_argument("--families", default=None, help="comma-separated kernel families to try (default: all)")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the device's peak TFLOP/s at the run's dtype, instead of measuring it")
    p.add_argument("--peak-gbps", type=float, default=None,
                   help="the device's peak memory GB/s, instead of measuring it")
    p.add_argument("--cluster", default=None, metavar="ADDRESS",
                   help="evaluate candidates on a Ray cluster: auto, host:port or ray://host:port (what ray.init "
                        "takes); one GPU (or CPU) per candidate, as many at once as it holds; needs "
                        "pip install 'kernelbot[ray]'. With --resume: continue the run on this cluster")
    g = p.add_argument_group("--engine vllm|sglang (the model served: --batch requests in flight, each of "
                             "--prompt-len prompt and --decode-steps generated tokens; --rounds A/B rounds)")
    g.add_argument("--engine-python", default=None, metavar="PYTHON",
                   help="the Python of the environment where the engine is installed (default: this one)")
    g.add_argument("--launch-cmd", default=None, help="the server command instead of `PYTHON -m <engine's server "
                   "module>` (a wrapper that takes the same arguments)")
    g.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="passed to every server as is (repeat it), e.g. --server-arg=--max-num-seqs=64")
    g.add_argument("--tp", type=int, default=default(ServeOptions, "tp"), help="tensor-parallel ranks")
    g.add_argument("--port", type=int, default=default(ServeOptions, "port"),
                   help="the first server's port (a port in use is skipped)")
    g.add_argument("--requests-per-round", type=int, default=default(ServeOptions, "requests_per_round"),
                   help="requests per load round")
    add_llm_arguments(p)
    add_run_arguments(p)
    p.set_defaults(func=_optimize)

    p = sub.add_parser("rank", help="rank the GPU kernels of a trace (Kineto JSON, nsys CSV/SQLite, or a directory)")
    p.add_argument("trace", type=Path, help="trace file, or a directory of per-rank traces")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--format", choices=["table", "json", "csv"], default="table")
    p.add_argument("--sort", choices=["score", "time"], default="score", help="by headroom (default) or by time")
    p.add_argument("--peak-tflops", type=float, default=None, help="override the device's peak TFLOP/s")
    p.add_argument("--peak-gbps", type=float, default=None, help="override the device's peak memory GB/s")
    p.add_argument("--plot", type=Path, default=None, help="also write a PNG of the breakdown")
    p.set_defaults(func=_rank)

    p = sub.add_parser("verify", help="verify a KernelBench candidate (ModelNew) against its reference (Model)")
    p.add_argument("reference", type=Path)
    p.add_argument("candidate", type=Path)
    p.add_argument("--json", action="store_true")
    p.add_argument("--device", default="cpu", metavar="cpu|cuda|cuda:N",
                   help="where the candidate runs: cpu (the default; Triton in its interpreter), cuda (KERNELBOT_GPU's "
                        "GPU, else the first), cuda:N")
    p.add_argument("--target", default=None, metavar="sm_XY", help=TARGET_HELP)
    p.add_argument("--trials", type=int, default=1, help="independent random input draws at the main sizes")
    p.add_argument("--require-deterministic", action="store_true",
                   help="fail kernels whose results depend on the order of float atomics (split reductions)")
    p.add_argument("--seed", type=int, default=None, help="input seed (default: a fresh secret one; the verdict "
                                                          "records it for replay)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for the sandboxed candidate job")
    p.add_argument("--workdir", type=Path, default=None)
    p.set_defaults(func=_verify)
    _add_image_parsers(sub)
    add_run_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KernelbotError as exc:
        print(f"kernelbot: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
