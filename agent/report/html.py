"""report.html: the morning read, one self-contained file (styles inline, figures as base64 PNGs)."""

from __future__ import annotations

import base64
from html import escape

from kernelbot.agent.report.markdown import llm_line, outcome_label
from kernelbot.agent.report.plots import roofline_points
from kernelbot.records import Hotspot, KernelResult, Report

CAPTIONS = {
    "end_to_end": "End-to-end workload time, before (eager) and after (kernelbot pack)",
    "breakdown": "Kernel time breakdown by module, before and after",
    "speedups": "Speedup per benchmarked candidate",
    "roofline": "Roofline position of each accepted kernel",
}
STYLE = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:.85em}
td,th{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f2f2f2}.num{text-align:right}.accepted{background:#e7f6ea}.rejected{background:#fff}
figure{display:inline-block;margin:.5em 1em 1em 0}figcaption{font-size:.8em;color:#555}
.big{font-size:1.4em;font-weight:600}
"""


def _table(header: list[str], rows: list[list[str]], classes: list[str] | None = None) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _kernels(kernels: list[KernelResult]) -> str:
    rows = [[k.candidate_id, k.op, k.backend, k.proposer or "—", f"{k.speedup:.2f}x" if k.speedup else "—",
             k.calls, k.status, outcome_label(k), k.reason] for k in kernels]
    return _table(["candidate", "op", "backend", "proposer", "speedup", "calls", "status", "outcome", "reason"], rows,
                  [k.status for k in kernels])


def _hotspots(hotspots: list[Hotspot], top: int = 12) -> str:
    rows = [[h.id, h.module_class, h.family or "—", h.kernel or "—", h.input_dims, h.calls, f"{h.total_us / 1e3:.1f}",
             f"{h.share:.1%}", f"{h.floor_us / 1e3:.2f}", f"{h.score_us / 1e3:.1f}"] for h in hotspots[:top]]
    return _table(["id", "module", "family", "pack kernel", "input dims", "calls", "time ms", "share", "floor ms",
                   "headroom ms"], rows)


def _spend(r: Report) -> str:
    items = [f"Wall time: {r.seconds:.0f} s over {r.sessions} session(s), {r.iterations} iteration(s)."]
    budgets = ", ".join(f"{k} {v}" for k, v in r.budget.items() if v is not None)
    if budgets:
        items.append(f"Budgets: {budgets}.")
    items.append(f"Stopped early by the {r.stop_reason}." if r.stop_reason else "No budget ran out.")
    items.append(llm_line(r.llm) + "." if r.llm else "No LLM was used (built-in proposer): $0, 0 tokens.")
    if r.reused:
        items.append(f"Reused from the kernel store: {', '.join(r.reused)}.")
    return "<ul>" + "".join(f"<li>{escape(i)}</li>" for i in items) + "</ul>"


def render_html(r: Report, figures: dict[str, bytes]) -> str:
    accepted = [k for k in r.kernels if k.accepted]
    rejected = [k for k in r.kernels if not k.accepted]
    figs = "".join(
        f'<figure id="fig-{name}"><img alt="{escape(CAPTIONS.get(name, name))}" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode()}"><figcaption>'
        f"{escape(CAPTIONS.get(name, name))}</figcaption></figure>" for name, png in figures.items())
    if not figures:
        figs = "<p>No figures: matplotlib is not installed (pip install 'kernelbot[plot]').</p>"
    e2e = _table(["variant", "workload ms", "vs eager"], [
        ["eager (before)", f"{r.baseline_ms:.1f}", "1.00x"],
        ["kernelbot (after)", f"{r.optimized_ms:.1f}", f"{r.speedup:.2f}x"],
        *([["torch.compile", f"{r.compiled_ms:.1f}", f"{r.baseline_ms / r.compiled_ms:.2f}x"]]
          if r.compiled_ms else [])])
    roof = _table(["candidate", "FLOP/byte", "kernel GFLOP/s", "replaced op GFLOP/s", "of roofline"], [
        [name, f"{ai:.3g}", f"{k:.3g}", f"{ref:.3g}",
         f"{k / min(r.device.peak_gflops, ai * r.device.peak_gbps):.0%}"]
        for name, ai, k, ref in roofline_points(r)])
    m = r.model
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>kernelbot run {escape(r.run_id)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>kernelbot run {escape(r.run_id)}</h1>",
        f"<p class='big' id='headline'>{r.speedup:.2f}x end to end ({r.baseline_ms:.1f} → {r.optimized_ms:.1f} ms),"
        f" {len(accepted)} kernels accepted of {len(r.kernels)} candidates</p>",
        f"<p>Model <b>{escape(m.name)}</b> ({escape(m.summary())}), batch {m.batch},"
        f" {m.prompt_len}-token prompts, {m.decode_steps} decode steps. Device: {escape(r.device.name)}, "
        f"{r.device.threads} threads ({r.device.peak_gflops} GFLOP/s, {r.device.peak_gbps} GB/s). Fidelity: "
        f"{escape(r.fidelity.summary())}; passed: <b>{r.fidelity.passed}</b>."
        "</p>",
        "<h2 id='end-to-end'>End to end, before and after</h2>", e2e,
        "<h2 id='figures'>Figures</h2>", figs,
        "<h2 id='accepted'>Accepted kernels</h2>", _kernels(accepted) if accepted else "<p>None.</p>",
        "<h2 id='roofline'>Roofline position of the accepted kernels</h2>",
        roof if accepted else "<p>No accepted kernels.</p>",
        "<h2 id='spend'>Spend and budgets</h2>", _spend(r),
        f"<h2 id='rejected'>Rejected candidates ({len(rejected)}), each with its reason</h2>",
        _kernels(rejected) if rejected else "<p>None.</p>",
        "<h2>Hotspots before</h2>", _hotspots(r.hotspots_before),
        "<h2>Hotspots after</h2>", _hotspots(r.hotspots_after),
    ]
    if r.notes:
        parts += ["<h2>Notes</h2><ul>", *[f"<li>{escape(n)}</li>" for n in r.notes], "</ul>"]
    parts.append("</body></html>\n")
    return "\n".join(parts)
