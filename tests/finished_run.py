"""A finished run's files, written from records (no model run): two accepted kernels (one from an LLM, one built-in)
and rejected candidates with reasons; for the PR and HTML report tests."""

from __future__ import annotations

import json
from pathlib import Path

from kernelbot.records import (
    Bench,
    Candidate,
    Check,
    Device,
    Fidelity,
    Hotspot,
    KernelResult,
    LLMCall,
    LLMUsage,
    ModelSpec,
    Pack,
    PackEntry,
    Report,
    Task,
    Verdict,
)
from kernelbot.rundir import write_record

CHECKS = ["compile", "correctness", "unwritten_output", "out_of_bounds", "race", "nondeterminism", "input_mutation",
          "output_aliasing", "reference_fallback", "result_caching", "precision_downcast", "side_stream",
          "timing_tamper", "timeout", "crash", "sandbox_violation"]


def _hotspot(hid: str, cls: str, family: str | None, share: float, total: float, kernel: str | None = None) -> Hotspot:
    return Hotspot(id=hid, module_class=cls, module_paths=[f"model.layers.0.{cls.lower()}"], family=family,
                   input_dims=[[4, 1, 128], [128]], dtype="float32", calls=40, total_us=total, share=share,
                   flops=40 * 4 * 128 * 4.0, bytes=40 * 4 * 128 * 8.0 + 40 * 512, floor_us=total / 20,
                   score_us=total * 0.95, kernel=kernel)


def fake_run(run_dir: Path) -> Report:
    device = Device(kind="cpu", name="Test CPU", threads=2, peak_gflops=20.0, peak_gbps=4.0, peaks_source="test")
    spec = ModelSpec(name="llama-micro", layers=2, hidden=128, heads=4, intermediate=344, vocab=1000,
                     dtype="float32", batch=4, prompt_len=8, decode_steps=4)
    before = [_hotspot("h00", "Linear", "linear", 0.5, 5000.0), _hotspot("h01", "LlamaRMSNorm", "rmsnorm", 0.2,
                                                                           2000.0),
              _hotspot("h02", "LlamaMLP", "gated_mlp", 0.3, 3000.0)]
    after = [_hotspot("h00", "Linear", "linear", 0.55, 5000.0),
             _hotspot("h01", "LlamaRMSNorm", "rmsnorm", 0.05, 400.0, kernel="t1__llm-r0-s0"),
             _hotspot("h02", "LlamaMLP", "gated_mlp", 0.3, 2500.0, kernel="t2__cpp-1")]
    kernels: list[KernelResult] = []
    entries: list[PackEntry] = []
    for tid, hid, family, cls, cid, proposer, config, speed in (
            ("h01-rmsnorm-4x1x128", "h01", "rmsnorm", "LlamaRMSNorm", "llm-r0-s0", "llm:openai/test-coder",
             {"call": "c0001", "round": 0, "sample": 0}, 3.2),
            ("h02-gated_mlp-4x1x128", "h02", "gated_mlp", "LlamaMLP", "cpp-1", "builtin", {"block": 64}, 1.2)):
        task = Task(id=tid, hotspot_id=hid, family=family, module_class=cls, dtype="float32",
                    input_shapes=[[4, 1, 128]], free_dims=[[0, 1]], init_args=[128], share=0.2, floor_us=0.5)
        tdir = run_dir / "tasks" / tid
        tdir.mkdir(parents=True)
        (tdir / "task.json").write_text(task.model_dump_json())
        (tdir / "reference.py").write_text("class Model: pass\n")
        for cand_id, status, reason, sp in ((cid, "accepted", f"verified; {speed:.2f}x beyond noise", speed),
                                           ("cpp-9", "rejected", "failed race: program 1 wrote bytes 0..64 that "
                                                                 "program 2 read", None)):
            cand = Candidate(id=cand_id, task_id=tid, backend="cpp", proposer=proposer if cand_id == cid else "builtin",
                             config=config if cand_id == cid else {}, source_hash="abc123")
            cdir = tdir / "candidates" / cand_id
            cdir.mkdir(parents=True)
            (cdir / "candidate.py").write_text("class ModelNew: pass\n")
            write_record(cdir / "candidate.json", cand)
            checks = [Check(id=c, status="pass" if status == "accepted" or c != "race" else "fail",
                            detail="no overlapping writes in 3 orders" if c == "race" else "") for c in CHECKS]
            write_record(cdir / "verdict.json", Verdict(
                candidate_id=cand_id, verdict="pass" if status == "accepted" else "fail",
                failed=[] if status == "accepted" else ["race"], checks=checks, shapes=[[[4, 1, 128]], [[1, 1, 128]],
                                                                                        [[7, 3, 128]]],
                seconds=3.5, protections=["pid namespace", "no network"], cases=["observed", "size 1", "primes"],
                seed=424242))
            if sp:
                write_record(cdir / "bench.json", Bench(candidate_id=cand_id, rounds=15, reference_us=10.0,
                                                        candidate_us=10.0 / sp, reference_spread=0.04,
                                                        candidate_spread=0.06, speedup=sp, significant=True))
            kernels.append(KernelResult(op=family, module=cls, backend="cpp", shapes=[[4, 1, 128]], status=status,
                                        reason=reason, speedup=sp, reference_us=10.0 if sp else None,
                                        time_us=10.0 / sp if sp else None, floor_us=0.5, calls=40 if sp else 0,
                                        candidate_id=f"{tid}/{cand_id}", proposer=cand.proposer, hotspot_id=hid,
                                        share=0.2, flops=2048.0, bytes=4608.0))
        if proposer.startswith("llm"):
            (tdir / "llm").mkdir()
            call = LLMCall(id="c0001", task_id=tid, round=0, sample=0, model="openai/test-coder",
                           api_base="http://127.0.0.1:8765/v1", answer="```python\n...```", prompt_tokens=1200,
                           completion_tokens=800, cost_usd=0.0028, cost_known=True, latency_s=4.2,
                           candidate_id=f"{tid}/{cid}", outcome="verified")
            (tdir / "llm" / "c0001.json").write_text(call.model_dump_json())
        entries.append(PackEntry(task_id=tid, candidate_id=f"{tid}__{cid}", family=family, module_class=cls,
                                 input_shapes=[[4, 1, 128]], init_args=[128], dtype="float32", backend="cpp",
                                 config=config, source_file=f"kernels/{tid}__{cid}.py", source_hash="abc123",
                                 verification="pass", speedup=speed))
        (run_dir / "pack" / "kernels").mkdir(parents=True, exist_ok=True)
        (run_dir / "pack" / "kernels" / f"{tid}__{cid}.py").write_text("class ModelNew: pass\n")
    pack = Pack(version="0.1.0+abcdef", run_id=run_dir.name, device=device.name, entries=entries)
    (run_dir / "pack" / "manifest.json").write_text(pack.model_dump_json())
    (run_dir / "timings.json").write_text(json.dumps({"eager": [30.0, 31.0, 29.5], "kernelbot": [20.0, 20.5, 21.0],
                                                      "compiled": []}))
    report = Report(run_id=run_dir.name, model=spec, device=device, baseline_ms=30.0, optimized_ms=20.5,
                    compiled_ms=None, speedup=1.463, speedup_vs_compiled=None, timing_rounds=3,
                    fidelity=Fidelity(max_abs_logit_diff=2e-6, greedy_match=True, token_agreement=1.0),
                    kernels=kernels, hotspots_before=before, hotspots_after=after, notes=["a note"], seconds=95.0,
                    llm=LLMUsage(model="openai/test-coder", calls=1, prompt_tokens=1200, completion_tokens=800,
                                 cost_usd=0.0028, candidates=1, verified=1, accepted=1),
                    iterations=2, budget={"budget_hours": 8.0, "max_cost": 5.0})
    write_record(run_dir / "report.json", report)
    return report
