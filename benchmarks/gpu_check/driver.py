"""The GPU check's steps (benchmarks/gpu_check.sh runs this): one GPU node, at most 6 minutes of device time in the
worst case (LIMIT_S: every step's limit, the preflight and the final GPU reading included), nothing downloaded.

  0. preflight (30 s): kernelbot from this checkout (copied as installed, on PYTHONPATH: no pip, no build), its imports
     under the node's own Python, torch and Triton (missing wheels: one line saying how to fetch them, exit 2), the GPU
     (none visible: one line, exit 2), compute-sanitizer, Triton's interpreter on the node's CPU (where it does not
     run, the one expectation it answers is said to be unmet, and no other), and every step's arguments parsed by
     kernelbot's own CLI;
  1. smoke (35 s): CUDA starts inside the sandbox, in a job's own process and in forked runners, and
     compute-sanitizer reaches the job it launches (smoke.py); when CUDA does not start, the later steps are skipped;
  2. verify a correct and a racy Triton RMSNorm (gpu_check/*.py) on the GPU, each under compute-sanitizer and again
     in the interpreter on the node's CPU, side by side (105 s: three jobs of JOB_S and the parent's own work);
  3. `kernelbot optimize --device cuda --dtype bfloat16` on the built-in model with Triton candidates (170 s: it
     starts no candidate after OPTIMIZE_BUDGET_S, and one candidate's jobs take at most CANDIDATE_S);
  4. the GPU's state read once more (15 s);
  OUTDIR gets smoke.json, report.json, verdict_correct.json, verdict_racy.json, optimize_log.txt, gpu_check.log
  and summary.json (steps, limits, versions, GPU state, each expectation met or not, and figures reported beside
  them: the CUDA-graph comparison), summary.json rewritten after every step and when the check is stopped (SIGTERM,
  SIGINT). A step past its limit is killed with every process it started, those in sessions of their own included.
  Exit 0: every expectation met; 1: one was not, or a step failed; 2: the node cannot run the check (no GPU, missing
  modules).

Python packages the node lacks (on the H200 image: pydantic and its parts, pysimdjson) travel as wheels: fetch them
where an index is reachable with `python3 benchmarks/gpu_check/fetch_wheels.py DIR --python-version 3.12`, then give
the folder with --wheels (or KERNELBOT_WHEELS). `--dry-run` walks every step on a CPU: the preflight for real, each
step's process through stub_step.py (no GPU call), the summary and expectations as a real run writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # fetch_wheels beside this file, whatever PYTHONSAFEPATH says
from fetch_wheels import missing as wheels_missing  # noqa: E402

PARTS = tuple(re.findall(r'"kernelbot\.(\w+)" = "\w+"', (ROOT / "pyproject.toml").read_text()))  # package-dir
REQUIRED = ("kernelbot.cli", "kernelbot.agent.optimize", "kernelbot.agent.verify.run",
            "kernelbot.agent.verify.sanitizer", "torch", "triton", "transformers", "pydantic", "simdjson", "pandas",
            "rich")
FROM_WHEELS = ("pydantic", "simdjson")  # what fetch_wheels.py brings; kernelbot's modules import once they are there
OPTIONAL = ("pynvml",)  # GPU clocks and throttling beside the timings
LIMIT_S = 360  # the whole check, worst case: 6 minutes of a 15-minute device lease that includes start-up
PREFLIGHT_S = 30  # every probe of the preflight together
SMOKE_S = 35  # H200 node, 2026-12-04: the bench job of three side by side took 15.4 s
JOB_S = 25  # one sandboxed candidate job; compute-sanitizer's four tools share as much again, and the interpreter's
# job on the node's CPU (no C++ library built for it) has as much again
VERIFY_S = 3 * JOB_S + 30  # the two verifications side by side; 30 s: the parent's references, plan and start-up
CANDIDATE_S = 4 * JOB_S  # an optimize candidate at worst: its GPU job, the sanitizers, the interpreter's, its benchmark
TAIL_S = 30  # optimize's work after its last candidate: the pack measured end to end, the report
OPTIMIZE_S = 170
OPTIMIZE_BUDGET_S = OPTIMIZE_S - CANDIDATE_S - TAIL_S  # optimize starts no candidate after this (--budget-hours)
GPU_AFTER_S = 15  # the GPU's state read after the steps
OUTPUTS = ("smoke.json", "report.json", "verdict_correct.json", "verdict_racy.json", "optimize_log.txt",
           "gpu_check.log", "summary.json")
FETCH = "python3 benchmarks/gpu_check/fetch_wheels.py DIR --python-version {version}"
SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")  # each must have run on the correct kernel
INTERPRETED = "the Triton interpreter on the node's CPU checked the correct kernel's races between programs"
SANITIZER_RAN = "compute-sanitizer ran on it (memcheck, racecheck, synccheck, initcheck)"
# its race is in global memory, which racecheck (shared memory) does not watch: on the GPU the programs run together and
# read each other's sums, or the scratch slot before any program wrote it (the verifier fills allocations with NaN)
RACY_CAUGHT = "the racy Triton kernel fails correctness on the GPU (every program shares one NaN-filled scratch slot)"

# Triton's interpreter on the node's CPU: the GPU verdicts' race check between programs runs there (the README
# records Triton 3.6 with numpy 2.4 failing it)
INTERPRETER_PROBE = """
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch
import triton
import triton.language as tl


@triton.jit
def _double(x, y, n, B: tl.constexpr):
    o = tl.arange(0, B)
    tl.store(y + o, tl.load(x + o, mask=o < n) * 2, mask=o < n)


x = torch.arange(8, dtype=torch.float32)
y = torch.empty_like(x)
_double[(1,)](x, y, 8, B=8)
assert torch.equal(y, x * 2), f"wrong result: {y.tolist()}"
"""

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
    from kernelbot.hardware.device import gpu_missing_reason, pick_device
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
class StepLimit:
    """A stage of the check and the most device time it may take (the steps of a batch share theirs)."""
    name: str
    limit_s: int


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
    budget_s: int = LIMIT_S
    limits: list[StepLimit] = field(default_factory=list)
    worst_case_s: int = 0  # the limits summed: what the check may take at most
    steps_s: float = 0.0
    interpreter_problem: str = ""  # why Triton's interpreter does not run on the node's CPU ("" where it does)
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
                           "--max-task-minutes", "1.5", "--budget-hours", f"{OPTIMIZE_BUDGET_S / 3600:.4f}",
                           "--rounds", "3", "--timeout", str(JOB_S), "--no-compile", "--no-store"], OPTIMIZE_S)],
    ]


def limits(batches: list[list[Step]]) -> list[StepLimit]:
    """Every stage's worst case, in order: the preflight, each batch (its steps side by side share the longest
    limit), the final GPU reading."""
    return [StepLimit("preflight", PREFLIGHT_S),
            *[StepLimit("+".join(s.name for s in batch), max(s.timeout_s for s in batch)) for batch in batches],
            StepLimit("gpu_after", GPU_AFTER_S)]


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


def probe(python: str, env: dict[str, str], work: Path, timeout: float) -> dict:
    proc = run_quiet([python, "-c", PROBE, ",".join(REQUIRED + OPTIONAL)], env, work, timeout)
    if isinstance(proc, str):
        return {"probe_error": proc}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"probe_error": (proc.stderr or proc.stdout)[-500:]}


def install_wheels(python: str, wheels: Path, target: Path, log: Log, timeout: float) -> str | None:
    """Install every wheel in `wheels` into `target` with no index; None when done, else why not (one line)."""
    cmd = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target", str(target),
           *map(str, sorted(wheels.glob("*.whl")))]
    log("$ " + shlex.join(cmd))
    proc = run_quiet(cmd, None, None, timeout)
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


def with_wheels(python: str, env: dict[str, str], work: Path, wheels: Path | None, log: Log, info: dict,
                left: Callable[[], float]) -> tuple[dict, str | None]:
    """The probe after installing the wheels (when modules are missing and wheels are given), and the problem that
    remains, if any."""
    missing = missing_modules(info)
    if not missing:
        return info, None
    if any(m.split(".")[0] not in (*FROM_WHEELS, "kernelbot") for m in missing):
        return info, (f"{', '.join(missing)} do not import under {python}: the check runs on the node's own torch, "
                      "Triton and transformers; set PYTHON to the node's Python")
    if wheels is not None and not wheels_missing(wheels, ".".join(str(info.get("python", "")).split(".")[:2])):
        problem = install_wheels(python, wheels, work / "wheels_site", log, left())
        if problem:
            return info, problem
        env["PYTHONPATH"] = f"{env['PYTHONPATH']}{os.pathsep}{work / 'wheels_site'}"
        info = probe(python, env, work, left())
        missing = missing_modules(info)
    return info, (wheel_problem(python, info, missing, wheels) if missing else None)


def argv_problems(python: str, env: dict[str, str], work: Path, batches: list[list[Step]], timeout: float
                  ) -> list[str]:
    """Each kernelbot step's arguments as kernelbot's CLI parses them: an option it lacks is a problem now, not after
    minutes on the node."""
    cli = {s.name: s.argv[3:] for batch in batches for s in batch if s.argv[1:3] == ["-m", "kernelbot.cli"]}
    proc = run_quiet([python, "-c", PARSES, json.dumps(cli)], env, work, timeout)
    if isinstance(proc, str):
        return [proc]
    try:
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return [f"kernelbot's CLI could not parse the steps' arguments: {(proc.stderr or proc.stdout)[-300:]}"]
    return [f"step {name}: kernelbot refuses its arguments ({error}); change plan() in driver.py or the CLI"
            for name, error in found.items()]


def interpreter_problem(python: str, env: dict[str, str], work: Path, timeout: float) -> str:
    """Why Triton's interpreter does not run a small kernel under the node's Python ("" where it does)."""
    script = work / "interpreter_probe.py"
    script.write_text(INTERPRETER_PROBE)
    proc = run_quiet([python, str(script)], env, work, timeout)
    if isinstance(proc, str):
        return proc
    if proc.returncode:
        return (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:300]
    return ""


def preflight(python: str, env: dict[str, str], site: Path, work: Path, wheels: Path | None, log: Log,
              summary: Summary, batches: list[list[Step]]) -> None:
    """Fills summary.probe, .problems, .notes and .interpreter_problem, within PREFLIGHT_S; installs the wheels when
    modules are missing and some are given."""
    deadline = time.monotonic() + PREFLIGHT_S

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    info = probe(python, env, work, left())
    if "probe_error" in info and not info.get("imports"):
        summary.probe = info
        summary.problems.append(f"{python} could not run the import probe: {info['probe_error']}")
        return
    info, problem = with_wheels(python, env, work, wheels, log, info, left)
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
    summary.interpreter_problem = interpreter_problem(python, env, work, left())
    if summary.interpreter_problem:
        summary.notes.append(f"Triton's interpreter does not run here ({summary.interpreter_problem}): the verdicts' "
                             f"race check between Triton programs stays not_run, so '{INTERPRETED}' will be unmet; "
                             "no other expectation depends on it")
    summary.problems += argv_problems(python, env, work, batches, left())
    if time.monotonic() > deadline:
        summary.problems.append(f"the preflight took more than its {PREFLIGHT_S} s")


class Stopped(Exception):
    """The check was told to stop (SIGTERM, SIGINT): its running steps are killed and the summary written."""


def _stop(signum: int, _frame: Any) -> None:
    raise Stopped(signal.Signals(signum).name)


def _descendants(pid: int) -> list[int]:
    """Every process below `pid`, whatever session or process group it moved to (a sandboxed job starts a session of
    its own), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(proc: subprocess.Popen) -> None:
    """A step and every process it started: all stopped first (none can start another, nor be reparented out of
    sight when its parent dies), the tree read again for any started meanwhile, then all killed."""
    stopped: list[int] = []
    for _ in range(3):
        found = [p for p in [proc.pid, *_descendants(proc.pid)] if p not in stopped]
        if not found:
            break
        _signal_all(found, signal.SIGSTOP)
        stopped += found
    _signal_all(stopped, signal.SIGKILL)
    proc.wait()


def run_together(steps: list[Step], env: dict[str, str], outdir: Path, work: Path, log: Log) -> list[Outcome]:
    """The steps side by side, each in its own process group, each stopped at its limit with every process it started;
    when the check is stopped, every running step is killed the same way before the stop goes on."""
    running = []
    try:
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
    except Stopped:
        for _, proc, _, _, _ in running:
            if not isinstance(proc, str) and proc.poll() is None:
                kill_tree(proc)
        raise


def _finish(step: Step, proc: subprocess.Popen | str, t0: float, out: Any, err: Any, outdir: Path, log: Log
            ) -> Outcome:
    timed_out = False
    if not isinstance(proc, str):
        try:
            proc.wait(timeout=max(1.0, step.timeout_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(proc)
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


def verify_expectations(outdir: Path, interpreter_problem: str = "") -> list[Expectation]:
    """From the two verdicts' typed fields: the correct kernel passes, every compute-sanitizer tool ran on it, the
    interpreter on the node's CPU checked it (unmet, and nothing else, where the preflight found the interpreter does
    not run), and the racy kernel fails correctness on the GPU."""
    found = []
    correct, racy = _read_json(outdir / "verdict_correct.json"), _read_json(outdir / "verdict_racy.json")
    if correct is None:
        found += [Expectation(what, False, "no verdict written") for what in (
            "the correct Triton kernel passes verification", SANITIZER_RAN, INTERPRETED)]
    else:
        runs = {r["tool"]: r for r in correct.get("sanitizer_runs", [])}
        found.append(Expectation("the correct Triton kernel passes verification", correct["verdict"] == "pass",
                                 f"failed: {correct['failed'] or 'none'}"))
        found.append(Expectation(SANITIZER_RAN, all(runs.get(t, {}).get("ran") for t in SANITIZER_TOOLS),
                                 "; ".join(f"{t}: " + ("ran" if runs.get(t, {}).get("ran") else "did not run")
                                           for t in SANITIZER_TOOLS)))
        coverage = correct.get("interpreter_race")
        race = next((c for c in correct["checks"] if c["id"] == "race"), {"detail": ""})
        why = f"; the preflight found it does not run here: {interpreter_problem}" if interpreter_problem else ""
        found.append(Expectation(INTERPRETED, coverage == "checked",
                                 f"{coverage or 'no interpreter job'}: {race['detail'][-300:]}{why}"))
    if racy is None:
        found.append(Expectation(RACY_CAUGHT, False, "no verdict written"))
    else:
        flagged = [c for c in racy["checks"] if c["status"] == "fail"]
        found.append(Expectation(RACY_CAUGHT, "correctness" in racy["failed"],
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
        summary.expectations += verify_expectations(outdir, summary.interpreter_problem)
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
        f"of steps (worst case {summary.worst_case_s} s of {summary.budget_s} s)")


def check(args: argparse.Namespace, outdir: Path, work: Path, log: Log, summary: Summary) -> int:
    """Preflight, then the steps (their stubs in a dry run); summary.json written after each stage, and when the check
    is stopped."""
    if summary.problems:
        write_summary(outdir, summary)
        print(f"gpu_check: {summary.problems[0]}", file=sys.stderr)
        return 2
    batches = plan(args.python, work, outdir)
    summary.plan = [f"{s.name} (≤ {s.timeout_s} s): {shlex.join(s.argv)}" for batch in batches for s in batch]
    summary.limits = limits(batches)
    summary.worst_case_s = sum(limit.limit_s for limit in summary.limits)
    log("worst case, stage by stage (steps of a batch side by side): " + ", ".join(
        f"{limit.name} ≤ {limit.limit_s} s" for limit in summary.limits) +
        f"; in all ≤ {summary.worst_case_s} s of {LIMIT_S} s")
    try:
        return _steps(args, batches, outdir, work, log, summary)
    except Stopped as stop:
        summary.problems.append(f"stopped by {stop} after {summary.steps_s:.0f} s of steps: the running steps and "
                                "every process they started were killed")
        write_summary(outdir, summary)
        print(f"gpu_check: {summary.problems[-1]}", file=sys.stderr)
        return 1


def _steps(args: argparse.Namespace, batches: list[list[Step]], outdir: Path, work: Path, log: Log,
           summary: Summary) -> int:
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
    summary.gpu_after = None if args.dry_run else probe(args.python, env, work, GPU_AFTER_S).get("gpu_state")
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
    for sig in (signal.SIGTERM, signal.SIGINT):  # a lease ending, or ^C: the summary is still written
        signal.signal(sig, _stop)
    summary.problems += [f"{HERE / n} is missing" for n in ("reference.py", "correct_triton.py", "racy_triton.py",
                                                           "smoke.py", "stub_step.py") if not (HERE / n).is_file()]
    return check(args, outdir, work, log, summary)


if __name__ == "__main__":
    sys.exit(main())
