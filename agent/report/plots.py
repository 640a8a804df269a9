"""The report's figures as PNG bytes (matplotlib, the `plot` extra): end to end, kernel time before/after, speedup
per kernel, and the roofline position of each accepted kernel. Without matplotlib there are no figures."""

from __future__ import annotations

import io
from collections import defaultdict

from kernelbot.records import Hotspot, Report

TOP_MODULES = 7


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


def _by_module(hotspots: list[Hotspot]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for h in hotspots:
        out[h.module_class + (" (pack kernel)" if h.kernel else "")] += h.total_us / 1e3
    return out


def _end_to_end(plt, r: Report) -> bytes:
    fig, ax = plt.subplots(figsize=(5.5, 2.6))
    others = [("torch.compile", r.compiled_ms, "#c77c2a"), ("CUDA-graph decode", r.graph_decode_ms, "#6a9a3a")]
    shown = [("eager", r.baseline_ms, "#999999"), ("kernelbot", r.optimized_ms, "#2a7ab0"),
             *[(name, ms, color) for name, ms, color in others if ms]]
    names, values, colors = (list(column) for column in zip(*shown, strict=True))
    bars = ax.barh(names, values, color=colors)
    ax.bar_label(bars, [f"{v:.1f} ms" for v in values], padding=3)
    ax.set_xlabel(f"workload wall time, ms (median of {r.timing_rounds} rounds)")
    ax.invert_yaxis()
    ax.set_title(f"End to end: {r.speedup:.2f}x over eager")
    return _png(fig)


def _breakdown(plt, r: Report) -> bytes:
    before, after = _by_module(r.hotspots_before), _by_module(r.hotspots_after)
    top = sorted(set(before) | set(after), key=lambda k: -max(before.get(k, 0), after.get(k, 0)))[:TOP_MODULES]
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    cols = [before, after]
    bottoms = [0.0, 0.0]
    cmap = plt.get_cmap("tab10")
    for i, name in enumerate(top + ["other"]):
        vals = [sum(v for k, v in c.items() if k not in top) if name == "other" else c.get(name, 0.0) for c in cols]
        ax.bar(["before", "after"], vals, bottom=bottoms, label=name, color=cmap(i % 10))
        bottoms = [b + v for b, v in zip(bottoms, vals, strict=True)]
    ax.set_ylabel("profiled time, ms")
    ax.set_title("Kernel time by module, before and after the pack")
    ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    return _png(fig)


def _speedups(plt, r: Report) -> bytes | None:
    timed = [k for k in r.kernels if k.speedup]
    if not timed:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 0.3 * len(timed) + 1.2))
    colors = ["#2a9d4a" if k.accepted else "#bbbbbb" for k in timed]
    ax.barh([k.candidate_id for k in timed], [k.speedup for k in timed], color=colors)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("speedup over the replaced op (green: accepted)")
    ax.tick_params(axis="y", labelsize=7)
    ax.invert_yaxis()
    ax.set_title("Speedup per candidate kernel")
    return _png(fig)


def roofline_points(r: Report) -> list[tuple[str, float, float, float]]:
    """(candidate, arithmetic intensity FLOP/B, kernel GFLOP/s, replaced op GFLOP/s) of each accepted kernel."""
    out = []
    for k in r.kernels:
        if k.accepted and k.flops and k.bytes and k.time_us and k.reference_us:
            out.append((k.candidate_id, k.flops / k.bytes, k.flops / k.time_us / 1e3, k.flops / k.reference_us / 1e3))
    return out


def _roofline(plt, r: Report) -> bytes | None:
    points = roofline_points(r)
    if not points:
        return None
    peak, bw = r.device.peak_gflops, r.device.peak_gbps
    fig, ax = plt.subplots(figsize=(6, 3.6))
    lo = min(p[1] for p in points) / 10
    hi = max(max(p[1] for p in points) * 10, peak / bw * 10)
    xs = [lo * (hi / lo) ** (i / 100) for i in range(101)]
    ax.plot(xs, [min(peak, x * bw) for x in xs], color="black", label=f"roofline ({peak} GFLOP/s, {bw} GB/s)")
    for i, (name, ai, kernel, ref) in enumerate(points):
        color = plt.get_cmap("tab10")(i % 10)
        ax.scatter([ai], [ref], marker="o", facecolors="none", edgecolors=color)
        ax.scatter([ai], [kernel], marker="*", s=90, color=color, label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity, FLOP/byte")
    ax.set_ylabel("GFLOP/s")
    ax.set_title("Accepted kernels on the roofline (★ kernel, ○ replaced op)")
    ax.legend(fontsize=7)
    return _png(fig)


def figures(r: Report) -> dict[str, bytes]:
    """name → PNG; empty when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    out = {"end_to_end": _end_to_end(plt, r), "breakdown": _breakdown(plt, r)}
    for name, fn in (("speedups", _speedups), ("roofline", _roofline)):
        png = fn(plt, r)
        if png:
            out[name] = png
    return out
