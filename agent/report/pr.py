"""`kernelbot pr RUN_DIR`: the run's kernel pack as a git branch (and a patch series) with a description a reviewer
can decide from: per kernel the hotspot and its share, the verification evidence, the benchmark and its noise,
fidelity, and where the code came from (LLM model, tokens, cost)."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelbot import KernelbotError
from kernelbot.records import (
    Bench,
    Candidate,
    EndToEndTimes,
    Hotspot,
    KernelResult,
    Origin,
    Pack,
    Report,
    Verdict,
)


def _host(timings: EndToEndTimes) -> str:
    if timings.host is None:
        return "not read"
    return timings.host.summary() + (" (busy: every ratio is doubtful)" if timings.host.contended else "")


DETAIL = 240  # characters of a check's detail in the description
TOLERANCES = {  # relative L2, absolute (of max|ref|), per element; verify/numerics.py's table, kept torch-free
    "float32": (1e-5, 1e-5, 1e-4), "float16": (1e-3, 1e-3, 5e-3), "bfloat16": (8e-3, 8e-3, 2e-2)}


@dataclass
class PullRequest:
    branch: str
    repo: Path
    description: Path
    patches: list[Path]
    commit: str
    url: str | None = None
    note: str = ""


def _git(repo: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise KernelbotError(f"git {' '.join(args[:2])} failed in {repo}: {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout.strip()


def _read(path: Path, model: type) -> Any:
    try:
        return model.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None


def _spread(xs: list[float]) -> str:
    if len(xs) < 2:
        return f"{len(xs)} round"
    return f"{len(xs)} rounds, min {min(xs):.1f} / max {max(xs):.1f} ms, stdev {statistics.stdev(xs):.1f} ms"


def _provenance(task_dir: Path, cand: Candidate) -> list[str]:
    if cand.origin is Origin.LLM:
        call = json.loads((task_dir / "llm" / f"{cand.config.get('call')}.json").read_text())
        calls = [json.loads(p.read_text()) for p in sorted((task_dir / "llm").glob("c*.json"))]
        return [f"- LLM `{call['model']}` (api base {call.get('api_base') or 'provider default'}), call "
                f"`{call['id']}`, round {call['round']}, sample {call['sample']}: {call['prompt_tokens']} prompt + "
                f"{call['completion_tokens']} completion tokens, ${call['cost_usd']:.4f}"
                f"{'' if call.get('cost_known') else ' (no price known for the model)'}, {call['latency_s']:.1f} s",
                f"- all LLM calls for this task: {len(calls)}, "
                f"{sum(c['prompt_tokens'] + c['completion_tokens'] for c in calls)} tokens, "
                f"${sum(c['cost_usd'] for c in calls):.4f}; prompts and answers in `tasks/{task_dir.name}/llm/`"]
    if cand.origin is Origin.STORE:
        return [f"- reused from the kernel store (first accepted in run {cand.config.get('from_run')}, proposer "
                f"{cand.proposer[6:]}), verified and benchmarked again in this run; no LLM spend"]
    return [f"- built-in proposer (`kernel_library/{cand.task_id.split('-')[1]}`, config `{cand.config}`); "
            "no LLM: 0 tokens, $0"]


def _verification(v: Verdict, dtype: str) -> list[str]:
    tol = TOLERANCES.get(dtype)
    lines = [f"- verdict **{v.verdict}** in {v.seconds:.1f} s, seed {v.seed} (replay: `kernelbot verify "
             f"reference.py candidate.py --seed {v.seed}`)",
             f"- tolerances ({dtype}): " + (f"relative L2 {tol[0]:g}, absolute {tol[1]:g} of max|ref|, per element "
                                            f"{tol[2]:g}, plus 4x the reference's own {dtype} error" if tol else
                                            "exact (integer/boolean outputs)"),
             f"- {len(v.shapes)} input sets: " + "; ".join(v.cases[:12]) + (" …" if len(v.cases) > 12 else ""),
             f"- shapes: {', '.join(str(s) for s in v.shapes[:10])}" + (" …" if len(v.shapes) > 10 else ""),
             "", "| check | result | detail |", "|---|---|---|"]
    for c in v.checks:
        detail = " ".join(c.detail.split())[:DETAIL].replace("|", "/")
        lines.append(f"| {c.id} | {c.status} | {detail} |")
    for check in ("race", "out_of_bounds"):
        found = next((c for c in v.checks if c.id == check), None)
        lines.insert(4, f"- {check.replace('_', ' ')}: {found.status if found else 'not_run'}"
                        f"{' — ' + ' '.join(found.detail.split())[:DETAIL] if found and found.detail else ''}")
    if v.not_run:
        lines.append(f"\nNot run here (never counted as passed): {', '.join(v.not_run)}.")
    if v.protections:
        lines.append(f"\nSandbox protections in force: {'; '.join(v.protections)}.")
    return lines


def _kernel_section(run_dir: Path, row: KernelResult, hotspots: dict[str, Hotspot]) -> list[str]:
    task_id, cand_id = row.candidate_id.split("/", 1)
    task_dir = run_dir / "tasks" / task_id
    cdir = task_dir / "candidates" / cand_id
    cand: Candidate = _read(cdir / "candidate.json", Candidate)
    verdict: Verdict = _read(cdir / "verdict.json", Verdict)
    bench: Bench = _read(cdir / "bench.json", Bench)
    if cand is None or verdict is None or bench is None:
        raise KernelbotError(f"{cdir}: candidate.json, verdict.json or bench.json is missing; resume the run first")
    task = json.loads((task_dir / "task.json").read_text())
    h = hotspots.get(row.hotspot_id or task["hotspot_id"])
    share = row.share if row.share is not None else task["share"]
    target = (f"`{h.module_class}` {h.input_dims} ({', '.join(h.module_paths[:3])}"
              f"{' …' if len(h.module_paths) > 3 else ''}), {h.calls} calls, {h.total_us / 1e3:.1f} ms, headroom "
              f"{h.score_us / 1e3:.1f} ms over a {h.floor_us / 1e3:.2f} ms roofline floor") if h else row.module
    return [
        f"### `{row.candidate_id}` — {row.op} on {row.backend}, {bench.speedup:.2f}x", "",
        f"**Hotspot:** {row.hotspot_id or task['hotspot_id']}: {target}; **share of profiled time {share:.1%}**"
        f" (iteration {row.iteration + 1}).", "",
        f"**Code:** `kernels/{task_id}__{cand_id}.py` (source hash {cand.source_hash}); dtype {task['dtype']}, "
        f"shapes {task['input_shapes']}.", "",
        "**Verification:**", "", *_verification(verdict, task["dtype"]), "",
        "**Benchmark** (candidate vs the replaced op, interleaved paired rounds, medians; noise is (p75 − p25) / "
        "median):", "",
        f"- {bench.rounds} rounds: reference {bench.reference_us:.2f} µs (±{bench.reference_spread:.1%}), kernel "
        f"{bench.candidate_us:.2f} µs (±{bench.candidate_spread:.1%}), speedup {bench.speedup:.3f}x, faster beyond "
        f"noise: {bench.significant}",
        f"- in the end-to-end workload: {row.calls} calls routed to it, {row.fallback_calls} fell back to the "
        "original module", "",
        "**Provenance:**", "", *_provenance(task_dir, cand), "",
    ]


def describe(run_dir: Path) -> tuple[str, str, Report, Pack]:
    """(title, markdown description, report, pack) for a finished run."""
    report: Report = _read(run_dir / "report.json", Report)
    pack: Pack = _read(run_dir / "pack" / "manifest.json", Pack)
    if report is None or pack is None:
        raise KernelbotError(f"{run_dir}: no report.json or pack/manifest.json; finish the run first "
                             f"(kernelbot optimize --resume {run_dir})")
    accepted = [k for k in report.kernels if k.accepted]
    if not accepted:
        raise KernelbotError(f"{run_dir}: the run accepted no kernel, so there is nothing to propose")
    # hotspot ids are per profile: iteration N's tasks name hotspots of the profile it ranked
    by_iteration = {0: {h.id: h for h in report.hotspots_before}}
    for i in range(1, report.iterations):
        path = run_dir / f"hotspots_iter{i + 1}.json"
        if path.exists():
            by_iteration[i] = {h["id"]: Hotspot.model_validate(h) for h in json.loads(path.read_text())}
    timings = EndToEndTimes.model_validate_json((run_dir / "timings.json").read_text()) \
        if (run_dir / "timings.json").exists() else EndToEndTimes(eager=[], kernelbot=[])
    f = report.fidelity
    title = (f"kernelbot: {len(accepted)} kernels for {report.model.name}, {report.speedup:.2f}x end to end "
             f"(run {report.run_id})")
    spend = (f"LLM {report.llm.model}: {report.llm.calls} calls, {report.llm.prompt_tokens} prompt + "
             f"{report.llm.completion_tokens} completion tokens, ${report.llm.cost_usd:.4f}" if report.llm
             else "no LLM was used: 0 tokens, $0")
    lines = [
        f"# {title}", "",
        f"Kernel pack `{pack.version}` for **{report.model.name}** ({report.model.dtype}, batch {report.model.batch}, "
        f"{report.model.prompt_len}-token prompts, {report.model.decode_steps} decode steps) on {report.device.name}.",
        "", "## End to end", "",
        f"- eager {report.baseline_ms:.1f} ms → kernelbot {report.optimized_ms:.1f} ms: **{report.speedup:.2f}x** "
        f"(medians of interleaved rounds)",
        f"- noise: eager {_spread(timings.eager)}; kernelbot {_spread(timings.kernelbot)}; host: {_host(timings)}",
        f"- torch.compile: {f'{report.compiled_ms:.1f} ms' if report.compiled_ms else 'not measured'}",
        *([f"- CUDA-graph decode (static cache): {report.graph_decode_ms:.1f} ms"] if report.graph_decode_ms else []),
        "", "## Fidelity", "",
        f"- {f.summary()}; passed: **{f.passed}**",
        "", "## Spend", "", f"- {spend}; run wall time {report.seconds:.0f} s, {report.iterations} iteration(s)"
        + (f"; stopped early by the {report.stop_reason}" if report.stop_reason else ""),
        "", f"## Kernels ({len(accepted)} accepted of {len(report.kernels)} candidates)", "",
    ]
    for row in accepted:
        lines += _kernel_section(run_dir, row, by_iteration.get(row.iteration, {}))
    rejected = [k for k in report.kernels if not k.accepted]
    lines += ["## Rejected candidates", "", *[f"- `{k.candidate_id}`: {' '.join(k.reason.split())[:200]}"
                                              for k in rejected], ""]
    if not report.fidelity.passed:
        lines.insert(2, "> **Do not merge:** the pack changed the model's outputs beyond its dtype's own error.\n")
    return title, "\n".join(lines), report, pack


def _repo_root(repo: Path | None) -> Path:
    where = Path(repo) if repo else Path.cwd()
    if not where.is_dir():
        raise KernelbotError(f"--repo {where}: no such directory")
    proc = subprocess.run(["git", "-C", str(where), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise KernelbotError(f"{where} is not a git repository; pass --repo PATH")
    root = Path(proc.stdout.strip())
    if subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "-q", "HEAD"], capture_output=True).returncode:
        raise KernelbotError(f"{root} has no commit yet to branch from")
    return root


def make_pr(run_dir: Path, repo: Path | None = None, branch: str | None = None, open_pr: bool = True) -> PullRequest:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise KernelbotError(f"{run_dir}: no such run directory")
    title, body, report, pack = describe(run_dir)
    out = run_dir / "pr"
    out.mkdir(exist_ok=True)
    description = out / "PR.md"
    description.write_text(body)
    root = _repo_root(repo)
    branch = branch or f"kernelbot/{report.run_id}"
    if _git(root, "rev-parse", "--verify", "-q", f"refs/heads/{branch}", check=False):
        raise KernelbotError(f"branch {branch} already exists in {root}; pass --branch NAME")
    identity = [] if _git(root, "config", "user.email", check=False) else [
        "-c", "user.name=kernelbot", "-c", "user.email=kernelbot@localhost"]
    with tempfile.TemporaryDirectory(prefix="kernelbot-pr-") as tmp:
        tree = Path(tmp) / "tree"
        _git(root, "worktree", "add", "-q", "-b", branch, str(tree), "HEAD")
        try:
            dest = tree / "kernel_packs" / report.run_id
            shutil.copytree(run_dir / "pack", dest, dirs_exist_ok=True)
            (dest / "PR.md").write_text(body)
            evidence = dest / "evidence"
            for k in (k for k in report.kernels if k.accepted):
                task_id, cand_id = k.candidate_id.split("/", 1)
                cdir = run_dir / "tasks" / task_id / "candidates" / cand_id
                target = evidence / f"{task_id}__{cand_id}"
                target.mkdir(parents=True, exist_ok=True)
                for name in ("candidate.json", "verdict.json", "bench.json"):
                    shutil.copyfile(cdir / name, target / name)
                shutil.copyfile(run_dir / "tasks" / task_id / "reference.py", target / "reference.py")
            _git(tree, "add", "kernel_packs")
            _git(tree, *identity, "commit", "-q", "-m", title, "-m", "See kernel_packs/"
                 f"{report.run_id}/PR.md for the evidence.")
            commit = _git(tree, "rev-parse", "HEAD")
        finally:
            _git(root, "worktree", "remove", "--force", str(tree), check=False)
    patch_dir = out / "patches"
    shutil.rmtree(patch_dir, ignore_errors=True)
    patches = [Path(p) for p in _git(root, "format-patch", "-q", "-o", str(patch_dir), f"{commit}~1..{commit}")
               .splitlines() if p]
    pr = PullRequest(branch, root, description, patches, commit)
    if open_pr:
        _open(pr, title, root)
    return pr


def _open(pr: PullRequest, title: str, root: Path) -> None:
    if shutil.which("gh") is None:
        pr.note = "gh is not installed: push the branch and open the PR with the description file"
        return
    if not _git(root, "remote", check=False):
        pr.note = "the repository has no remote: push the branch somewhere and open the PR there"
        return
    remote = "origin" if "origin" in _git(root, "remote").split() else _git(root, "remote").split()[0]
    push = subprocess.run(["git", "-C", str(root), "push", "-u", remote, pr.branch], capture_output=True, text=True)
    if push.returncode != 0:
        pr.note = f"git push failed: {push.stderr.strip()[-200:]}"
        return
    gh = subprocess.run(["gh", "pr", "create", "--head", pr.branch, "--title", title, "--body-file",
                         str(pr.description)], capture_output=True, text=True, cwd=root)
    if gh.returncode == 0:
        pr.url = gh.stdout.strip().splitlines()[-1]
    else:
        pr.note = f"gh pr create failed: {gh.stderr.strip()[-200:]}"
