"""The parts of the CLI about a run's life: optimize's budget/resume/iteration/store flags, `status` and `pr`."""

from __future__ import annotations

import argparse
import errno
import json
from pathlib import Path

from kernelbot import KernelbotError
from kernelbot.agent.run_options import OptimizeOptions
from kernelbot.flags import default


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("overnight runs (budgets, resume, iterations, kernel store)")
    g.add_argument("--resume", type=Path, default=None, metavar="RUN_DIR",
                   help="continue a killed or stopped run from its journal (its recorded options are used; "
                        "--budget-hours, --max-cost and --max-tokens given here replace the recorded ones)")
    g.add_argument("--budget-hours", type=float, default=None,
                   help="wall time of the whole run, resumed sessions included; it stops generating in time to "
                        "integrate, measure and report")
    g.add_argument("--iterations", type=int, default=default(OptimizeOptions, "iterations"),
                   help="profile → generate → integrate rounds at most, each on the bottlenecks left")
    g.add_argument("--min-share", type=float, default=default(OptimizeOptions, "min_share"),
                   help="skip hotspots under this share of the profiled time")
    g.add_argument("--max-task-minutes", type=float, default=None, help="per-task cap on candidate time")
    g.add_argument("--store", type=Path, default=None,
                   help="kernel store to reuse from and add to (default $KERNELBOT_STORE or ~/.cache/kernelbot/store)")
    g.add_argument("--no-store", action="store_true", help="neither reuse nor store kernels")


def run_optimize(args: argparse.Namespace, opts: OptimizeOptions) -> int:
    from kernelbot.agent import optimize as opt

    try:
        if args.resume is not None:
            opt.resume(args.resume, budget_hours=args.budget_hours, max_cost=args.max_cost,
                       max_tokens=args.max_tokens)
            return 0
        opt.optimize(opts)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        where = args.resume or opts.run_dir or "the run directory"
        raise KernelbotError(f"the disk is full ({exc.filename or where}); free space and continue with "
                             f"`kernelbot optimize --resume {where}`") from None
    return 0


def _status(args: argparse.Namespace) -> int:
    from kernelbot.agent.report.status import render_status, run_status

    s = run_status(args.run_dir)
    print(json.dumps(s, indent=2) if args.json else render_status(s))
    return 0


def _pr(args: argparse.Namespace) -> int:
    from kernelbot.agent.report.pr import make_pr

    pr = make_pr(args.run_dir, repo=args.repo, branch=args.branch, open_pr=not args.no_open)
    print(f"branch       {pr.branch} ({pr.commit[:12]}) in {pr.repo}")
    print(f"description  {pr.description}")
    for patch in pr.patches:
        print(f"patch        {patch}")
    if pr.url:
        print(f"pull request {pr.url}")
    elif pr.note:
        print(f"note         {pr.note}")
    return 0


def add_run_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="a run's stage, progress, spend and best gains so far (while it runs, too)")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_status)

    p = sub.add_parser("pr", help="the run's kernel pack as a git branch + patch series with a reviewable "
                                  "description (opened through gh when present)")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--repo", type=Path, default=None, help="git repository to branch in (default: the current one)")
    p.add_argument("--branch", default=None, help="branch name (default kernelbot/<run id>)")
    p.add_argument("--no-open", action="store_true", help="do not push or open the PR through gh")
    p.set_defaults(func=_pr)
