"""report.json (for scripts) and report.md (for people), plus the table printed at the end of a run."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kernelbot.records import Hotspot, KernelResult, LLMUsage, Report, ServedComparison, ServingMetrics
from kernelbot.rundir import write_record


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}"


def _hotspot_rows(hotspots: list[Hotspot], top: int = 12) -> list[str]:
    rows = ["| id | module | family | kernelbot kernel | input dims | calls | time ms | share | floor ms "
            "| headroom ms |",
            "|---|---|---|---|---|---:|---:|---:|---:|---:|"]
    for h in hotspots[:top]:
        rows.append(f"| {h.id} | {h.module_class} | {h.family or '—'} | {h.kernel or '—'} | {h.input_dims} | "
                    f"{h.calls} | "
                    f"{h.total_us / 1e3:.1f} | {h.share:.1%} | {h.floor_us / 1e3:.2f} | {h.score_us / 1e3:.1f} |")
    return rows


def _kernel_rows(kernels: list[KernelResult]) -> list[str]:
    rows = ["| candidate | op | module | backend | shapes | status | outcome | speedup | calls | reason |",
            "|---|---|---|---|---|---|---|---:|---:|---|"]
    for k in kernels:
        speed = f"{k.speedup:.2f}x" if k.speedup else "—"
        rows.append(f"| {k.candidate_id} | {k.op} | {k.module} | {k.backend} | {k.shapes} | {k.status} | "
                    f"{outcome_label(k)} | {speed} | {k.calls} | {k.reason.replace('|', '/')} |")
    return rows


def outcome_label(k: KernelResult) -> str:
    """What became of the candidate, in words (`not_faster` → `not faster`)."""
    return k.outcome.value.replace("_", " ")


def _closing(notes: list[str], seconds: float) -> list[str]:
    return (["", "## Notes", "", *[f"- {n}" for n in notes]] if notes else []) + ["", f"Run took {seconds:.0f} s.", ""]


def llm_line(u: LLMUsage) -> str:
    cost = f"${u.cost_usd:.4f}" + ("" if u.cost_known else " (no price known for the model)")
    line = (f"LLM {u.model}: {u.calls} calls ({u.failed_calls} failed), {u.prompt_tokens} prompt + "
            f"{u.completion_tokens} completion tokens, {cost}, {u.candidates} candidates, {u.verified} verified, "
            f"{u.accepted} accepted, {u.seconds:.0f} s")
    if u.stop_reason:
        line += f"; stopped by the {u.stop_reason}"
    if u.fallback:
        line += f"; built-in proposer took over ({u.fallback})"
    return line


def _llm_section(u: LLMUsage) -> list[str]:
    budgets = ", ".join(f"{k} {v}" for k, v in u.budgets.items() if v is not None)
    return ["", "## LLM", "", llm_line(u) + ".", "", f"Budgets: {budgets}.", "",
            "Every call (prompt, answer, tokens, cost, latency, the candidate it became) is under "
            "`tasks/<task>/llm/`, one line each in `llm/calls.jsonl`; totals in `llm/usage.json`."]


def _spend_section(r: Report) -> list[str]:
    budgets = ", ".join(f"{k} {v}" for k, v in r.budget.items() if v is not None) or "none"
    spend = llm_line(r.llm) if r.llm else "no LLM (built-in proposer): $0, 0 tokens"
    return ["", "## Spend and budgets", "",
            f"- wall time {r.seconds:.0f} s over {r.sessions} session(s), {r.iterations} iteration(s)"
            + (f"; kernelbot's peak resident memory {r.peak_rss_mib:.0f} MiB" if r.peak_rss_mib else ""),
            f"- budgets: {budgets}",
            f"- {('stopped early by the ' + r.stop_reason) if r.stop_reason else 'no budget ran out'}",
            f"- {spend}"] + ([f"- reused from the kernel store: {', '.join(r.reused)}"] if r.reused else [])


def _us(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "—"


def _alone_vs_model_section(r: Report) -> list[str]:
    """Each kernel's saving as its benchmark predicts it beside its saving measured in the model."""
    if not r.alone_vs_model:
        return []
    lines = ["", "## Alone vs in the model", "",
             "The saving its benchmark predicts (calls x the op's time less the kernel's) beside the saving measured "
             "in the model. In-process (gate trial): per workload run, the pack's median round without the kernel less "
             "with it (the gate's leave-one-out); a call's time in the model is its module's in the packed model's "
             "profile (the router's work included). Engine timing: over the calls of the measured rounds, the kernel "
             "timed beside the op it replaces on the same calls where the model runs them (in-process, by the router "
             "in kernelbot's process; served, inside the engine).", "",
             "| candidate | alone | calls | predicted ms | measured ms | µs a call in the benchmark: op, kernel "
             "| in the model: op, kernel | from | verdict |",
             "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for c in r.alone_vs_model:
        verdict = ("**disagree**: " + c.cause if c.disagrees else "agree" if c.judged
                   else "within the rounds' noise")
        bench_op = c.bench_call_us * c.speedup_alone if c.bench_call_us is not None else None
        lines.append(f"| {c.candidate_id} | {c.speedup_alone:.2f}x | {c.calls} | {c.predicted_ms:.1f} | "
                     f"{c.measured_ms:.1f} | {_us(bench_op)}, {_us(c.bench_call_us)} | {_us(c.model_op_us)}, "
                     f"{_us(c.model_call_us)} | {c.source.value} | {verdict} |")
    return lines


def _contended_banner(r: Report) -> list[str]:
    """At the top of a report timed on a busy host: its ratios are doubtful (on 2 cores one other CPU-bound process
    made eager rounds 5-10x slower)."""
    if r.host is None or not r.host.contended:
        return []
    return [f"> **The host was busy while the end-to-end rounds were timed** ({r.host.summary()}): every ratio "
            "below is doubtful. Rerun on a quiet machine before acting on it.", ""]


def render_markdown(r: Report, figures: Iterable[str] = ()) -> str:
    accepted = [k for k in r.kernels if k.accepted]
    lines = [
        f"# kernelbot run {r.run_id}",
        "",
        f"Model **{r.model.name}** ({r.model.summary()}), "
        f"{'in-process' if r.serving is None else 'served by ' + r.engine}; workload: batch {r.model.batch}, "
        f"{r.model.prompt_len}-token prompts, {r.model.decode_steps} greedy decode steps. "
        f"Device: {r.device.name}, {r.device.threads} threads ({r.device.peak_gflops} GFLOP/s, "
        f"{r.device.peak_gbps} GB/s, {r.device.peaks_source}).",
        "",
        *_contended_banner(r),
        "## End to end",
        "",
        *_end_to_end(r),
        "",
        *([r.floor.summary() + ".", ""] if r.floor is not None else []),
        *(_served_section(r.serving) if r.serving is not None else []),
        (f"kernelbot vs torch.compile: {r.speedup_vs_compiled:.2f}x. " if r.serving is None and r.speedup_vs_compiled
         else "")
        + f"Fidelity: {r.fidelity.summary()}; passed: **{r.fidelity.passed}**.",
        "",
        f"## Kernels ({len(accepted)} accepted of {len(r.kernels)} candidates)",
        "",
        *_kernel_rows(r.kernels),
    ]
    lines += ["", "## Accepted kernels against the roofline", "",
              "Per call, from each candidate's benchmark; floor = max(FLOPs / peak FLOP/s, bytes / peak GB/s), with "
              "the bandwidth of a copy too large for the caches. Above 100% means the benchmark's working set "
              "(one layer's weights, reused every call) stayed in cache; in the end-to-end run all layers' weights "
              "stream from memory, so the per-hotspot floors after integration are the better guide. torch.compile "
              "of the same region: its gain over eager, timed beside eager in kernelbot's process "
              "(tasks/<id>/compile.json); the kernel's estimated gain over it is its own gain over eager divided by "
              "that.", "",
              "| candidate | replaced op µs | kernel µs | floor µs | of roofline | compile vs eager "
              "| kernel vs compile (est.) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for k in accepted:
        if k.time_us and k.floor_us is not None:
            region = k.region_compile_speedup
            versus = f"{k.speedup / region:.2f}x" if region and k.speedup else "—"
            lines.append(f"| {k.candidate_id} | {k.reference_us:.1f} | {k.time_us:.1f} | {k.floor_us:.1f} | "
                         f"{k.floor_us / k.time_us:.0%} | {f'{region:.2f}x' if region else '—'} | {versus} |")
    lines += _alone_vs_model_section(r)
    lines += ["", "## Hotspots before (profiled, roofline floor from the device's peaks)", "",
              *_hotspot_rows(r.hotspots_before), "", "## Hotspots after", "", *_hotspot_rows(r.hotspots_after)]
    lines += _spend_section(r)
    rejected = [k for k in r.kernels if not k.accepted]
    lines += ["", f"## Rejected candidates ({len(rejected)})", ""]
    lines += [f"- `{k.candidate_id}` ({k.backend}, {k.proposer or 'builtin'}): {k.reason}"
              for k in rejected] or ["None."]
    if figures:
        lines += ["", "## Figures", "", *[f"![{name}](plots/{name}.png)" for name in figures]]
    if r.llm is not None:
        lines += _llm_section(r.llm)
    return "\n".join(lines + _closing(r.notes, r.seconds))


def write_report(report: Report, run_dir: Path, console: Console | None = None) -> None:
    """report.json, report.md (figures under plots/) and report.html (self-contained)."""
    from kernelbot.agent.report.html import render_html
    from kernelbot.agent.report.plots import figures as make_figures

    write_record(run_dir / "report.json", report)
    figures = make_figures(report)
    (run_dir / "plots").mkdir(exist_ok=True)
    for name, png in figures.items():
        (run_dir / "plots" / f"{name}.png").write_bytes(png)
    (run_dir / "report.md").write_text(render_markdown(report, figures))
    (run_dir / "report.html").write_text(render_html(report, figures))
    if console is not None:
        console.print(summary_table(report))
        if report.llm is not None:
            console.print(llm_line(report.llm), highlight=False)
        console.print(f"report: {run_dir / 'report.md'} and {run_dir / 'report.html'}")


def summary_table(r: Report) -> Table:
    baseline = "eager" if r.serving is None else f"stock {r.engine}"
    compiled = f"; torch.compile {_ms(r.compiled_ms)} ms" if r.serving is None else ""
    table = Table(title=f"kernelbot {r.run_id}: {r.speedup:.2f}x over {baseline} "
                        f"({_ms(r.baseline_ms)} → {_ms(r.optimized_ms)} ms{compiled})")
    for col in ("candidate", "backend", "status", "speedup", "calls", "reason"):
        table.add_column(col, overflow="fold")
    # One line per candidate that decided something: the winners, and the failures worth reading.
    shown = [k for k in r.kernels if k.accepted or not k.outcome.verified]
    for k in shown:
        style = "green" if k.accepted else ""
        table.add_row(k.candidate_id, k.backend, k.status, f"{k.speedup:.2f}x" if k.speedup else "—", str(k.calls),
                      k.reason[:90], style=style)
    return table


def _serving_row(name: str, m: ServingMetrics) -> str:
    p99 = lambda x: "—" if x is None else f"{x:.1f}"  # noqa: E731
    return (f"| {name} | {m.output_throughput:.1f} | {m.median_ttft_ms:.1f} | {p99(m.p99_ttft_ms)} | "
            f"{m.median_itl_ms:.2f} | {p99(m.p99_itl_ms)} | {m.requests} × {m.output_tokens // max(m.requests, 1)} |")


def _served_section(s: ServedComparison) -> list[str]:
    """The A/B on the server: serving numbers of both servers, and where the pack's kernels ran."""
    gain = "not claimed" if s.throughput_gain is None else (
        f"{s.throughput_gain:.2f}x" + ("" if s.beyond_noise else " (within the rounds' noise)"))
    rounds = lambda ms: ", ".join(f"{m.output_throughput:.1f}" for m in ms)  # noqa: E731
    lines = ["## Serving", "",
             f"{s.engine} {s.version}, both servers up, started the same way; {len(s.stock_rounds)} interleaved "
             f"rounds of the same seeded load, the order alternating. Every round's tok/s: stock "
             f"{rounds(s.stock_rounds)}; with the pack {rounds(s.pack_rounds)}"
             + (f"; host: {s.host.summary()}" if s.host is not None else "") + ".", "",
             "| server | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | requests × tokens |",
             "|---|---:|---:|---:|---:|---:|---|",
             _serving_row("stock", s.stock), _serving_row("with the pack", s.with_pack), "",
             f"Throughput gain: **{gain}**; the pack ran in every engine process that ran layers: **{s.engaged}**. "
             f"The packed server: `{s.command}`.", "",
             *([f"Ceiling: {s.ceiling.summary()}.", ""] if s.ceiling is not None else []),
             "| process | rank | pack kernel calls | fallbacks | why |", "|---|---|---:|---:|---|"]
    for p in s.processes:
        if not (p.custom or p.fallback):
            continue
        why = "; ".join(f"{cls}: {reason} × {n}" for cls, reasons in p.fallback.items()
                        for reason, n in reasons.items()) or "—"
        calls = sum(c.calls + c.captured for c in p.custom.values())
        fallbacks = sum(n for reasons in p.fallback.values() for n in reasons.values())
        lines.append(f"| {p.pid} | {p.rank} | {calls} | {fallbacks} | {why} |")
    timed = [(cid, c) for p in s.processes for cid, c in p.custom.items() if c.timed]
    if timed:
        lines += ["", "Each kernel's first calls in the server ran the engine's own path too, on the same inputs, the "
                  "order alternating and the path that ran first timed (the op it replaces, benchmarked where it "
                  "runs, in the cache the model left); a kernel slower there stops taking calls.",
                  "", "| kernel | calls | timed | kernel µs | engine's own µs | stopped |",
                  "|---|---:|---:|---:|---:|---|"]
        lines += [f"| {cid} | {c.calls} | {c.timed} | {c.kernel_us} | {c.engine_us} | {c.disabled or '—'} |"
                  for cid, c in timed]
    unrouted = [u for p in s.processes for u in p.unrouted]
    if unrouted:
        lines += ["", "Not integrable: " + "; ".join(f"{u['candidate_id']} ({u['reason']})"
                                                     for u in {u["candidate_id"]: u for u in unrouted}.values())]
    return lines + [""]


def _end_to_end(r: Report) -> list[str]:
    if r.serving is not None:
        return [f"Medians of {r.timing_rounds} rounds' wall time, the stock and the packed server interleaved "
                "(the same tokens every round: the ratio of times is that of throughputs).", "",
                "| variant | round ms | vs stock |", "|---|---:|---:|",
                f"| stock {r.engine} | {_ms(r.baseline_ms)} | 1.00x |",
                f"| {r.engine} + kernelbot pack | {_ms(r.optimized_ms)} | {r.speedup:.2f}x |"]
    compiled = (f"{r.baseline_ms / r.compiled_ms:.2f}x" if r.compiled_ms else "not timed")
    return [f"Medians of {r.timing_rounds} rounds, eager / kernelbot / torch.compile interleaved in each round.", "",
            "| variant | workload ms | vs eager |", "|---|---:|---:|",
            f"| eager | {_ms(r.baseline_ms)} | 1.00x |",
            f"| kernelbot | {_ms(r.optimized_ms)} | {r.speedup:.2f}x |",
            f"| torch.compile (dynamic) | {_ms(r.compiled_ms)} | {compiled} |",
            *([f"| CUDA-graph decode (static cache) | {_ms(r.graph_decode_ms)} | "
               f"{r.baseline_ms / r.graph_decode_ms:.2f}x |"] if r.graph_decode_ms else [])]
