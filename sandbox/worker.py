"""Child side of the sandbox: load a candidate, run it on inputs the parent prepared, write what it saw.

Jobs (job.json in the working directory):
  verify:   run ModelNew on every input set the parent prepared, with the observations agent/verify.py judges
  bench:    time Model (reference) and ModelNew side by side in interleaved rounds
  sanitize: one call on the main input set, for compute-sanitizer to watch
  noop:     nothing (measures the sandbox's own cost per job)
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from kernelbot.agent.numerics import same_bits
from kernelbot.loading import load_module
from kernelbot.sandbox import cuda_check
from kernelbot.sandbox.confine import confine
from kernelbot.sandbox.cuda_check import NeedsGPU

# Bound before any candidate code runs: replacing time.perf_counter later does not reach these.
_clock = time.perf_counter
_cuda_synchronize = torch.cuda.synchronize


class LoadError(Exception):
    """The candidate did not import, build or construct: reported as the `compile` check."""


def _load(path: str, cls: str) -> type:
    try:
        return getattr(load_module(path, f"kb_{cls.lower()}"), cls)
    except NeedsGPU:
        raise
    except Exception as exc:
        raise LoadError(f"{type(exc).__name__}: {exc}") from exc


def _build(model_cls: type, init_args: list[Any], state_dict: str, init_seed: int, notes: list[str]) -> torch.nn.Module:
    try:
        torch.manual_seed(init_seed)  # KernelBench's convention, for candidates whose parameters are named differently
        model = model_cls(*init_args)
        try:
            model.load_state_dict(torch.load(state_dict), strict=True)
        except RuntimeError as exc:
            notes.append(f"reference weights not loadable ({str(exc).splitlines()[0][:200]}); "
                         "the candidate keeps its own seeded initialisation")
    except NeedsGPU:
        raise
    except Exception as exc:
        raise LoadError(f"{type(exc).__name__}: {exc}") from exc
    return model.eval()


def _as_list(out: Any, facts: dict[str, list[str]], label: str) -> list[Any]:
    """Outputs as plain tensors, copied at once; tensor subclasses are refused, not touched."""
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    plain = []
    for o in outs:
        if isinstance(o, torch.Tensor) and type(o) is not torch.Tensor:
            facts["subclass"].append(f"{label}: returned a {type(o).__module__}.{type(o).__qualname__}")
            plain.append(None)
        else:
            plain.append(o.detach().cpu().clone() if isinstance(o, torch.Tensor) else o)
    return plain


def _snapshot(x: Any) -> Any:
    """A copy of a tensor that keeps its whole storage (guard regions included)."""
    if not isinstance(x, torch.Tensor):
        return x
    return torch.empty(0, dtype=x.dtype).set_(x.untyped_storage().clone(), x.storage_offset(), x.shape, x.stride())


def _to(xs: list[Any], device: str) -> list[Any]:
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in xs]


def _clones(xs: list[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.current_stream().synchronize()


def _verify(job: dict[str, Any]) -> dict[str, Any]:
    from kernelbot.sandbox import probes, triton_check

    probes.install()
    if job.get("triton"):
        triton_check.install()
    device = job.get("device", "cpu")
    timers, threads = probes.timing_snapshot(), {t.ident for t in threading.enumerate()}
    plan = torch.load(job["plan"])
    facts: dict[str, list[str]] = {k: [] for k in ("subclass", "aliasing", "late", "threads", "notes")}
    model_cls = _load(job["candidate"], "ModelNew")
    models = [_build(model_cls, init, sd, job["init_seed"], facts["notes"]).to(device)
              for init, sd in zip(plan["init_args"], job["state_dicts"], strict=True)]
    # Fresh allocations come back NaN-filled, so an output element the kernel never wrote stays NaN.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    runs, previous = [], []
    with torch.inference_mode():
        for i, (label, index, inputs) in enumerate(plan["cases"]):
            model, run = models[index], {}
            sent = _to(inputs, device)
            try:
                out = model(*sent)
                _sync(device)
                run["out"] = _as_list(out, facts, label)
                if device == "cuda":
                    torch.cuda.synchronize()  # work left on another stream shows up as a difference
                time.sleep(job.get("settle_s", 0.02))
                if not all(a is None or same_bits(a, b)
                           for a, b in zip(run["out"], _as_list(out, facts, label), strict=True)):
                    facts["late"].append(f"{label}: the output kept changing after the call returned")
                outs = out if isinstance(out, (tuple, list)) else [out]
                facts["aliasing"] += [f"{label}: {a}" for a in probes.aliasing(list(outs), sent, previous)]
                previous = probes.storages(list(outs))
                busy = probes.busy_threads(threads)
                if busy:
                    facts["threads"].append(f"{label}: thread(s) {', '.join(busy)} still running after the call")
                run["again"] = _as_list(model(*_clones(sent)), facts, label)
                if job.get("triton") and i < 2:
                    for order in ("reversed", "shuffled"):
                        triton_check.set_order(order, seed=i)
                        run[order] = _as_list(model(*_clones(sent)), facts, label)
                    triton_check.set_order("natural")
            except Exception as exc:
                run["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
            run["inputs_after"] = [_snapshot(x) for x in sent] if device == "cpu" else []
            runs.append(run)
    extra: dict[str, Any] = {}
    _, main_index, main_inputs = plan["cases"][0]
    model = models[main_index]
    # Result caching: the same tensor objects (same pointers, ids and version counters) with new contents.
    with torch.no_grad():
        sent = _to(main_inputs, device)
        try:
            model(*sent)
            for x, fresh in zip(sent, plan["fresh"], strict=True):
                if isinstance(x, torch.Tensor):
                    x.data.copy_(fresh.to(device))  # through .data: the version counter does not move
            extra["caching_out"] = _as_list(model(*sent), facts, "fresh values in the same tensors")
        except Exception as exc:
            extra["caching_error"] = f"{type(exc).__name__}: {exc}"[:500]
        launches = triton_check.REPORT.launches
        try:
            profile = probes.profile_call(model, _to(plan["fresh"], device))
            if triton_check.REPORT.launches > launches:
                profile["own_kernels"].append(f"{triton_check.REPORT.launches - launches} Triton launch(es)")
        except Exception as exc:
            profile = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    torch.save({"runs": runs, **extra}, "outputs.pt")
    return {"outputs": "outputs.pt", "facts": facts, "timing_tamper": probes.timing_changes(timers),
            "profile": profile, "triton": triton_check.REPORT.as_dict() if job.get("triton") else None}


def _bench(job: dict[str, Any]) -> dict[str, Any]:
    from kernelbot.sandbox import probes

    timers = probes.timing_snapshot()
    device = job.get("device", "cpu")
    notes: list[str] = []
    reference = _build(_load(job["reference"], "Model"), job["init_args"], job["state_dict"], 0, notes).to(device)
    candidate = _build(_load(job["candidate"], "ModelNew"), job["init_args"], job["state_dict"], 0, notes).to(device)
    inputs = [x.to(device) for x in torch.load(job["inputs"])[0]]
    models = [reference, candidate]

    def sync() -> None:
        if device == "cuda":
            _cuda_synchronize()

    with torch.inference_mode():
        for m in models:
            for _ in range(3):
                m(*inputs)
        sync()
        t0 = _clock()
        reference(*inputs)
        sync()
        iters = max(1, min(200, int(job.get("round_seconds", 0.02) / max(_clock() - t0, 1e-6))))
        times: list[list[float]] = [[], []]
        for r in range(job["rounds"]):
            order = (0, 1) if r % 2 == 0 else (1, 0)  # alternate who goes first: drift hits both alike
            for i in order:
                t0 = _clock()
                for _ in range(iters):
                    models[i](*inputs)
                sync()
                times[i].append((_clock() - t0) / iters * 1e6)
    return {"reference_us": times[0], "candidate_us": times[1], "iters": iters,
            "timing_tamper": probes.timing_changes(timers)}


def _sanitize(job: dict[str, Any]) -> dict[str, Any]:
    """One call on the main case, for compute-sanitizer to watch (the parent wraps this process in it)."""
    plan = torch.load(job["plan"])
    model = _build(_load(job["candidate"], "ModelNew"), plan["init_args"][0], job["state_dicts"][0],
                   job["init_seed"], []).to("cuda")
    with torch.inference_mode():
        model(*_to(plan["cases"][0][2], "cuda"))
        torch.cuda.synchronize()
    return {}


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    protections = confine(Path.cwd())  # before any candidate code is imported
    cuda_check.install(Path.cwd())
    try:
        result = {"verify": _verify, "bench": _bench, "sanitize": _sanitize, "noop": lambda job: {}}[job["kind"]](job)
    except NeedsGPU as exc:
        result = {"error": str(exc), "stage": "needs_gpu", "ptxas": cuda_check.REPORTS}
    except Exception as exc:  # the candidate's failure is a result, reported to the parent
        message = str(exc) if isinstance(exc, LoadError) else f"{type(exc).__name__}: {exc}"
        result = {"error": message.strip()[:1500], "stage": "compile" if isinstance(exc, LoadError) else "run",
                  "traceback": traceback.format_exc()[-3000:]}
    result["ptxas"] = cuda_check.REPORTS
    result["protections"] = protections
    Path("result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
