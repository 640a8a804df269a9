"""A served engine's hotspots split by what its plugin captured: each traced layer class becomes one hotspot per
variant (family, arguments, dtype) and row bucket (decode-sized calls apart from prefill chunks), costed from the rows
the engine ran. The split is an input to the one ranking (hotspots.ranked), not a ranker of its own."""

from __future__ import annotations

from collections.abc import Callable

from kernelbot.dtypes import DTYPE_BYTES
from kernelbot.kernel_library import FAMILIES
from kernelbot.profiler.hotspots import ranked
from kernelbot.records import Device, Hotspot, LayerCapture


def as_traced(captures: list[LayerCapture]) -> list[LayerCapture]:
    """The captures as the trace's units show them. Calls a hooked layer made while another's own path ran (a gated
    MLP's projections, where the MLP ran vLLM's ops) are traced inside that layer: where its reference agreed (or a
    pack kernel, made from an agreeing capture, ran its calls), it is the unit (one fused task) and those calls go;
    where it did not, its captures go, so its parts stay units. (Kept, a down projection's calls took a share of the
    output projection's traced time, which is all its class's trace holds.)"""
    agreeing = {c.engine_class for c in captures if c.agrees or c.kernel}
    enclosing = {c.within for c in captures if c.within} - agreeing
    return [c for c in captures if c.within not in agreeing and c.engine_class not in enclosing]


def profiled_dims(capture: LayerCapture, shapes: list[list[int]] | None = None) -> list[list[int]]:
    """A variant's dims as the family's cost reads them: its inputs, then its weights' where the family reads them
    (a linear's [out, in])."""
    shapes = shapes if shapes is not None else capture.input_shapes
    weights = FAMILIES[capture.family].weight_dims
    return [*shapes, *weights(capture.init_args)] if weights is not None else shapes


def row_buckets(capture: LayerCapture, step_rows: int | None = None) -> list[tuple[LayerCapture, bool]]:
    """A variant's calls in two buckets, decode-sized and larger, each with whether it is the decode one: calls with
    at most the most frequent row count (a decode step's rows: the sequences running), and the rest (prefill chunks).
    Each becomes its own task, verified and timed at its bucket's most rows: a kernel fast at prefill sizes may not be
    at decode's, and the router sends each call to the smallest verified kernel that takes its rows. `step_rows`: the
    engine's step budget in tokens; a row-wise variant's prefill bucket is verified at it, since under a heavier load
    than the profiled one a chunk can have that many rows (vLLM's Qwen2.5-0.5B load: 44 of 95 prefill steps had more
    rows than the profile's 897, and ran the engine's own ops)."""
    counts = {int(r): n for r, n in capture.rows.items()}
    if not counts:
        return [(capture, True)]
    mode = max(counts, key=lambda r: (counts[r], -r))
    buckets = [{r: n for r, n in counts.items() if r <= mode}, {r: n for r, n in counts.items() if r > mode}]
    out = []
    for decode, bucket in zip((True, False), buckets, strict=True):
        if bucket:
            keys = {str(r) for r in bucket}
            shapes = capture.shapes[str(max(bucket))]
            if not decode and step_rows is not None:
                shapes = _at_rows(capture.family, shapes, step_rows)
            out.append((capture.model_copy(update={
                "rows": {str(r): n for r, n in bucket.items()}, "calls": sum(bucket.values()),
                "input_shapes": shapes, "shapes": {r: s for r, s in capture.shapes.items() if r in keys}}), decode))
    return out


def _at_rows(family: str, shapes: list[list[int]], rows: int) -> list[list[int]]:
    """A row-wise call's shapes (every input's only free dim its first, the same for all: tokens) at `rows` where it
    has fewer; any other call's (an attention's metadata ties its tokens to its requests) as they are."""
    free = FAMILIES[family].free_dims(shapes)
    if any(f != [0] for f in free) or len({s[0] for s in shapes}) != 1 or shapes[0][0] >= rows:
        return shapes
    return [[rows, *s[1:]] for s in shapes]


def split_hotspots(hotspots: list[Hotspot], captures: list[LayerCapture], device: Device,
                   decode_scale: float = 1.0, step_rows: int | None = None) -> list[Hotspot]:
    """Each traced layer class the plugin captured becomes one hotspot per variant (family, arguments, dtype) and
    row bucket (row_buckets): its calls and their share of the class's time (by roofline floor: decode buckets are
    memory-bound, prefill chunks compute-bound, and a split by bytes alone credited prefill with more FLOP/s than the
    device has), its roofline floor summed over the row counts the engine ran; its dims are the
    bucket's at its most rows (a row-wise prefill bucket's at `step_rows`, the engine's step budget, where given).
    `decode_scale`: the load's decode steps per profiled one (the trace covers fewer):
    decode buckets' calls, time and floor count that many times, at the class's traced time per floor."""
    by_class: dict[str, list[tuple[LayerCapture, bool]]] = {}
    for c in captures:
        if not c.kernel:  # a pack kernel's calls are traced under its label, with their own time
            by_class.setdefault(c.module_class or c.engine_class, []).extend(row_buckets(c, step_rows))
    out: list[Hotspot] = []
    for h in _per_class(hotspots, set(by_class)):
        variants = by_class.get(h.module_class)
        if not variants or h.kernel:
            out.append(h)
            continue
        costs = [_variant_cost(c) for c, _ in variants]
        floors = [floor(device) for _, _, floor in costs]
        weight = sum(floors) or 1.0
        for (c, decode), (flops, nbytes, _), own in zip(variants, costs, floors, strict=True):
            times = decode_scale if decode else 1.0
            share = own / weight
            us, floor_us = h.total_us * share * times, own * times
            out.append(Hotspot(
                id="", module_class=h.module_class, module_paths=h.module_paths, family=c.family,
                input_dims=profiled_dims(c), dtype=c.dtype, calls=round(c.calls * times), total_us=round(us, 1),
                share=h.share * share, flops=flops / max(c.calls, 1), bytes=nbytes / max(c.calls, 1),
                floor_us=round(floor_us, 1)))
    if decode_scale != 1.0:  # shares of the load's time, now that decode buckets count their left-out steps
        traced, total = sum(h.share for h in hotspots), sum(h.total_us for h in out) or 1.0
        out = [h.model_copy(update={"share": traced * h.total_us / total}) for h in out]
    return ranked(out)


def _per_class(hotspots: list[Hotspot], classes: set[str]) -> list[Hotspot]:
    """Hotspots of a captured class merged into one (the trace groups calls by their first op's dims, which are not
    the variants); the others as they are."""
    merged: dict[str, Hotspot] = {}
    out: list[Hotspot] = []
    for h in hotspots:
        if h.module_class not in classes or h.kernel:
            out.append(h)
        elif h.module_class not in merged:
            merged[h.module_class] = h.model_copy(deep=True)
            out.append(merged[h.module_class])
        else:
            m = merged[h.module_class]
            m.calls, m.total_us, m.share = m.calls + h.calls, m.total_us + h.total_us, m.share + h.share
            m.module_paths += [p for p in h.module_paths if p not in m.module_paths]
    return out


def _variant_cost(c: LayerCapture) -> tuple[float, float, Callable[[Device], float]]:
    """(flops, bytes) over all the variant's calls, and its roofline floor on a device, from its rows histogram."""
    family = FAMILIES[c.family]
    itemsize = DTYPE_BYTES.get(c.dtype, 4)
    per_rows = [(int(r), n, family.cost(profiled_dims(c, c.shapes[r]), itemsize)) for r, n in c.rows.items()]
    flops = sum(n * f for _, n, (f, _) in per_rows)
    nbytes = sum(n * b for _, n, (_, b) in per_rows)

    def floor(device: Device) -> float:
        return sum(n * device.floor_us(f, b) for _, n, (f, b) in per_rows)

    return flops, nbytes, floor
