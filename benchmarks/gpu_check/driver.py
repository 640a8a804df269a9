"""The GPU check's steps (benchmarks/gpu_check.sh runs this): one GPU node, at most 8.5 minutes of steps, nothing
downloaded.

  1. preflight: kernelbot from this checkout (copied as installed, on PYTHONPATH: no pip, no build), its imports under
     the node's own Python, torch and Triton, the GPU (fails fast, exit 2, when none is visible), compute-sanitizer
     and `kernelbot optimize --device`;
  2. verify a correct and a racy Triton RMSNorm (gpu_check/*.py) on the GPU, each under compute-sanitizer, side by
     side;
  3. `kernelbot optimize --device cuda --dtype bfloat16` on the built-in model with Triton candidates, time-boxed;
  4. OUTDIR gets report.json, verdict_correct.json, verdict_racy.json, optimize_log.txt, gpu_check.log and
     summary.json (steps, versions, GPU state, and each expectation met or not). Exit 0: every expectation met;
     1: one was not, or a step failed; 2: the node cannot run the check (no GPU, missing modules).

Python packages the node lacks (on the H200 image: pydantic and its parts, pysimdjson) can travel as wheels: give
their folder with --wheels (or KERNELBOT_WHEELS); `driver.py --wheel-command DIR` prints the pip download line that
fetches them on a machine with an index. `--dry-run` checks the CPU-side parts (paths, imports, the optimize option)
and prints the plan without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PARTS = ("agent", "profiler", "sandbox", "kernel_library", "engine")  # pyproject's package-dir: kernelbot.<part>
REQUIRED = ("kernelbot.cli", "kernelbot.agent.optimize", "kernelbot.agent.verify.run", "torch", "triton",
            "transformers", "pydantic", "simdjson", "pandas", "rich")
OPTIONAL = ("pynvml",)  # GPU clocks and throttling beside the timings
# what the H200 image lacks of kernelbot's requirements (typing-extensions: pydantic needs a newer one than it may
# have), at the versions the CPU set-up tests
NODE_WHEELS = ("pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5",
               "pysimdjson==7.0.2", "typing-extensions==4.16.0")
# Each verification runs the job and then compute-sanitizer's four tools one after another, each a fresh process
# that starts CUDA and compiles the kernel into an empty Triton cache; the two verifications run side by side.
VERIFY_S = 180
OPTIMIZE_S = 330
BUDGET_S = VERIFY_S + OPTIMIZE_S  # the whole check, at worst
PREFLIGHT_S = 60
OUTPUTS = ("report.json", "verdict_correct.json", "verdict_racy.json", "optimize_log.txt", "gpu_check.log",
           "summary.json")

PROBE = r"""
import importlib, json, shutil, sys
found = {}
for name in sys.argv[1].split(","):
    try:
        importlib.import_module(name)
        found[name] = None
    except Exception as exc:
        found[name] = f"{type(exc).__name__}: {exc}"[:300]
info = {"python": sys.version.split()[0], "executable": sys.executable, "imports": found,
        "compute_sanitizer": shutil.which("compute-sanitizer")}
try:
    import kernelbot, torch, triton
    info.update(kernelbot=kernelbot.__file__, torch=torch.__version__, triton=triton.__version__)
    from kernelbot.engine.device import gpu_missing_reason, pick_device
    info["gpu_missing"] = gpu_missing_reason()
    if info["gpu_missing"] is None:
        choice = pick_device("cuda")
        state = choice.gpu_state()
        info.update(gpu=choice.name, gpu_state=state.model_dump() if state else None)
except Exception as exc:
    info["probe_error"] = f"{type(exc).__name__}: {exc}"[:300]
print(json.dumps(info))
"""


@dataclass
class Step:
    name: str
    argv: list[str]
    timeout_s: int
    stdout: str | None = None  # file in OUTDIR that gets the step's stdout (else the log does)


@dataclass
class Outcome:
    name: str
    returncode: int | None
    seconds: float
    timed_out: bool


@dataclass
class Expectation:
    what: str
    met: bool
    detail: str


@dataclass
class Summary:
    ok: bool
    dry_run: bool
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    probe: dict = field(default_factory=dict)
    steps: list[Outcome] = field(default_factory=list)
    expectations: list[Expectation] = field(default_factory=list)
    gpu_after: dict | None = None
    plan: list[str] = field(default_factory=list)


def make_site(root: Path, site: Path) -> Path:
    """A folder that imports as kernelbot from this checkout, laid out as pyproject's package-dir installs it
    (kernelbot/ with each part folder inside). Copied, not linked: the sandbox reads only from the folders on
    sys.path, and Landlock would follow a link out of them."""
    package = site / "kernelbot"
    if package.exists():
        shutil.rmtree(package)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")
    shutil.copytree(root / "kernelbot", package, ignore=skip)
    for part in PARTS:
        shutil.copytree(root / part, package / part, ignore=skip)
    return site


def plan(python: str, work: Path, outdir: Path) -> list[Step]:
    cli = [python, "-m", "kernelbot.cli"]
    verify = [*cli, "verify", str(HERE / "reference.py")]
    flags = ["--device", "cuda", "--json", "--seed", "1", "--timeout", str(VERIFY_S - 30)]
    return [
        Step("verify_correct", [*verify, str(HERE / "correct_triton.py"), *flags, "--workdir",
                                str(work / "verify_correct")], VERIFY_S, "verdict_correct.json"),
        Step("verify_racy", [*verify, str(HERE / "racy_triton.py"), *flags, "--workdir", str(work / "verify_racy")],
             VERIFY_S, "verdict_racy.json"),
        Step("optimize", [*cli, "optimize", "--device", "cuda", "--dtype", "bfloat16", "--model", "llama-tiny",
                          "--run-dir", str(work / "run"), "--iterations", "1", "--max-tasks", "3",
                          "--max-task-minutes", "1.5", "--budget-hours", f"{(OPTIMIZE_S - 60) / 3600:.4f}",
                          "--rounds", "5", "--no-store"], OPTIMIZE_S),
    ]


def wheel_command(folder: Path) -> str:
    """The pip download line (run where an index is reachable) that fetches NODE_WHEELS for the node's Python."""
    platforms = " ".join(f"--platform {p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
                                                      "manylinux2014_x86_64"))
    return (f"python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "
            f"{platforms} -d {shlex.quote(str(folder))} {' '.join(NODE_WHEELS)}")


class Log:
    """Everything the check prints, to the console and to OUTDIR/gpu_check.log."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_text("")

    def __call__(self, message: str) -> None:
        print(message, flush=True)
        with open(self.path, "a") as f:
            f.write(message + "\n")


def probe(python: str, env: dict[str, str], work: Path) -> dict:
    proc = subprocess.run([python, "-c", PROBE, ",".join(REQUIRED + OPTIONAL)], capture_output=True, text=True,
                          env=env, timeout=PREFLIGHT_S, cwd=work)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"probe_error": (proc.stderr or proc.stdout)[-500:]}


def install_wheels(python: str, wheels: Path, target: Path, log: Log) -> bool:
    found = sorted(wheels.glob("*.whl"))
    if not found:
        log(f"--wheels {wheels}: no .whl files there")
        return False
    cmd = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target", str(target),
           *map(str, found)]
    log("$ " + shlex.join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PREFLIGHT_S)
    if proc.returncode:
        log(proc.stderr[-1000:])
    return proc.returncode == 0


def optimize_has_device(python: str, env: dict[str, str], work: Path) -> bool:
    proc = subprocess.run([python, "-m", "kernelbot.cli", "optimize", "--help"], capture_output=True, text=True,
                          env=env, timeout=PREFLIGHT_S, cwd=work)
    return proc.returncode == 0 and "--device" in proc.stdout


def preflight(python: str, env: dict[str, str], site: Path, work: Path, wheels: Path | None, log: Log,
              summary: Summary) -> None:
    """Fills summary.probe and summary.problems; installs the wheels when modules are missing and some are given."""
    info = probe(python, env, work)
    missing = [m for m in REQUIRED if (info.get("imports") or {}).get(m)]
    if missing and wheels is not None:
        target = work / "wheels_site"
        if install_wheels(python, wheels, target, log):
            env["PYTHONPATH"] = f"{env['PYTHONPATH']}{os.pathsep}{target}"
            info = probe(python, env, work)
            missing = [m for m in REQUIRED if (info.get("imports") or {}).get(m)]
    summary.probe = info
    if "probe_error" in info and not info.get("imports"):
        summary.problems.append(f"{python} could not run the import probe: {info['probe_error']}")
        return
    for name in missing:
        summary.problems.append(f"{name} does not import under {python}: {info['imports'][name]}")
    if missing:
        summary.problems.append("carry the missing wheels and pass --wheels DIR; fetch them with: "
                                + wheel_command(Path("DIR")))
        return
    where = Path(info.get("kernelbot") or "/").resolve()
    if not (where.is_relative_to(site.resolve()) or where.is_relative_to(ROOT)):
        summary.problems.append(f"kernelbot imports from {where}, not from this checkout ({ROOT}) or its copy "
                                f"in {site}")
    for name in OPTIONAL:
        if info["imports"].get(name):
            summary.notes.append(f"{name} missing: timings carry no GPU clocks or throttle reasons")
    if not info.get("compute_sanitizer"):
        summary.notes.append("compute-sanitizer is not on PATH: the verdicts' sanitizer checks will be not_run")
    if info.get("gpu_missing"):
        message = f"no GPU is visible here ({info['gpu_missing']}); run the check on a GPU node"
        if not summary.dry_run:
            summary.problems.append(message)
            return  # fail fast: nothing else matters on a node without a GPU
        summary.notes.append(message)
    if not optimize_has_device(python, env, work):
        summary.problems.append("`kernelbot optimize` in this checkout has no --device option (the check runs "
                                "optimize --device cuda); add it first")


def run_steps(steps: list[Step], env: dict[str, str], outdir: Path, work: Path, log: Log) -> list[Outcome]:
    """Each step in its own process group, stopped at its timeout; the verifications side by side."""
    parallel = [s for s in steps if s.name.startswith("verify")]
    outcomes = _run_together(parallel, env, outdir, work, log)
    for step in steps:
        if step not in parallel:
            outcomes += _run_together([step], env, outdir, work, log)
    return outcomes


def _run_together(steps: list[Step], env: dict[str, str], outdir: Path, work: Path, log: Log) -> list[Outcome]:
    running = []
    for step in steps:
        log(f"$ {shlex.join(step.argv)}")
        out = open(outdir / step.stdout, "w") if step.stdout else open(outdir / f".{step.name}.out", "w")
        err = open(outdir / f".{step.name}.err", "w")
        proc = subprocess.Popen(step.argv, stdout=out, stderr=err, env=env, start_new_session=True,
                                cwd=work)
        running.append((step, proc, time.monotonic(), out, err))
    outcomes = []
    for step, proc, t0, out, err in running:
        timed_out = False
        try:
            proc.wait(timeout=max(1.0, step.timeout_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.close()
        err.close()
        seconds = round(time.monotonic() - t0, 1)
        outcomes.append(Outcome(step.name, proc.returncode, seconds, timed_out))
        log(f"[{step.name}] exit {proc.returncode}{' (timed out)' if timed_out else ''} after {seconds} s")
        for name in ([] if step.stdout else [f".{step.name}.out"]) + [f".{step.name}.err"]:
            text = (outdir / name).read_text(errors="replace")
            (outdir / name).unlink()
            if text.strip():
                log(f"[{step.name} {'stderr' if name.endswith('.err') else 'stdout'}]\n{text.rstrip()[-20000:]}")
    return outcomes


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def expectations(outdir: Path, outcomes: list[Outcome]) -> list[Expectation]:
    """What the check expects of each step's output."""
    found = []
    correct, racy = _read_json(outdir / "verdict_correct.json"), _read_json(outdir / "verdict_racy.json")
    if correct is None:
        found.append(Expectation("the correct Triton kernel passes verification", False, "no verdict written"))
    else:
        sanitizer = [c for c in correct["checks"] if "compute-sanitizer" in c.get("detail", "")]
        found.append(Expectation("the correct Triton kernel passes verification", correct["verdict"] == "pass",
                                 f"failed: {correct['failed'] or 'none'}"))
        found.append(Expectation("compute-sanitizer ran on it (memcheck, racecheck, synccheck, initcheck)",
                                 bool(sanitizer) and all(c["status"] == "pass" for c in sanitizer),
                                 "; ".join(f"{c['id']} {c['status']}: {c['detail'][:160]}" for c in sanitizer)
                                 or "no check mentions compute-sanitizer"))
    if racy is None:
        found.append(Expectation("the racy Triton kernel fails verification", False, "no verdict written"))
    else:
        flagged = [c for c in racy["checks"] if c["status"] == "fail"]
        found.append(Expectation("the racy Triton kernel fails verification", racy["verdict"] == "fail",
                                 "; ".join(f"{c['id']}: {c['detail'][:160]}" for c in flagged) or "nothing failed"))
    report = _read_json(outdir / "report.json")
    if report is None:
        run = next((o for o in outcomes if o.name == "optimize"), None)
        found.append(Expectation("optimize wrote report.json", False, f"optimize: {run}"))
        return found
    triton = [k for k in report["kernels"] if k["backend"] == "triton"]
    accepted = [k for k in triton if k["status"] == "accepted"]
    found.append(Expectation("optimize ran the built-in model in bf16 on the GPU",
                             report["device"]["kind"] == "cuda" and report["model"]["dtype"] == "bfloat16",
                             f"{report['device']['name']}, {report['model']['dtype']}; {report['speedup']}x over eager "
                             f"({report['baseline_ms']} → {report['optimized_ms']} ms)"))
    found.append(Expectation("Triton candidates were verified and timed there", bool(triton),
                             f"{len(triton)} Triton candidates, {len(accepted)} accepted: "
                             + "; ".join(f"{k['op']} {k['status']}: {k['reason'][:120]}" for k in triton)))
    graphs, compiled = report.get("graph_decode_ms"), report.get("compiled_ms")
    times = (f"eager {report['baseline_ms']} ms, kernelbot {report['optimized_ms']} ms, CUDA-graph decode {graphs} ms, "
             f"torch.compile {compiled} ms")
    found.append(Expectation("CUDA-graph decode was captured, checked and timed in the same rounds", bool(graphs),
                             times if graphs else "; ".join(n for n in report["notes"] if "CUDA-graph" in n)
                             or "no note says why"))
    found.append(Expectation("goal (issue 16): kernelbot at least 1.3x over eager and not slower than CUDA-graph "
                             "decode", bool(graphs) and report["speedup"] >= 1.3 and report["optimized_ms"] <= graphs,
                             times))
    fid = report.get("fidelity") or {}
    found.append(Expectation("the pack's fidelity passed", bool(fid.get("passed")), json.dumps(fid)[:600]))
    return found


def write_summary(outdir: Path, summary: Summary) -> None:
    (outdir / "summary.json").write_text(json.dumps(asdict(summary), indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outdir", type=Path, nargs="?")
    parser.add_argument("--dry-run", action="store_true", help="check paths, imports and options; print the plan")
    parser.add_argument("--wheels", type=Path, default=os.environ.get("KERNELBOT_WHEELS") or None,
                        help="folder of wheels for modules the node lacks (installed with --no-index)")
    parser.add_argument("--python", default=os.environ.get("PYTHON", "python3"), help="the node's Python")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new temporary one)")
    parser.add_argument("--wheel-command", type=Path, metavar="DIR", default=None,
                        help="print the pip download command that fetches the node's missing wheels into DIR")
    args = parser.parse_args(argv)
    if args.wheel_command is not None:
        print(wheel_command(args.wheel_command))
        return 0
    if args.outdir is None:
        parser.error("OUTDIR is required")
    try:
        args.outdir.mkdir(parents=True, exist_ok=True)
        probe_file = args.outdir / ".write_test"
        probe_file.write_text("")
        probe_file.unlink()
    except OSError as exc:
        print(f"gpu_check: OUTDIR {args.outdir} is not writable ({exc}); pass a folder you can write", file=sys.stderr)
        return 2
    outdir = args.outdir.resolve()
    work = (args.work or Path(tempfile.mkdtemp(prefix="kb_gpu_check_"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    log = Log(outdir / "gpu_check.log")
    summary = Summary(ok=False, dry_run=args.dry_run)
    for name in ("reference.py", "correct_triton.py", "racy_triton.py"):
        if not (HERE / name).is_file():
            summary.problems.append(f"{HERE / name} is missing")
    site = make_site(ROOT, work / "site")
    # Every process starts in `work`, with PYTHONSAFEPATH: `python -m`/`-c` put the working directory first on
    # sys.path, and from the checkout's root its kernelbot/ (which holds none of the parts) would shadow the copy.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "PYTHONUNBUFFERED": "1", "PYTHONSAFEPATH": "1"}
    env.pop("TRITON_INTERPRET", None)  # Triton compiles for the GPU here
    steps = plan(args.python, work, outdir)
    summary.plan = [f"{s.name} (≤ {s.timeout_s} s): {shlex.join(s.argv)}" for s in steps]
    log(f"gpu_check: checkout {ROOT}, work {work}, outdir {outdir}, PYTHONPATH {env['PYTHONPATH']}")
    preflight(args.python, env, site, work, args.wheels, log, summary)
    for note in summary.notes:
        log(f"note: {note}")
    for problem in summary.problems:
        log(f"problem: {problem}")
    if args.dry_run:
        log("plan (the steps a real run takes, in this order; the two verifications side by side):")
        for line in summary.plan:
            log(f"  {line}")
        summary.ok = not summary.problems
        write_summary(outdir, summary)
        return 0 if summary.ok else 1
    if summary.problems:
        write_summary(outdir, summary)
        print(f"gpu_check: {summary.problems[0]}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    summary.steps = run_steps(steps, env, outdir, work, log)
    run = work / "run"
    for source, target in ((run / "report.json", "report.json"), (run / "log.txt", "optimize_log.txt")):
        if source.is_file():
            shutil.copyfile(source, outdir / target)
    summary.expectations = expectations(outdir, summary.steps)
    summary.gpu_after = probe(args.python, env, work).get("gpu_state")
    summary.ok = all(e.met for e in summary.expectations) and all(
        not o.timed_out and o.returncode in (0, 1) for o in summary.steps)
    for e in summary.expectations:
        log(f"{'MET  ' if e.met else 'UNMET'} {e.what}: {e.detail}")
    log(f"gpu_check: {'all expectations met' if summary.ok else 'NOT all expectations met'} in "
        f"{time.monotonic() - t0:.0f} s of steps (budget {BUDGET_S} s)")
    write_summary(outdir, summary)
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
