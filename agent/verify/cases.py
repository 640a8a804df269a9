"""What a candidate is verified on: models and input sets built from the reference module, in the parent.

Sizes come from the reference's own module-level constants (KernelBench style: `batch_size = 16`,
`dim = 16384`, used by `get_inputs()` and `get_init_inputs()`): constants that size inputs or weights are
scaled down until the problem fits `SCALED_BYTES` (KernelBench ships inputs of several GB), counting inputs,
weights and the intermediates alive at once at their peak (measured on the meta device: an attention whose
scores need gigabytes is judged at a size that fits); the original sizes are kept as well when they fit
`ORIGINAL_BYTES`, else sizes scaled to `LARGE_BYTES`; fuzzed sizes — 1, primes, non-multiples of any block
size, and one group well past the scaled value (`past`: 257 for 32 or 64 rows) — are set through the same constants,
so shapes that must agree keep
agreeing (a `SizeBudget` holds those three byte counts; `SMALL`'s, which also halve an optimize task's free dims, are
for the interpreter's race check on a GPU node). Tasks made by `kernelbot optimize` carry `INPUT_SHAPES` with their
observed shapes and free (batch/token) dims; those dims are fuzzed instead. Input values come from the reference's
own `get_inputs()` under a seed the candidate never sees (so value ranges the op needs are kept), in the layout it
gives (a transposed view stays one), then rescaled: tiny, large, with signed zeros and subnormals sprinkled in, past
float16's range and near the largest values the reference keeps finite.
Special values follow: ±inf and NaN sprinkled into float inputs that are not masks, and, where the reference
takes a mask (bool, 0/1, or additive -inf), rows fully masked and left-padded in both polarities; then the main
inputs in a non-contiguous layout, in the other memory order (transposed, whatever the reference's own) and with
their rows permuted, and a draw moved by a mean far beyond its spread;
each is kept only where the reference itself runs on it. Integer and boolean inputs that are not masks (token
ids, positions) always stay as drawn. For the caching check, the fresh draw is also changed one element at a time
(copied from another element, so it stays in range), and new weights are drawn afresh for the parameters, the float
buffers and both (`References.alternates`). `References` builds the reference model afresh wherever one is needed (a
deepcopy would keep what its functions close over).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernelbot import KernelbotError
from kernelbot.agent.verify.numerics import WEAK_TASK_SPREAD, outs, spread
from kernelbot.records import Task

SCALED_BYTES = 16 << 20  # inputs + weights + outputs of the main case
ORIGINAL_BYTES = 64 << 20  # the reference's own sizes are verified too when they fit this
LARGE_BYTES = 128 << 20  # where they do not, sizes scaled to fit this are verified instead
FUZZ_SIZES = (1, 3, 7, 13, 31)  # 1, primes, non-multiples of every block size
PRIMES = (61, 53, 47, 43, 41, 37, 31, 29, 23, 19, 17, 13, 11, 7, 5, 3)
MIN_SCALED = 16  # constants are never scaled below this (kernel sizes, groups and the like stay put)
VALUE_VARIANTS = {"tiny": 1e-3, "large": 1e3}
# Past the scaled sizes: at least this many times a size, and past a power of two no smaller than PAST_ROWS (a table,
# buffer or grid sized for "enough" rows is often 256)
PAST_FACTOR, PAST_ROWS = 4, 256
# Values scaled to these largest magnitudes: past float16's largest finite value (65504: a kernel computing through
# float16 overflows there, where bfloat16 and float32 do not), and near the largest the reference keeps finite: tried
# from NEAR_MAX of the dtype's largest value down by RANGE_STEP (2^128 for float32: 32 steps), then one step lower
PAST_FLOAT16 = 2.0 ** 18
NEAR_MAX = 0.999
RANGE_STEP, RANGE_STEPS = 16.0, 32
STRENGTH_DRAWS = 5  # independent input draws a reference's output is compared across
SPECIAL_SHARE = 0.01  # of a float input's elements set to +inf, -inf or NaN (at least one of each)
ELEMENT_CHANGES = 3  # calls on the same tensors with one element changed
SMALL_BYTES = 1 << 20  # a small plan's main case: the Triton interpreter runs it in seconds


@dataclass(frozen=True)
class SizeBudget:
    """Bytes a plan's sizes must fit (as `footprint` counts them): the main case's scaled sizes; the reference's own
    sizes, run too where they fit `original` (and the one group of constants past the scaled ones); else sizes scaled
    to `large`. `observed`: free dims of a task's observed shapes halved until they fit it (None: kept as observed)."""
    scaled: int = SCALED_BYTES
    original: int = ORIGINAL_BYTES
    large: int = LARGE_BYTES
    observed: int | None = None


FULL = SizeBudget()
# Small: for the race check of a GPU node's Triton candidates in the interpreter on its CPU (interpreter_race.py)
SMALL = SizeBudget(scaled=SMALL_BYTES, original=4 * SMALL_BYTES, large=SMALL_BYTES, observed=SMALL_BYTES)


class WeakTask(KernelbotError):
    """The reference is not worth verifying against: a constant or its input could pass."""


@dataclass
class Case:
    label: str
    model: int  # index into Plan.init_args
    inputs: list[Any]
    special: bool = False  # inputs carry ±inf/NaN or masked rows: NaN in the output is expected there
    rescaled: bool = False  # values scaled far from the reference's own draws (tiny, large): outputs may under/overflow


@dataclass
class Plan:
    init_args: list[list[Any]] = field(default_factory=list)
    cases: list[Case] = field(default_factory=list)
    fresh: list[Any] = field(default_factory=list)  # another draw at the main case's shapes (caching check)
    changed: list[list[Any]] = field(default_factory=list)  # `fresh`, one element changed per call (cumulative)
    spares: list[list[Any]] = field(default_factory=list)  # more draws there, for judging the task's strength
    notes: list[str] = field(default_factory=list)

    def model_index(self, init: list[Any]) -> int:
        if init not in self.init_args:
            self.init_args.append(init)
        return self.init_args.index(init)


@dataclass
class References:
    """The reference model, built afresh whenever one is needed (in the task's dtype, in float64, with other weights):
    a copy made with deepcopy keeps whatever the original's functions close over, so a torch.compile'd method of
    the original would still run the original's weights. Every instance holds the first one's state dict."""
    module: ModuleType
    init_args: list[list[Any]]
    init_seed: int
    state_dicts: dict[int, dict[str, Any]] = field(default_factory=dict)

    def build(self, model: int, state_dict: dict[str, Any] | None = None,
              dtype: torch.dtype | None = None) -> torch.nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.init_seed)  # KernelBench's convention: the candidate is seeded alike
            instance = self.module.Model(*self.init_args[model])
        if model not in self.state_dicts:
            self.state_dicts[model] = instance.state_dict()
        instance.load_state_dict(state_dict if state_dict is not None else self.state_dicts[model])
        return (instance.to(dtype) if dtype is not None else instance).eval()

    def twin(self, model: int, state_dict: dict[str, Any] | None = None) -> torch.nn.Module | None:
        """The float64 twin numerics measures errors against; None where the model has none."""
        try:
            return self.build(model, state_dict, torch.float64)
        except Exception:
            return None

    def alternates(self, model: int, seed: int) -> list[tuple[str, dict[str, Any]]]:
        """(what changed, a whole state dict) of new weights for the result_caching check, drawn afresh from the loaded
        ones (`redrawn`): every float parameter, every float buffer (running statistics and the like), and both
        together, each copied into the candidate's own parameters and buffers; only those that change something."""
        instance = self.build(model)
        base = instance.state_dict()
        parameters = {name for name, _ in instance.named_parameters()}
        gen = torch.Generator().manual_seed(seed + 7)
        moved = {name: redrawn(t, gen) for name, t in base.items() if isinstance(t, torch.Tensor) and
                 t.is_floating_point() and t.numel() and bool(torch.isfinite(t).all()) and
                 (name in parameters or not _mask_buffer(t))}
        kinds = [("parameters", {n: t for n, t in moved.items() if n in parameters}),
                 ("buffers (running statistics and the like)", {n: t for n, t in moved.items() if n not in parameters})]
        found = [(label, {**base, **changed}) for label, changed in kinds if changed]
        if len(found) == 2:
            found.append(("parameters and buffers", {**base, **moved}))
        return found


def _mask_buffer(t: torch.Tensor) -> bool:
    """A float buffer that is a mask (a causal pattern of 0s and 1s, both present): part of the architecture, not a
    state the model learned; all zeros or all ones are statistics at their start (a running mean or variance)."""
    return bool(((t == 0) | (t == 1)).all()) and bool((t == 0).any()) and bool((t == 1).any())


def redrawn(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """`t` scaled elementwise by a factor in [0.5, 1.5) and moved by an offset of about half its spread (its mean
    magnitude where it has no spread, else 1): zeros (a bias, a running mean) become non-zero, ones (a norm's weight,
    a running variance) vary, and a tensor whose values are all positive stays positive (a variance or a scale must)."""
    x = t.double()
    size = (float(x.std()) if x.numel() > 1 else 0.0) or float(x.abs().mean()) or 1.0
    offset = torch.randn(x.shape, generator=gen, dtype=torch.float64) * 0.5 * size
    factor = 0.5 + torch.rand(x.shape, generator=gen, dtype=torch.float64)
    return (x * factor + (offset.abs() if bool((x > 0).all()) else offset)).to(t.dtype)


@contextlib.contextmanager
def overrides(module: ModuleType, values: dict[str, Any]) -> Iterator[None]:
    saved = {k: getattr(module, k) for k in values}
    for k, v in values.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(module, k, v)


def draw(module: ModuleType, values: dict[str, Any], seed: int) -> tuple[list[Any], list[Any]]:
    """(init args, inputs) from the reference's own functions with `values` set, under `seed`."""
    with overrides(module, values), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return list(module.get_init_inputs()), list(module.get_inputs())


def _nbytes(objs: Any) -> int:
    if isinstance(objs, torch.Tensor):
        return objs.numel() * objs.element_size()
    if isinstance(objs, (list, tuple)):
        return sum(_nbytes(o) for o in objs)
    return 0


class _PeakMemory(TorchDispatchMode):
    """Bytes of the tensors ops create that are alive at once (views and in-place results share their input's
    memory and are not counted), at their peak: what running the model needs beyond its inputs and weights."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0

    def _free(self, nbytes: int) -> None:
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        results = out if isinstance(out, (tuple, list)) else [out]
        for i, t in enumerate(results):
            returns = func._schema.returns
            if isinstance(t, torch.Tensor) and not (i < len(returns) and returns[i].alias_info is not None):
                nbytes = t.numel() * t.element_size()
                self.live += nbytes
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._free, nbytes)
        return out


def footprint(module: ModuleType, values: dict[str, Any]) -> int | None:
    """Bytes of inputs and weights, and of the intermediates and outputs alive at once at their peak, at these
    constants, measured on the meta device (nothing allocated); None when the reference cannot run there."""
    try:
        with overrides(module, values), torch.device("meta"), torch.no_grad():
            init, inputs = list(module.get_init_inputs()), list(module.get_inputs())
            model = module.Model(*init)
            total = _nbytes(inputs) + sum(_nbytes(p) for p in model.state_dict().values())
            try:
                with _PeakMemory() as peak:
                    outputs = model(*inputs)
                total += max(peak.peak, _nbytes(outputs))
            except Exception:
                total += _nbytes(inputs)  # an op with no meta kernel: assume outputs as large as inputs
            return total
    except Exception:
        return None


def size_constants(module: ModuleType) -> dict[str, int]:
    """Module-level integers (and integers inside tuple constants, as `name[i]`) that size the inputs or
    the weights."""
    try:
        with torch.device("meta"):
            dims = {d for x in module.get_inputs() if isinstance(x, torch.Tensor) for d in x.shape}
            dims |= {a for a in module.get_init_inputs() if isinstance(a, int) and not isinstance(a, bool)}
    except Exception:
        return {}
    found = {}
    for k, v in vars(module).items():
        items = [(k, v)] if type(v) is int else [(f"{k}[{i}]", e) for i, e in enumerate(v)] \
            if type(v) is tuple and all(type(e) is int for e in v) else []
        found.update({name: e for name, e in items if not k.startswith("_") and e >= MIN_SCALED // 2 and e in dims})
    return found


def materialize(module: ModuleType, values: dict[str, int]) -> dict[str, Any]:
    """Module globals for `values`, rebuilding tuple constants from their `name[i]` entries."""
    out: dict[str, Any] = {}
    for key, v in values.items():
        if key.endswith("]"):
            name, index = key[:-1].split("[")
            items = list(out.get(name, getattr(module, name)))
            items[int(index)] = v
            out[name] = tuple(items)
        else:
            out[key] = v
    return out


def _groups(names: dict[str, int]) -> list[list[str]]:
    """Constants with equal values move together: equal sizes are often equal on purpose (a square matmul,
    a loss whose batch broadcasts against its features)."""
    by_value: dict[int, list[str]] = {}
    for k, v in names.items():
        by_value.setdefault(v, []).append(k)
    return list(by_value.values())


def scale_down(module: ModuleType, names: dict[str, int], budget: int) -> dict[str, int]:
    """Halve the largest group of size constants until the problem fits `budget` bytes."""
    values = dict(names)
    groups = _groups(names)
    for _ in range(64):
        size = footprint(module, materialize(module, values))
        if size is not None and size <= budget:
            break
        group = max((g for g in groups if values[g[0]] > MIN_SCALED), key=lambda g: values[g[0]], default=None)
        if group is None:
            break
        for k in group:
            values[k] = max(MIN_SCALED, values[k] // 2)
    return values


def fuzz_constants(scaled: dict[str, int], originals: dict[str, int]) -> list[tuple[str, dict[str, int]]]:
    """1, primes (per group of equal constants, then for every constant on its own), non-multiples."""
    groups = _groups(originals)
    if not groups:
        return []

    def label(kind: str, values: dict[str, int]) -> str:
        return kind + " " + ",".join(f"{k}={v}" for k, v in values.items())

    first = {**scaled, **{k: 1 for k in groups[0]}}
    primes: dict[str, int] = {}
    for g in groups:
        p = next((p for p in PRIMES if p <= scaled[g[0]] and p not in primes.values()), 3)
        primes.update({k: p for k in g})
    small = {k: (3, 5, 7, 11, 13, 17, 19, 23)[i % 8] for i, k in enumerate(scaled)}
    odd = {k: scaled[k] // 2 + 1 for k in scaled}
    return [(label("size 1:", {k: 1 for k in groups[0]}), first), (label("primes", primes), primes),
            (label("independent primes", small), small), (label("non-multiples", odd), odd)]


def past(n: int) -> int:
    """A size well past `n`: one past the smallest power of two no smaller than PAST_FACTOR·n and PAST_ROWS (n = 32 or
    64: 257; 100: 513), a size no table, buffer or grid made for `n` or for "enough" rows covers."""
    power = 1 << max(PAST_FACTOR * n - 1, PAST_ROWS - 1).bit_length()
    return power + 1


def shape_sets(task: Task, grow: Callable[[int], int] = past) -> list[list[list[int]]]:
    """For optimize's tasks: the observed shapes, each fuzz size in the first free dim (other free dims
    at 1), a mix, then the first free dim grown well past the observed size (`grow`)."""
    sets = [task.input_shapes]
    for size in FUZZ_SIZES:
        sets.append([[size if i == free[0] else (1 if i in free else d) for i, d in enumerate(shape)] if free
                     else list(shape) for shape, free in zip(task.input_shapes, task.free_dims, strict=True)])
    mixed = [[(5 if i == free[-1] else 3) if i in free else d for i, d in enumerate(shape)]
             for shape, free in zip(task.input_shapes, task.free_dims, strict=True)]
    beyond = [[grow(d) if free and i == free[0] else d for i, d in enumerate(shape)]
              for shape, free in zip(task.input_shapes, task.free_dims, strict=True)]
    sets += [s for s in (mixed, beyond) if s not in sets]
    return sets


def observed_within(module: ModuleType, task: Task, budget: int) -> Task:
    """The task with the free dims of its observed shapes halved (to 1 at least) until they fit `budget` bytes."""
    shapes = [list(s) for s in task.input_shapes]
    for _ in range(64):
        size = footprint(module, {"INPUT_SHAPES": shapes})
        free = [(i, d) for i, dims in enumerate(task.free_dims) for d in dims if shapes[i][d] > 1]
        if (size is not None and size <= budget) or not free:
            break
        for i, d in free:
            shapes[i][d] //= 2
    return task.model_copy(update={"input_shapes": shapes})


def _size_variants(module: ModuleType, task: Task, plan: Plan, budget: SizeBudget) -> list[tuple[str, dict[str, Any]]]:
    """(label, module constants) for each size the candidate is run at; the first is the main case."""
    if task.free_dims and any(task.free_dims) and hasattr(module, "INPUT_SHAPES"):
        if budget.observed is not None:
            task = observed_within(module, task, budget.observed)
        sets = shape_sets(task)
        if not _fits(module, {"INPUT_SHAPES": sets[-1]}, budget.original):  # grown well past the observed, else 2n + 1
            sets = shape_sets(task, lambda n: 2 * n + 1)
            sets = sets if _fits(module, {"INPUT_SHAPES": sets[-1]}, budget.original) else sets[:-1]
        return [("observed" if i == 0 else f"fuzz {s}", {"INPUT_SHAPES": s}) for i, s in enumerate(sets)]
    names = size_constants(module)
    scaled = scale_down(module, names, budget.scaled)
    original = footprint(module, {})
    if scaled != names:
        plan.notes.append("scaled " + ", ".join(f"{k} {names[k]}→{v}" for k, v in scaled.items() if v != names[k]))
    variants = [("scaled" if scaled != names else "original", materialize(module, scaled))]
    if scaled != names:
        if original is not None and original <= budget.original:
            variants.append(("original", {}))
        else:
            large = scale_down(module, names, budget.large)
            size = footprint(module, materialize(module, large))
            plan.notes.append((f"original sizes not run: {original / 2**20:.0f} MiB (inputs, weights and the "
                               f"intermediates alive at once) is over the {budget.original >> 20} MiB budget"
                               if original else "original sizes not run: they could not be measured") +
                              (f"; run at {size / 2**20:.0f} MiB instead" if large != scaled and size else ""))
            if large != scaled and size:
                variants.append(("large sizes: " + ",".join(f"{k}={v}" for k, v in large.items() if v != scaled[k]),
                                 materialize(module, large)))
    fuzzed = fuzz_constants(scaled, names) + _beyond(module, scaled, budget.original)
    return variants + [(f"fuzz {label}", materialize(module, values)) for label, values in fuzzed]


def _fits(module: ModuleType, values: dict[str, Any], budget: int) -> bool:
    size = footprint(module, values)
    return size is not None and size <= budget


def _beyond(module: ModuleType, scaled: dict[str, int], budget: int) -> list[tuple[str, dict[str, int]]]:
    """One group of size constants well past the scaled value (`past`; where that does not fit, 2n + 1), the first
    group for which the problem still fits `budget` bytes."""
    for group in _groups(scaled):
        for grow in (past, lambda n: 2 * n + 1):
            values = {**scaled, **{k: grow(scaled[k]) for k in group}}
            if _fits(module, materialize(module, values), budget):
                return [("beyond the scaled sizes: " + ",".join(f"{k}={values[k]}" for k in group), values)]
    return []


def _rescaled(inputs: list[Any], kind: str, gen: torch.Generator) -> list[Any]:
    out = []
    for x in inputs:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            out.append(x)
        elif kind in VALUE_VARIANTS:
            out.append(x * VALUE_VARIANTS[kind])
        else:  # signed zeros and subnormals in 2% of places each
            y = x.clone()
            u = torch.rand(y.shape, generator=gen)
            y[u < 0.02] = -0.0
            y[(u >= 0.02) & (u < 0.04)] = torch.finfo(y.dtype).tiny / 4
            out.append(y)
    return out


def _ranged(inputs: list[Any], top: float) -> list[Any]:
    """Float inputs that are not masks scaled so their largest magnitude is `top`, or NEAR_MAX of their dtype's largest
    finite value where that is less."""
    out = []
    for x in inputs:
        peak = float(x.double().abs().max()) if isinstance(x, torch.Tensor) and x.is_floating_point() and \
            x.numel() and not is_mask(x) else 0.0
        if not peak or not math.isfinite(peak):
            out.append(x)
            continue
        limit = min(top, NEAR_MAX * float(torch.finfo(x.dtype).max))
        out.append((x.double() * (limit / peak)).to(x.dtype))
    return out


def _range_cases(module: ModuleType, init: list[Any], inputs: list[Any], main_label: str, model: int) -> list[Case]:
    """Values up to the dtype's range: past float16's largest (where the dtype reaches past it), and near the largest
    the reference keeps finite (`_near_range`)."""
    dtypes = {x.dtype for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point() and not is_mask(x)}
    cases = []
    if any(torch.finfo(d).max > PAST_FLOAT16 for d in dtypes):
        cases.append(Case(f"inputs past float16's range (up to {PAST_FLOAT16:.3g}) at {main_label} sizes", model,
                          _ranged(inputs, PAST_FLOAT16), rescaled=True))
    top = _near_range(module, init, inputs, dtypes)
    if top is not None:
        cases.append(Case(f"inputs near the largest values the reference keeps finite (up to {top:.3g}) at "
                          f"{main_label} sizes", model, _ranged(inputs, top), rescaled=True))
    return cases


def _near_range(module: ModuleType, init: list[Any], inputs: list[Any], dtypes: set[torch.dtype]) -> float | None:
    """The largest magnitude, from near the dtype's largest value down by factors of RANGE_STEP, at which the reference
    gives no more NaN/Inf than on its own draw, divided by RANGE_STEP once more: room for another order of the same
    sums (a reduction's partial sums overflow by the order they are added in). None where no dtype or no scale fits."""
    if not dtypes:
        return None
    baseline = _nonfinite(module, init, inputs)
    top = NEAR_MAX * min(float(torch.finfo(d).max) for d in dtypes)
    for _ in range(RANGE_STEPS):
        if baseline is not None and _nonfinite(module, init, _ranged(inputs, top)) == baseline:
            return top / RANGE_STEP
        top /= RANGE_STEP
    return None


def _nonfinite(module: ModuleType, init: list[Any], inputs: list[Any]) -> int | None:
    """NaN/Inf elements in the reference's float outputs on `inputs`; None where it raises."""
    try:
        with torch.inference_mode(), torch.random.fork_rng(devices=[]):
            found = outs(module.Model(*init).eval()(*inputs))
    except Exception:
        return None
    return sum(int((~torch.isfinite(t)).sum()) for t in found if isinstance(t, torch.Tensor) and t.is_floating_point())


def is_mask(x: Any) -> bool:
    """A mask input: bool, only 0s and 1s, or a float tensor that already carries -inf (an additive mask)."""
    if not isinstance(x, torch.Tensor) or x.numel() < 2:
        return False
    if x.dtype == torch.bool:
        return True
    if x.is_floating_point():
        return bool(torch.isneginf(x).any()) or bool(((x == 0) | (x == 1)).all())
    return bool(((x == 0) | (x == 1)).all())


def _edited(x: torch.Tensor, edit: Callable[[torch.Tensor], None]) -> torch.Tensor:
    """A copy of `x` in x's own layout (a transposed view stays transposed) with `edit` applied to its values, handed
    over as one contiguous tensor of x's shape."""
    values = x.contiguous().clone()
    edit(values)
    return x.clone().copy_(values)


def _with_specials(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """±inf and NaN in SPECIAL_SHARE of the elements, at least one of each."""

    def edit(y: torch.Tensor) -> None:
        flat = y.view(-1)
        count = max(3, int(flat.numel() * SPECIAL_SHARE)) if flat.numel() >= 3 else flat.numel()
        where = torch.randperm(flat.numel(), generator=gen)[:count]
        for i, index in enumerate(where.tolist()):
            flat[index] = (float("inf"), float("-inf"), float("nan"))[i % 3]

    return _edited(x, edit)


def _masked_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows (along the last dim) fully masked, fully kept and left-padded, in both polarities where the mask's
    meaning is not known (bool, 0/1); an additive float mask masks with -inf."""
    additive = x.is_floating_point() and (bool(torch.isneginf(x).any()) or not bool((x != 0).any()))
    masked, kept = (float("-inf"), 0.0) if additive else (False, True) if x.dtype == torch.bool else (0, 1)
    patterns = [(masked, masked), (masked, kept)] if additive else \
        [(masked, masked), (kept, kept), (masked, kept), (kept, masked)]

    def edit(y: torch.Tensor) -> None:
        rows = y.view(-1, y.shape[-1]) if y.dim() else y.view(1, 1)
        width = rows.shape[1]
        for r, (left, right) in enumerate(patterns[:rows.shape[0]]):
            rows[r, :max(1, width // 2)] = left
            rows[r, max(1, width // 2):] = right

    return _edited(x, edit)


def _changed_one_element(inputs: list[Any], gen: torch.Generator) -> list[Any]:
    """A copy with one element of each float input (else of one integer input) set to another element's value."""
    tensors = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.numel() > 1 and not is_mask(x)]
    floats = [i for i in tensors if inputs[i].is_floating_point()]
    changed = set(floats or [i for i in tensors if inputs[i].dtype != torch.bool][:1])

    def edit(flat_of: torch.Tensor) -> None:
        flat = flat_of.view(-1)
        i, j = torch.randint(0, flat.numel(), (2,), generator=gen).tolist()
        different = torch.nonzero(flat != flat[i]).view(-1)
        if different.numel():
            j = int(different[torch.randint(0, different.numel(), (1,), generator=gen)])
        flat[i] = flat[j]

    return [_edited(x, edit) if k in changed else x.clone() if isinstance(x, torch.Tensor) else x
            for k, x in enumerate(inputs)]


def _strided(x: Any) -> Any:
    """The same values in a non-contiguous layout, as a slice of a fused projection's output has: the first half of
    rows twice as long (a 1-d input: every other element). A kernel that walks data_ptr() as if the tensor were
    contiguous reads the wrong elements; one that follows the strides (or calls .contiguous()) does not."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.numel() < 2:
        return x
    base = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)
    view = base[..., :x.shape[-1]] if x.dim() > 1 and x.shape[:-1].numel() > 1 else base[..., ::2]
    view.copy_(x)
    return view


def _other_layout(x: Any) -> Any:
    """The same values in the other memory order: a row-major input column-major (every dim's order reversed, as a
    transposed matrix is: the last dim has the largest stride), any other layout row-major."""
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.numel() < 2:
        return x
    if not x.is_contiguous():
        return x.contiguous()
    dims = list(range(x.dim()))[::-1]
    flipped = x.permute(dims).contiguous().permute(dims)
    return x if flipped.is_contiguous() else flipped  # a matrix of one row or column: no other order


def _offset(x: Any) -> Any:
    """A float input that is not a mask, moved by a mean a thousand times its spread: a one-pass variance
    (E[x²] - E[x]²) loses every digit there, a two-pass one none."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or is_mask(x) or x.numel() < 2:
        return x
    spread_ = float(x.double().std()) or 1.0
    return x + 1e3 * spread_


def _permuted_rows(inputs: list[Any], gen: torch.Generator) -> list[Any] | None:
    """The same inputs with their rows in another order: along the first dim of size > 1 of the first float input,
    the same permutation for every input with that dim. None when there is nothing to permute."""
    first = next((x for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point() and not is_mask(x)),
                 None)
    dim = next((d for d in range(first.dim() - 1) if first.shape[d] > 1), None) if first is not None else None
    if dim is None:
        return None
    size = first.shape[dim]
    perm = torch.randperm(size, generator=gen)
    while size > 1 and bool((perm == torch.arange(size)).all()):
        perm = torch.randperm(size, generator=gen)
    return [x.index_select(dim, perm) if isinstance(x, torch.Tensor) and x.dim() > dim and x.shape[dim] == size
            else x for x in inputs]


def _runs_on(module: ModuleType, init: list[Any], inputs: list[Any]) -> Exception | None:
    """None when the reference runs on `inputs`, else what it raised."""
    try:
        with torch.inference_mode(), torch.random.fork_rng(devices=[]):
            module.Model(*init).eval()(*inputs)
    except Exception as exc:
        return exc
    return None


def _special_cases(module: ModuleType, init: list[Any], inputs: list[Any], main_label: str, model: int,
                   gen: torch.Generator, notes: list[str]) -> list[Case]:
    """Special-value and masked-row cases, each kept where the reference runs on it."""
    variants = []
    if any(isinstance(x, torch.Tensor) and x.is_floating_point() and not is_mask(x) for x in inputs):
        variants.append((f"inputs with ±inf and NaN at {main_label} sizes",
                         [_with_specials(x, gen) if isinstance(x, torch.Tensor) and x.is_floating_point()
                          and not is_mask(x) else x for x in inputs]))
    if any(is_mask(x) for x in inputs):
        variants.append((f"inputs with fully masked and left-padded rows at {main_label} sizes",
                         [_masked_rows(x) if is_mask(x) else x for x in inputs]))
    return _kept(module, init, [Case(label, model, values, special=True) for label, values in variants], notes)


def _kept(module: ModuleType, init: list[Any], candidates: list[Case], notes: list[str]) -> list[Case]:
    """The cases the reference itself runs on; a note for each it rejects."""
    cases = []
    for case in candidates:
        exc = _runs_on(module, init, case.inputs)
        if exc is not None:
            notes.append(f"{case.label}: skipped, the reference itself rejects them ({type(exc).__name__})")
            continue
        cases.append(case)
    return cases


def _layout_and_order_cases(module: ModuleType, init: list[Any], main: Case, main_label: str, offset_draw: list[Any],
                            gen: torch.Generator, notes: list[str]) -> list[Case]:
    """The main case's own values in a non-contiguous layout, in the other memory order (transposed, whatever the
    reference's own layout) and with their rows permuted (a memo keyed on something blind to order returns the first
    call's rows), and a fresh draw moved by a large mean."""
    candidates = [Case(f"non-contiguous inputs at {main_label} sizes", main.model, [_strided(x) for x in main.inputs])]
    flipped = [_other_layout(x) for x in main.inputs]
    if any(a is not b for a, b in zip(flipped, main.inputs, strict=True)):
        candidates.append(Case(f"inputs in the other memory order (transposed) at {main_label} sizes", main.model,
                               flipped))
    candidates += [Case(f"inputs offset by a large mean at {main_label} sizes", main.model,
                        [_offset(x) for x in offset_draw], rescaled=True)]
    permuted = _permuted_rows(main.inputs, gen)
    if permuted is not None:
        candidates.append(Case(f"the main inputs with their rows permuted at {main_label} sizes", main.model,
                               permuted))
    return _kept(module, init, candidates, notes)


def _complete(module: ModuleType, task: Task) -> None:
    """A reference with only a Model takes its shapes and init args from the task."""
    if not hasattr(module, "get_inputs"):
        dtype = getattr(torch, task.dtype)
        module.INPUT_SHAPES = task.input_shapes
        module.get_inputs = lambda: [torch.randn(s, dtype=dtype) for s in module.INPUT_SHAPES]
    if not hasattr(module, "get_init_inputs"):
        module.get_init_inputs = lambda: list(task.init_args)


def inputs_at(module: ModuleType, task: Task, seed: int) -> list[Any]:
    """One draw of inputs at the task's own sizes (the benchmark's), from the reference's get_inputs()."""
    _complete(module, task)
    return draw(module, {"INPUT_SHAPES": task.input_shapes} if hasattr(module, "INPUT_SHAPES") else {}, seed)[1]


def plan(module: ModuleType, task: Task, seed: int, trials: int = 1, budget: SizeBudget = FULL) -> Plan:
    """Models and input sets at sizes that fit `budget`; raises WeakTask for references a constant or an input could
    pass."""
    _complete(module, task)
    result = Plan()
    gen = torch.Generator().manual_seed(seed)
    seeds = iter(torch.randint(0, 2**62, (64 + trials,), generator=gen).tolist())
    for label, values in _size_variants(module, task, result, budget):
        try:
            init, inputs = draw(module, values, next(seeds))
            failed = _runs_on(module, init, inputs)
            if failed is not None:
                raise failed
        except Exception as exc:
            if not result.cases:
                raise KernelbotError(
                    f"the reference does not run at {label} sizes ({type(exc).__name__}: {exc})") from None
            result.notes.append(f"{label}: skipped, the reference itself fails there ({type(exc).__name__})")
            continue
        result.cases.append(Case(label, result.model_index(init), inputs))
        if len(result.cases) == 1:
            main_values, main_label = values, label
    main = result.cases[0]
    for trial in range(2, trials + 1):
        result.cases.append(Case(f"trial {trial} at {main_label} sizes", main.model,
                                 draw(module, main_values, next(seeds))[1]))
    for kind in (*VALUE_VARIANTS, "zeros"):
        label = "inputs with signed zeros and subnormals" if kind == "zeros" else f"{kind} inputs"
        result.cases.append(Case(f"{label} at {main_label} sizes", main.model,
                                 _rescaled(draw(module, main_values, next(seeds))[1], kind, gen),
                                 rescaled=kind in VALUE_VARIANTS))
    init = result.init_args[main.model]
    result.cases += _kept(module, init, _range_cases(module, init, draw(module, main_values, next(seeds))[1],
                                                     main_label, main.model), result.notes)
    special_inputs = draw(module, main_values, next(seeds))[1]
    result.cases += _special_cases(module, result.init_args[main.model], special_inputs, main_label, main.model, gen,
                                   result.notes)
    result.cases += _layout_and_order_cases(module, result.init_args[main.model], main, main_label,
                                            draw(module, main_values, next(seeds))[1], gen, result.notes)
    result.fresh = draw(module, main_values, next(seeds))[1]
    result.spares = [draw(module, main_values, next(seeds))[1] for _ in range(STRENGTH_DRAWS - 1)]
    current = result.fresh
    for _ in range(ELEMENT_CHANGES):
        current = _changed_one_element(current, gen)
        result.changed.append(current)
    return result


def check_strength(module: ModuleType, plan_: Plan, init_seed: int) -> None:
    """Refuse references whose output barely depends on their inputs, or that do not repeat themselves."""
    main = plan_.cases[0]
    with torch.inference_mode(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(init_seed)
        model = module.Model(*plan_.init_args[main.model]).eval()
        first, again = outs(model(*main.inputs)), outs(model(*main.inputs))
        others = [outs(model(*inputs)) for inputs in [plan_.fresh, *plan_.spares]]
    for i, (a, b) in enumerate(zip(first, again, strict=True)):
        if not isinstance(a, torch.Tensor):
            continue
        if not torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)):
            raise WeakTask("refused: the reference gives different results on the same inputs (nondeterministic)")
        # the median over several independent draws: one pair alone can land close by chance
        moved = statistics.median(spread(a, other[i]) for other in others)
        if moved < WEAK_TASK_SPREAD:
            raise WeakTask(f"refused as a weak task: the output barely depends on the inputs (it moves by "
                           f"{moved:.1e} between independent input draws (median of {len(others)}); a constant "
                           "could pass)")
