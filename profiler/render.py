"""How `kernelbot rank` shows a RankReport: a terminal table, JSON, CSV, or a PNG breakdown."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from kernelbot import KernelbotError
from kernelbot.records import RankReport


def _short(name: str, width: int) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def table(report: RankReport, top: int) -> str:
    lines = [
        f"{report.source}: {report.device}",
        f"peaks: {report.peaks}",
        f"GPU busy {report.gpu_busy_us / 1e3:.1f} ms, idle {report.gpu_idle_share:.1%}, {report.launches} launches; "
        f"kernels linked to ops by {report.linking}",
        "",
        f"{'#':>3} {'kernel':58} {'total ms':>9} {'count':>6} {'share':>6} {'floor ms':>9} {'headroom':>9}  "
        "op [shapes]",
    ]
    for i, k in enumerate(report.kernels[:top], 1):
        floor = f"{k.floor_us / 1e3:9.3f}" if k.floor_known else f"{'?':>9}"
        tag = " (comm)" if k.communication else ""
        shapes = json.dumps(k.shapes)[:40] if k.shapes else ""
        lines.append(f"{i:3d} {_short(k.name, 58):58} {k.total_us / 1e3:9.3f} {k.count:6d} {k.share:6.1%} {floor} "
                     f"{k.score / 1e3:9.3f}  {(k.op or '—') + tag} {shapes}")
    if len(report.kernels) > top:
        lines.append(f"    … {len(report.kernels) - top} more kernels (--top N, or --format json for all)")
    for r in report.ranks:
        lines.append(f"rank {r.rank}: GPU busy {r.gpu_busy_us / 1e3:.1f} ms of {r.span_us / 1e3:.1f} ms"
                     + ("  ← straggler" if r.straggler else ""))
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines)


def to_csv(report: RankReport) -> str:
    out = io.StringIO()
    fields = ["name", "total_us", "count", "mean_us", "share", "op", "shapes", "dtype", "module", "floor_us",
              "floor_known", "score", "communication"]
    writer = csv.DictWriter(out, fieldnames=fields)
    writer.writeheader()
    for k in report.kernels:
        row = k.model_dump()
        row["shapes"] = json.dumps(row["shapes"]) if row["shapes"] is not None else ""
        writer.writerow({f: row[f] for f in fields})
    return out.getvalue()


def plot(report: RankReport, path: Path, top: int) -> None:
    """Horizontal bars of the top kernels by time: the roofline floor dark, the headroom above it light."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise KernelbotError("--plot needs matplotlib: pip install 'kernelbot[plot]'") from None
    kernels = sorted(report.kernels, key=lambda k: k.total_us, reverse=True)[:top][::-1]
    fig, ax = plt.subplots(figsize=(11, 0.35 * len(kernels) + 1.5))
    labels = [_short(k.name, 60) for k in kernels]
    ms = [k.total_us / 1e3 for k in kernels]
    targets = [not k.communication and (k.score > 0 or k.floor_known) for k in kernels]
    floors = [k.floor_us / 1e3 if t and k.floor_known else 0.0 for k, t in zip(kernels, targets, strict=True)]
    ax.barh(labels, floors, color="#1f4e79", label="roofline floor")
    above = [m - f if t and k.floor_known else 0 for m, f, t, k in zip(ms, floors, targets, kernels, strict=True)]
    ax.barh(labels, above, left=floors, color="#9dc3e6", label="time above the floor (headroom)")
    ax.barh(labels, [m if t and not k.floor_known else 0 for m, t, k in zip(ms, targets, kernels, strict=True)],
            color="#d9d9d9", hatch="//", label="floor unknown (op not modelled)")
    ax.barh(labels, [0 if t else m for m, t in zip(ms, targets, strict=True)], color="#7f7f7f",
            label="communication / copies (not rewrite targets)")
    ax.set_xlabel("GPU time, ms")
    ax.set_title(f"{Path(report.source).name}: top {len(kernels)} kernels ({report.device})")
    ax.legend(loc="lower right")
    ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise KernelbotError(f"{path}: cannot write the plot ({exc.strerror})") from None
    finally:
        plt.close(fig)
