"""What a candidate is verified on: models and input sets built from the reference module, in the parent.

Sizes come from the reference's own module-level constants (KernelBench style: `batch_size = 16`,
`dim = 16384`, used by `get_inputs()` and `get_init_inputs()`): constants that size inputs or weights are
scaled down until the problem fits `SCALED_BYTES` (KernelBench ships inputs of several GB), the original
sizes are kept as well when they fit `ORIGINAL_BYTES`, and fuzzed sizes — 1, primes, non-multiples of
any block size — are set through the same constants, so shapes that must agree keep agreeing. Tasks made
by `kernelbot optimize` carry `INPUT_SHAPES` with their observed shapes and free (batch/token) dims; those
dims are fuzzed instead. Input values come from the reference's own `get_inputs()` under a seed the
candidate never sees (so value ranges the op needs are kept), then rescaled: tiny, large, and with signed
zeros and subnormals sprinkled in. Special values follow: ±inf and NaN sprinkled into float inputs that are
not masks, and, where the reference takes a mask (bool, 0/1, or additive -inf), rows fully masked and
left-padded in both polarities; each is kept only where the reference itself runs on it. Integer and
boolean inputs that are not masks (token ids, positions) always stay as drawn. For the caching check, the
fresh draw is also changed one element at a time (copied from another element, so it stays in range).
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from kernelbot import KernelbotError
from kernelbot.agent.verify.numerics import WEAK_TASK_SPREAD, outs, spread
from kernelbot.records import Task

SCALED_BYTES = 16 << 20  # inputs + weights + outputs of the main case
ORIGINAL_BYTES = 64 << 20  # the reference's own sizes are verified too when they fit this
FUZZ_SIZES = (1, 3, 7, 13, 31)  # 1, primes, non-multiples of every block size
PRIMES = (61, 53, 47, 43, 41, 37, 31, 29, 23, 19, 17, 13, 11, 7, 5, 3)
MIN_SCALED = 16  # constants are never scaled below this (kernel sizes, groups and the like stay put)
VALUE_VARIANTS = {"tiny": 1e-3, "large": 1e3}
STRENGTH_DRAWS = 5  # independent input draws a reference's output is compared across
SPECIAL_SHARE = 0.01  # of a float input's elements set to +inf, -inf or NaN (at least one of each)
ELEMENT_CHANGES = 3  # calls on the same tensors with one element changed


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


def footprint(module: ModuleType, values: dict[str, Any]) -> int | None:
    """Bytes of inputs, weights and outputs at these constants, measured on the meta device (nothing
    allocated); None when the reference cannot run there."""
    try:
        with overrides(module, values), torch.device("meta"):
            init, inputs = list(module.get_init_inputs()), list(module.get_inputs())
            model = module.Model(*init)
            total = _nbytes(inputs) + sum(_nbytes(p) for p in model.state_dict().values())
            try:
                total += _nbytes(model(*inputs))
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


def shape_sets(task: Task) -> list[list[list[int]]]:
    """For optimize's tasks: the observed shapes, each fuzz size in the first free dim (other free dims
    at 1), then a mix."""
    sets = [task.input_shapes]
    for size in FUZZ_SIZES:
        sets.append([[size if i == free[0] else (1 if i in free else d) for i, d in enumerate(shape)] if free
                     else list(shape) for shape, free in zip(task.input_shapes, task.free_dims, strict=True)])
    mixed = [[(5 if i == free[-1] else 3) if i in free else d for i, d in enumerate(shape)]
             for shape, free in zip(task.input_shapes, task.free_dims, strict=True)]
    if mixed not in sets:
        sets.append(mixed)
    return sets


def _size_variants(module: ModuleType, task: Task, plan: Plan) -> list[tuple[str, dict[str, Any]]]:
    """(label, module constants) for each size the candidate is run at; the first is the main case."""
    if task.free_dims and any(task.free_dims) and hasattr(module, "INPUT_SHAPES"):
        return [("observed" if i == 0 else f"fuzz {s}", {"INPUT_SHAPES": s}) for i, s in enumerate(shape_sets(task))]
    names = size_constants(module)
    scaled = scale_down(module, names, SCALED_BYTES)
    original = footprint(module, {})
    if scaled != names:
        plan.notes.append("scaled " + ", ".join(f"{k} {names[k]}→{v}" for k, v in scaled.items() if v != names[k]))
    variants = [("scaled" if scaled != names else "original", materialize(module, scaled))]
    if scaled != names:
        if original is not None and original <= ORIGINAL_BYTES:
            variants.append(("original", {}))
        else:
            plan.notes.append(f"original sizes not run: {original / 2**20:.0f} MiB is over the "
                              f"{ORIGINAL_BYTES >> 20} MiB budget" if original else "original sizes not run")
    fuzzed = fuzz_constants(scaled, names)
    return variants + [(f"fuzz {label}", materialize(module, values)) for label, values in fuzzed]


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


def is_mask(x: Any) -> bool:
    """A mask input: bool, only 0s and 1s, or a float tensor that already carries -inf (an additive mask)."""
    if not isinstance(x, torch.Tensor) or x.numel() < 2:
        return False
    if x.dtype == torch.bool:
        return True
    if x.is_floating_point():
        return bool(torch.isneginf(x).any()) or bool(((x == 0) | (x == 1)).all())
    return bool(((x == 0) | (x == 1)).all())


def _with_specials(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """±inf and NaN in SPECIAL_SHARE of the elements, at least one of each."""
    y = x.clone()
    flat = y.view(-1)
    count = max(3, int(flat.numel() * SPECIAL_SHARE)) if flat.numel() >= 3 else flat.numel()
    where = torch.randperm(flat.numel(), generator=gen)[:count]
    for i, index in enumerate(where.tolist()):
        flat[index] = (float("inf"), float("-inf"), float("nan"))[i % 3]
    return y


def _masked_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows (along the last dim) fully masked, fully kept and left-padded, in both polarities where the mask's
    meaning is not known (bool, 0/1); an additive float mask masks with -inf."""
    y = x.clone()
    rows = y.view(-1, y.shape[-1]) if y.dim() else y.view(1, 1)
    width = rows.shape[1]
    additive = y.is_floating_point() and (bool(torch.isneginf(x).any()) or not bool((x != 0).any()))
    masked, kept = (float("-inf"), 0.0) if additive else (False, True) if y.dtype == torch.bool else (0, 1)
    patterns = [(masked, masked), (masked, kept)] if additive else \
        [(masked, masked), (kept, kept), (masked, kept), (kept, masked)]
    for r, (left, right) in enumerate(patterns[:rows.shape[0]]):
        rows[r, :max(1, width // 2)] = left
        rows[r, max(1, width // 2):] = right
    return y


def _changed_one_element(inputs: list[Any], gen: torch.Generator) -> list[Any]:
    """A copy with one element of each float input (else of one integer input) set to another element's value."""
    out = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    tensors = [x for x in out if isinstance(x, torch.Tensor) and x.numel() > 1 and not is_mask(x)]
    floats = [x for x in tensors if x.is_floating_point()]
    for x in floats or [x for x in tensors if x.dtype != torch.bool][:1]:
        flat = x.view(-1)
        i, j = torch.randint(0, flat.numel(), (2,), generator=gen).tolist()
        different = torch.nonzero(flat != flat[i]).view(-1)
        if different.numel():
            j = int(different[torch.randint(0, different.numel(), (1,), generator=gen)])
        flat[i] = flat[j]
    return out


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
    cases = []
    for label, values in variants:
        try:
            with torch.inference_mode(), torch.random.fork_rng(devices=[]):
                module.Model(*init).eval()(*values)
        except Exception as exc:
            notes.append(f"{label}: skipped, the reference itself rejects them ({type(exc).__name__})")
            continue
        cases.append(Case(label, model, values, special=True))
    return cases


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


def plan(module: ModuleType, task: Task, seed: int, trials: int = 1) -> Plan:
    """Models and input sets; raises WeakTask for references a constant or an input could pass."""
    _complete(module, task)
    result = Plan()
    gen = torch.Generator().manual_seed(seed)
    seeds = iter(torch.randint(0, 2**62, (64 + trials,), generator=gen).tolist())
    for label, values in _size_variants(module, task, result):
        try:
            init, inputs = draw(module, values, next(seeds))
            with torch.inference_mode(), torch.random.fork_rng(devices=[]):
                module.Model(*init).eval()(*inputs)
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
    special_inputs = draw(module, main_values, next(seeds))[1]
    result.cases += _special_cases(module, result.init_args[main.model], special_inputs, main_label, main.model, gen,
                                   result.notes)
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
