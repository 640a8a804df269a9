"""report.json (for scripts) and report.md (for people), plus the table printed at the end of a run."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kernelbot.records import Hotspot, KernelResult, LLMUsage, Report, ServedReport, ServingMetrics
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
            f"- wall time {r.seconds:.0f} s over {r.sessions} session(s), {r.iterations} iteration(s)",
            f"- budgets: {budgets}",
            f"- {('stopped early by the ' + r.stop_reason) if r.stop_reason else 'no budget ran out'}",
            f"- {spend}"] + ([f"- reused from the kernel store: {', '.join(r.reused)}"] if r.reused else [])


def _contended_banner(r: Report) -> list[str]:
    """At the top of a report timed on a busy host: its ratios are doubtful (on 2 cores one other CPU-bound process
    made eager rounds 5-10x slower)."""
    if r.host is None or not r.host.contended:
        return []
    return [f"> **The host was busy while the end-to-end rounds were timed** ({r.host.summary()}): every ratio "
            "below is doubtful. Rerun on a quiet machine before acting on it.", ""]


def render_markdown(r: Report, figures: Iterable[str] = ()) -> str:
    accepted = [k for k in r.kernels if k.status == "accepted"]
    lines = [
        f"# kernelbot run {r.run_id}",
        "",
        f"Model **{r.model.name}** ({r.model.summary()}); workload: "
        f"batch {r.model.batch}, {r.model.prompt_len}-token prompts, {r.model.decode_steps} greedy decode steps. "
        f"Device: {r.device.name}, {r.device.threads} threads ({r.device.peak_gflops} GFLOP/s, "
        f"{r.device.peak_gbps} GB/s, {r.device.peaks_source}).",
        "",
        *_contended_banner(r),
        "## End to end",
        "",
        f"Medians of {r.timing_rounds} rounds, eager / kernelbot / torch.compile interleaved in each round.",
        "",
        "| variant | workload ms | vs eager |",
        "|---|---:|---:|",
        f"| eager | {_ms(r.baseline_ms)} | 1.00x |",
        f"| kernelbot | {_ms(r.optimized_ms)} | {r.speedup:.2f}x |",
        f"| torch.compile (dynamic) | {_ms(r.compiled_ms)} | "
        f"{(r.baseline_ms / r.compiled_ms if r.compiled_ms else 0):.2f}x |",
        *([f"| CUDA-graph decode (static cache) | {_ms(r.graph_decode_ms)} | "
           f"{r.baseline_ms / r.graph_decode_ms:.2f}x |"] if r.graph_decode_ms else []),
        "",
        f"kernelbot vs torch.compile: {r.speedup_vs_compiled or 0:.2f}x. Fidelity: {r.fidelity.summary()}; "
        f"passed: **{r.fidelity.passed}**.",
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
    lines += ["", "## Hotspots before (profiled, roofline floor from the device's peaks)", "",
              *_hotspot_rows(r.hotspots_before), "", "## Hotspots after", "", *_hotspot_rows(r.hotspots_after)]
    lines += _spend_section(r)
    rejected = [k for k in r.kernels if k.status == "rejected"]
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
    from kernelbot.agent.plots import figures as make_figures
    from kernelbot.agent.report_html import render_html

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
    table = Table(title=f"kernelbot {r.run_id}: {r.speedup:.2f}x over eager "
                        f"({_ms(r.baseline_ms)} → {_ms(r.optimized_ms)} ms; torch.compile {_ms(r.compiled_ms)} ms)")
    for col in ("candidate", "backend", "status", "speedup", "calls", "reason"):
        table.add_column(col, overflow="fold")
    # One line per candidate that decided something: the winners, and the failures worth reading.
    shown = [k for k in r.kernels if k.status == "accepted" or not k.outcome.verified]
    for k in shown:
        style = "green" if k.status == "accepted" else ""
        table.add_row(k.candidate_id, k.backend, k.status, f"{k.speedup:.2f}x" if k.speedup else "—", str(k.calls),
                      k.reason[:90], style=style)
    return table


def _serving_row(name: str, m: ServingMetrics | None) -> str:
    if m is None:
        return f"| {name} | — | — | — | — |"
    return (f"| {name} | {m.output_throughput:.1f} | {m.mean_ttft_ms:.1f} | {m.mean_itl_ms:.2f} | "
            f"{m.requests} × {m.output_tokens // max(m.requests, 1)} |")


def _rounds(m: ServingMetrics | None) -> str:
    return "—" if m is None else ", ".join(f"{t:.1f}" for t in m.round_throughputs)


def render_served_markdown(r: ServedReport) -> str:
    accepted = [k for k in r.kernels if k.status == "accepted"]
    gain = "not claimed" if r.throughput_gain is None else (
        f"{r.throughput_gain:.2f}x" + ("" if r.beyond_noise else " (within the rounds' noise)"))
    f = r.fidelity
    fidelity = ("not checked (no pack)" if f is None else
                f"greedy tokens identical: **{f.greedy_match}** ({f.token_agreement:.1%} agreement), max |Δ logprob| "
                f"{f.max_abs_logit_diff:.2e}, distinct 3-grams {f.distinct_3grams_before:.2f} → "
                f"{f.distinct_3grams_after:.2f}{' (repetition collapse)' if f.repetition_collapse else ''}")
    lines = [f"# kernelbot run {r.run_id} ({r.engine})", "",
             f"Model `{r.model_path}`, tp {r.tp}, on {r.device.name}. Server: `{' '.join(r.server_command)}`.", "",
             "## Serving", "", "Median round of each server (same workload, same seeds); every round's tok/s: "
             f"baseline {_rounds(r.before)}, with the pack {_rounds(r.after)}.", "",
             "| server | output tok/s | mean TTFT ms | mean ITL ms | requests × tokens |", "|---|---:|---:|---:|---|",
             _serving_row("baseline", r.before), _serving_row("with the pack", r.after), "",
             f"Throughput gain: **{gain}**; pack engaged in every rank: **{r.engaged}**. Fidelity: {fidelity}.", "",
             "## Engagement per rank", "", "| rank | pack calls | at graph capture | fallbacks | why |",
             "|---|---:|---:|---:|---|"]
    for rank, e in r.per_rank.items():
        why = "; ".join(f"{cls}: {reason} × {n}" for cls, reasons in e["fallback_reasons"].items()
                        for reason, n in reasons.items()) or "—"
        lines.append(f"| {rank} | {e['custom_calls']} | {e['captured_calls']} | {e['fallback_calls']} | {why} |")
    if r.trace_hits:
        lines += ["", "Pack kernel launches in each rank's trace: "
                  + ", ".join(f"{k}: {v}" for k, v in r.trace_hits.items())]
    lines += ["", f"## Kernels ({len(accepted)} accepted of {len(r.kernels)} candidates; pack {r.pack_version})", "",
              *_kernel_rows(r.kernels)]
    lines += ["", "## Hotspots before (rank 0)", "", *_hotspot_rows(r.hotspots_before),
              "", "## Hotspots with the pack (rank 0)", "", *_hotspot_rows(r.hotspots_after)]
    return "\n".join(lines + _closing(r.notes, r.seconds))


def write_served_report(report: ServedReport, run_dir: Path, console: Console | None = None) -> None:
    write_record(run_dir / "report.json", report)
    (run_dir / "report.md").write_text(render_served_markdown(report))
    if console is not None:
        gain = ("no gain claimed" if report.throughput_gain is None else f"{report.throughput_gain:.2f}x throughput"
                + ("" if report.beyond_noise else ", within noise"))
        after = f"{report.after.output_throughput:.1f}" if report.after else "—"
        console.print(f"kernelbot {report.run_id}: {report.before.output_throughput:.1f} → {after} tok/s ({gain}; "
                      f"engaged: {report.engaged}); report: {run_dir / 'report.md'}", highlight=False)
