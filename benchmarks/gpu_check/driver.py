"""The GPU check's steps (benchmarks/gpu_check.sh runs this): one GPU node, at most 7.5 minutes of steps after a
preflight of seconds, nothing downloaded.

  0. preflight: kernelbot from this checkout (copied as installed, on PYTHONPATH: no pip, no build), its imports under
     the node's own Python, torch and Triton (missing wheels: one line saying how to fetch them, exit 2), the GPU
     (none visible: one line, exit 2), compute-sanitizer, and every step's arguments parsed by kernelbot's own CLI;
  1. smoke (50 s): CUDA starts inside the sandbox, in a job's own process and in forked runners, and
     compute-sanitizer reaches the job it launches (smoke.py); when CUDA does not start, the later steps are skipped;
  2. verify a correct and a racy Triton RMSNorm (gpu_check/*.py) on the GPU, each under compute-sanitizer, side by
     side (150 s);
  3. `kernelbot optimize --device cuda --dtype bfloat16` on the built-in model with Triton candidates (250 s);
  4. OUTDIR gets smoke.json, report.json, verdict_correct.json, verdict_racy.json, optimize_log.txt, gpu_check.log
     and summary.json (steps, versions, GPU state, each expectation met or not, and figures reported beside them:
     the CUDA-graph comparison), summary.json rewritten after every step. Exit 0: every expectation met; 1: one was
     not, or a step failed; 2: the node cannot run the check (no GPU, missing modules).

Python packages the node lacks (on the H200 image: pydantic and its parts, pysimdjson) travel as wheels: fetch them
where an index is reachable with `python3 benchmarks/gpu_check/fetch_wheels.py DIR --python-version 3.12`, then give
the folder with --wheels (or KERNELBOT_WHEELS). `--dry-run` walks every step on a CPU: the preflight for real, each
step's process through stub_step.py (no GPU call), the summary and expectations as a real run writes them.
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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # fetch_wheels beside this file, whatever PYTHONSAFEPATH says
from fetch_wheels import missing as wheels_missing  # noqa: E402

PARTS = ("agent", "profiler", "sandbox", "kernel_library", "engine")  # pyproject's package-dir: kernelbot.<part>
REQUIRED = ("kernelbot.cli", "kernelbot.agent.optimize", "kernelbot.agent.verify.run",
            "kernelbot.agent.verify.sanitizer", "torch", "triton", "transformers", "pydantic", "simdjson", "pandas",
            "rich")
FROM_WHEELS = ("pydantic", "simdjson")  # what fetch_wheels.py brings; kernelbot's modules import once they are there
OPTIONAL = ("pynvml",)  # GPU clocks and throttling beside the timings
SMOKE_S = 50  # H200 node, 2026-12-04: the bench job of three side by side took 15.4 s
VERIFY_S = 150  # the two verifications run side by side
OPTIMIZE_S = 250
BUDGET_S = SMOKE_S + VERIFY_S + OPTIMIZE_S  # 7.5 minutes of steps at worst
JOB_S = 60  # one sandboxed candidate job; compute-sanitizer's four tools share as much again
PREFLIGHT_S = 60
OUTPUTS = ("smoke.json", "report.json", "verdict_correct.json", "verdict_racy.json", "optimize_log.txt",
           "gpu_check.log", "summary.json")
FETCH = "python3 benchmarks/gpu_check/fetch_wheels.py DIR --python-version {version}"
# the checks compute-sanitizer's tools answer (memcheck; racecheck and synccheck; initcheck): each must say it ran
SANITIZED = ("out_of_bounds", "race", "unwritten_output")

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

# Every kernelbot step's arguments, parsed by kernelbot's own CLI without running it: {step: the error}.
PARSES = r"""
import contextlib, io, json, sys
from kernelbot.cli import build_parser
problems = {}
for name, args in json.loads(sys.argv[1]).items():
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            build_parser().parse_args(args)
    except SystemExit as exc:
        if exc.code:
            problems[name] = (err.getvalue().strip().splitlines() or [f"exit {exc.code}"])[-1]
print(json.dumps(problems))
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
    error: str = ""  # the step could not be started


@dataclass
class Expectation:
    what: str
    met: bool
    detail: str


@dataclass
class Figure:
    """Reported beside the expectations, never part of the exit code."""
    what: str
    detail: str


@dataclass
class Summary:
    ok: bool
    dry_run: bool
    budget_s: int = BUDGET_S
    steps_s: float = 0.0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    probe: dict = field(default_factory=dict)
    plan: list[str] = field(default_factory=list)
    steps: list[Outcome] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    expectations: list[Expectation] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    gpu_after: dict | None = None
    finished: bool = False  # every step ran or was skipped, and the summary is final


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


def plan(python: str, work: Path, outdir: Path) -> list[list[Step]]:
    """The steps in batches: batches one after another, the steps of a batch side by side."""
    cli = [python, "-m", "kernelbot.cli"]
    verify = [*cli, "verify", str(HERE / "reference.py")]
    flags = ["--device", "cuda", "--json", "--seed", "1", "--timeout", str(JOB_S)]
    return [
        [Step("smoke", [python, str(HERE / "smoke.py"), str(outdir / "smoke.json"), "--budget", str(SMOKE_S - 8)],
              SMOKE_S)],  # its jobs' limit leaves time to start Python and torch and to write smoke.json
        [Step("verify_correct", [*verify, str(HERE / "correct_triton.py"), *flags, "--workdir",
                                 str(work / "verify_correct")], VERIFY_S, "verdict_correct.json"),
         Step("verify_racy", [*verify, str(HERE / "racy_triton.py"), *flags, "--workdir", str(work / "verify_racy")],
              VERIFY_S, "verdict_racy.json")],
        [Step("optimize", [*cli, "optimize", "--device", "cuda", "--dtype", "bfloat16", "--model", "llama-tiny",
                           "--run-dir", str(work / "run"), "--iterations", "1", "--max-tasks", "2",
                           "--max-task-minutes", "1.5", "--budget-hours", f"{(OPTIMIZE_S - 60) / 3600:.4f}",
                           "--rounds", "3", "--timeout", str(JOB_S), "--no-compile", "--no-store"], OPTIMIZE_S)],
    ]


def stubbed(batches: list[list[Step]], python: str, work: Path, outdir: Path) -> list[list[Step]]:
    """The dry run's steps: the same names, limits and outputs, each process stub_step.py instead of a GPU."""
    stub = [python, str(HERE / "stub_step.py")]
    args = {"smoke": ["smoke", str(outdir / "smoke.json")], "verify_correct": ["verify", "correct"],
            "verify_racy": ["verify", "racy"], "optimize": ["optimize", str(work / "run")]}
    return [[replace(s, argv=[*stub, *args[s.name]]) for s in batch] for batch in batches]


class Log:
    """Everything the check prints, to the console and to OUTDIR/gpu_check.log."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_text("")

    def __call__(self, message: str) -> None:
        print(message, flush=True)
        with open(self.path, "a") as f:
            f.write(message + "\n")


def run_quiet(cmd: list[str], env: dict[str, str] | None, cwd: Path | None, timeout: float
              ) -> subprocess.CompletedProcess | str:
    """The finished process, or a line saying why there is none (it ran past `timeout`, or could not start)."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        return f"`{shlex.join(cmd)[:200]}` took more than {timeout:.0f} s"
    except OSError as exc:
        return f"`{shlex.join(cmd)[:200]}` could not start: {exc}"


def probe(python: str, env: dict[str, str], work: Path) -> dict:
    proc = run_quiet([python, "-c", PROBE, ",".join(REQUIRED + OPTIONAL)], env, work, PREFLIGHT_S)
    if isinstance(proc, str):
        return {"probe_error": proc}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"probe_error": (proc.stderr or proc.stdout)[-500:]}


def install_wheels(python: str, wheels: Path, target: Path, log: Log) -> str | None:
    """Install every wheel in `wheels` into `target` with no index; None when done, else why not (one line)."""
    cmd = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target", str(target),
           *map(str, sorted(wheels.glob("*.whl")))]
    log("$ " + shlex.join(cmd))
    proc = run_quiet(cmd, None, None, PREFLIGHT_S)
    if isinstance(proc, str):
        return proc
    if proc.returncode:
        log(proc.stderr[-1000:])
        return f"pip could not install the wheels in {wheels}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


def missing_modules(info: dict) -> list[str]:
    return [m for m in REQUIRED if (info.get("imports") or {}).get(m)]


def wheel_problem(python: str, info: dict, missing: list[str], wheels: Path | None) -> str:
    """One line: what does not import, and how to bring it."""
    version = ".".join(str(info.get("python", "3.12")).split(".")[:2])
    fetch = FETCH.format(version=version)
    if wheels is None:
        return (f"{', '.join(missing)} do not import under {python} (Python {version}): fetch the wheels where an "
                f"index is reachable with `{fetch}`, then pass --wheels DIR")
    absent = wheels_missing(wheels, version)
    if absent:
        return (f"--wheels {wheels} lacks {', '.join(absent)} for Python {version}: fetch them with `{fetch}` and "
                "pass that folder")
    return f"{', '.join(missing)} still do not import under {python} with the wheels from {wheels}: {info['imports']}"


def with_wheels(python: str, env: dict[str, str], work: Path, wheels: Path | None, log: Log, info: dict
                ) -> tuple[dict, str | None]:
    """The probe after installing the wheels (when modules are missing and wheels are given), and the problem that
    remains, if any."""
    missing = missing_modules(info)
    if not missing:
        return info, None
    if any(m.split(".")[0] not in (*FROM_WHEELS, "kernelbot") for m in missing):
        return info, (f"{', '.join(missing)} do not import under {python}: the check runs on the node's own torch, "
                      "Triton and transformers; set PYTHON to the node's Python")
    if wheels is not None and not wheels_missing(wheels, ".".join(str(info.get("python", "")).split(".")[:2])):
        problem = install_wheels(python, wheels, work / "wheels_site", log)
        if problem:
            return info, problem
        env["PYTHONPATH"] = f"{env['PYTHONPATH']}{os.pathsep}{work / 'wheels_site'}"
        info = probe(python, env, work)
        missing = missing_modules(info)
    return info, (wheel_problem(python, info, missing, wheels) if missing else None)


def argv_problems(python: str, env: dict[str, str], work: Path, batches: list[list[Step]]) -> list[str]:
    """Each kernelbot step's arguments as kernelbot's CLI parses them: an option it lacks is a problem now, not after
    minutes on the node."""
    cli = {s.name: s.argv[3:] for batch in batches for s in batch if s.argv[1:3] == ["-m", "kernelbot.cli"]}
    proc = run_quiet([python, "-c", PARSES, json.dumps(cli)], env, work, PREFLIGHT_S)
    if isinstance(proc, str):
        return [proc]
    try:
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return [f"kernelbot's CLI could not parse the steps' arguments: {(proc.stderr or proc.stdout)[-300:]}"]
    return [f"step {name}: kernelbot refuses its arguments ({error}); change plan() in driver.py or the CLI"
            for name, error in found.items()]


def preflight(python: str, env: dict[str, str], site: Path, work: Path, wheels: Path | None, log: Log,
              summary: Summary, batches: list[list[Step]]) -> None:
    """Fills summary.probe, .problems and .notes; installs the wheels when modules are missing and some are given."""
    info = probe(python, env, work)
    if "probe_error" in info and not info.get("imports"):
        summary.probe = info
        summary.problems.append(f"{python} could not run the import probe: {info['probe_error']}")
        return
    info, problem = with_wheels(python, env, work, wheels, log, info)
    summary.probe = info
    if problem:
        summary.problems.append(problem)
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
    summary.problems += argv_problems(python, env, work, batches)


def run_together(steps: list[Step], env: dict[str, str], outdir: Path, work: Path, log: Log) -> list[Outcome]:
    """The steps side by side, each in its own process group, stopped at its limit."""
    running = []
    for step in steps:
        log(f"$ {shlex.join(step.argv)}")
        out = open(outdir / (step.stdout or f".{step.name}.out"), "w")
        err = open(outdir / f".{step.name}.err", "w")
        try:
            proc = subprocess.Popen(step.argv, stdout=out, stderr=err, env=env, start_new_session=True, cwd=work)
        except OSError as exc:
            proc = f"could not start: {exc}"
        running.append((step, proc, time.monotonic(), out, err))
    return [_finish(step, proc, t0, out, err, outdir, log) for step, proc, t0, out, err in running]


def _finish(step: Step, proc: subprocess.Popen | str, t0: float, out: Any, err: Any, outdir: Path, log: Log
            ) -> Outcome:
    timed_out = False
    if not isinstance(proc, str):
        try:
            proc.wait(timeout=max(1.0, step.timeout_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out.close()
    err.close()
    seconds = round(time.monotonic() - t0, 1)
    outcome = Outcome(step.name, None if isinstance(proc, str) else proc.returncode, seconds, timed_out,
                      proc if isinstance(proc, str) else "")
    log(f"[{step.name}] exit {outcome.returncode}{' (timed out)' if timed_out else ''}{outcome.error} after "
        f"{seconds} s (limit {step.timeout_s} s)")
    for name in ([] if step.stdout else [f".{step.name}.out"]) + [f".{step.name}.err"]:
        text = (outdir / name).read_text(errors="replace")
        (outdir / name).unlink()
        if text.strip():
            log(f"[{step.name} {'stderr' if name.endswith('.err') else 'stdout'}]\n{text.rstrip()[-20000:]}")
    return outcome


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def smoke_expectations(outdir: Path) -> list[Expectation]:
    smoke = _read_json(outdir / "smoke.json")
    if not isinstance(smoke, dict):
        return [Expectation("the smoke step ran (CUDA in the sandbox, compute-sanitizer)", False, "no smoke.json")]
    return [Expectation(run["what"], run["ok"], f"{run['seconds']} s: {run['detail']}") for run in smoke["runs"]]


def cuda_fails(outdir: Path) -> bool:
    """The smoke step showed CUDA does not start in the sandbox. A smoke step that said nothing (it overran) stops
    nothing: the later steps still run and show what works."""
    smoke = _read_json(outdir / "smoke.json")
    return isinstance(smoke, dict) and smoke.get("cuda_ok") is False


def verify_expectations(outdir: Path) -> list[Expectation]:
    found = []
    correct, racy = _read_json(outdir / "verdict_correct.json"), _read_json(outdir / "verdict_racy.json")
    if correct is None:
        found.append(Expectation("the correct Triton kernel passes verification", False, "no verdict written"))
    else:
        checks = {c["id"]: c for c in correct["checks"]}
        sanitized = [checks.get(cid, {"id": cid, "status": "absent", "detail": ""}) for cid in SANITIZED]
        found.append(Expectation("the correct Triton kernel passes verification", correct["verdict"] == "pass",
                                 f"failed: {correct['failed'] or 'none'}"))
        found.append(Expectation("compute-sanitizer ran on it (memcheck, racecheck, synccheck, initcheck)",
                                 all(c["status"] == "pass" and "compute-sanitizer" in c["detail"] for c in sanitized),
                                 "; ".join(f"{c['id']} {c['status']}: {c['detail'][:160] or 'no compute-sanitizer'}"
                                           for c in sanitized)))
    if racy is None:
        found.append(Expectation("the racy Triton kernel fails verification", False, "no verdict written"))
    else:
        flagged = [c for c in racy["checks"] if c["status"] == "fail"]
        found.append(Expectation("the racy Triton kernel fails verification", racy["verdict"] == "fail",
                                 "; ".join(f"{c['id']}: {c['detail'][:160]}" for c in flagged) or "nothing failed"))
    return found


def optimize_expectations(outdir: Path) -> tuple[list[Expectation], list[Figure]]:
    report = _read_json(outdir / "report.json")
    if report is None:
        return [Expectation("optimize wrote report.json", False, "no report.json: see optimize_log.txt and "
                                                                  "gpu_check.log")], []
    triton = [k for k in report["kernels"] if k["backend"] == "triton"]
    accepted = [k for k in triton if k["status"] == "accepted"]
    fid = report.get("fidelity") or {}
    found = [
        Expectation("optimize ran the built-in model in bf16 on the GPU",
                    report["device"]["kind"] == "cuda" and report["model"]["dtype"] == "bfloat16",
                    f"{report['device']['name']}, {report['model']['dtype']}; {report['speedup']}x over eager "
                    f"({report['baseline_ms']} → {report['optimized_ms']} ms)"),
        Expectation("Triton candidates were verified and timed there", bool(triton),
                    f"{len(triton)} Triton candidates, {len(accepted)} accepted: "
                    + "; ".join(f"{k['op']} {k['status']}: {k['reason'][:120]}" for k in triton)),
        Expectation("the pack's fidelity passed", bool(fid.get("passed")), json.dumps(fid)[:600]),
    ]
    graphs = report.get("graph_decode_ms")
    times = (f"eager {report['baseline_ms']} ms, kernelbot {report['optimized_ms']} ms, CUDA-graph decode {graphs} ms, "
             f"torch.compile {report.get('compiled_ms')} ms")
    figures = [
        Figure("CUDA-graph decode, captured, checked and timed in the same rounds", times if graphs else
               "; ".join(n for n in report["notes"] if "CUDA-graph" in n) or "no graph baseline; no note says why"),
        Figure("goal (issue 16): kernelbot at least 1.3x over eager and not slower than CUDA-graph decode",
               f"{'met' if graphs and report['speedup'] >= 1.3 and report['optimized_ms'] <= graphs else 'not met'}: "
               f"{times}"),
    ]
    return found, figures


def write_summary(outdir: Path, summary: Summary) -> None:
    (outdir / "summary.json").write_text(json.dumps(asdict(summary), indent=2))


def _after_batch(batch: list[Step], outdir: Path, work: Path, summary: Summary) -> None:
    names = {s.name for s in batch}
    if "smoke" in names:
        summary.expectations += smoke_expectations(outdir)
    if "verify_correct" in names:
        summary.expectations += verify_expectations(outdir)
    if "optimize" in names:
        run = work / "run"
        for source, target in ((run / "report.json", "report.json"), (run / "log.txt", "optimize_log.txt")):
            if source.is_file():
                shutil.copyfile(source, outdir / target)
        found, figures = optimize_expectations(outdir)
        summary.expectations += found
        summary.figures += figures


def run_batches(batches: list[list[Step]], env: dict[str, str], outdir: Path, work: Path, log: Log,
                summary: Summary) -> None:
    """Batch after batch, summary.json rewritten after each; after a smoke step that shows CUDA cannot start in the
    sandbox, the rest is skipped (each skipped step's expectations unmet, saying why)."""
    t0 = time.monotonic()
    for i, batch in enumerate(batches):
        summary.steps += run_together(batch, env, outdir, work, log)
        _after_batch(batch, outdir, work, summary)
        summary.steps_s = round(time.monotonic() - t0, 1)
        write_summary(outdir, summary)
        if any(s.name == "smoke" for s in batch) and cuda_fails(outdir):
            rest = [s.name for later in batches[i + 1:] for s in later]
            summary.skipped = rest
            summary.expectations += [Expectation(f"{name} ran", False, "skipped: the smoke step showed CUDA does "
                                                 "not start in the sandbox (smoke.json)") for name in rest]
            break


def _check_outdir(outdir: Path) -> str | None:
    try:
        outdir.mkdir(parents=True, exist_ok=True)
        probe_file = outdir / ".write_test"
        probe_file.write_text("")
        probe_file.unlink()
    except OSError as exc:
        return f"OUTDIR {outdir} is not writable ({exc}); pass a folder you can write"
    return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--dry-run", action="store_true",
                        help="on a CPU: the preflight, then every step through its stub (stub_step.py)")
    parser.add_argument("--wheels", type=Path, default=os.environ.get("KERNELBOT_WHEELS") or None,
                        help="folder of wheels for modules the node lacks (fetch_wheels.py; installed with --no-index)")
    parser.add_argument("--python", default=os.environ.get("PYTHON", "python3"), help="the node's Python")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new temporary one)")
    return parser


def _environment(site: Path) -> dict[str, str]:
    # Every process starts in `work`, with PYTHONSAFEPATH: `python -m`/`-c` put the working directory first on
    # sys.path, and from the checkout's root its kernelbot/ (which holds none of the parts) would shadow the copy.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "PYTHONUNBUFFERED": "1", "PYTHONSAFEPATH": "1"}
    env.pop("TRITON_INTERPRET", None)  # Triton compiles for the GPU here
    return env


def _report(summary: Summary, log: Log) -> None:
    for e in summary.expectations:
        log(f"{'MET  ' if e.met else 'UNMET'} {e.what}: {e.detail}")
    for f in summary.figures:
        log(f"FIGURE {f.what}: {f.detail}")
    log(f"gpu_check: {'all expectations met' if summary.ok else 'NOT all expectations met'} in {summary.steps_s:.0f} s "
        f"of steps (budget {summary.budget_s} s)")


def check(args: argparse.Namespace, outdir: Path, work: Path, log: Log, summary: Summary) -> int:
    """Preflight, then the steps (their stubs in a dry run); summary.json written after each stage."""
    if summary.problems:
        write_summary(outdir, summary)
        print(f"gpu_check: {summary.problems[0]}", file=sys.stderr)
        return 2
    batches = plan(args.python, work, outdir)
    summary.plan = [f"{s.name} (≤ {s.timeout_s} s): {shlex.join(s.argv)}" for batch in batches for s in batch]
    site = make_site(ROOT, work / "site")
    env = _environment(site)
    log(f"gpu_check: checkout {ROOT}, work {work}, outdir {outdir}, PYTHONPATH {env['PYTHONPATH']}")
    preflight(args.python, env, site, work, args.wheels, log, summary, batches)
    for note in summary.notes:
        log(f"note: {note}")
    for problem in summary.problems:
        log(f"problem: {problem}")
    write_summary(outdir, summary)
    if summary.problems:
        print(f"gpu_check: {summary.problems[0]}", file=sys.stderr)
        return 1 if args.dry_run else 2
    if args.dry_run:
        log("dry run: the steps a real run takes, in this order (steps of a batch side by side), each through its stub")
        for line in summary.plan:
            log(f"  {line}")
        batches = stubbed(batches, args.python, work, outdir)
    run_batches(batches, env, outdir, work, log, summary)
    summary.gpu_after = None if args.dry_run else probe(args.python, env, work).get("gpu_state")
    summary.ok = all(e.met for e in summary.expectations) and all(
        not o.timed_out and o.returncode in (0, 1) for o in summary.steps)
    summary.finished = True
    _report(summary, log)
    write_summary(outdir, summary)
    return 0 if summary.ok else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    problem = _check_outdir(args.outdir)
    if problem:
        print(f"gpu_check: {problem}", file=sys.stderr)
        return 2
    outdir = args.outdir.resolve()
    work = (args.work or Path(tempfile.mkdtemp(prefix="kb_gpu_check_"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    log = Log(outdir / "gpu_check.log")
    summary = Summary(ok=False, dry_run=args.dry_run)
    summary.problems += [f"{HERE / n} is missing" for n in ("reference.py", "correct_triton.py", "racy_triton.py",
                                                           "smoke.py", "stub_step.py") if not (HERE / n).is_file()]
    return check(args, outdir, work, log, summary)


if __name__ == "__main__":
    sys.exit(main())
