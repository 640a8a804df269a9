"""Bad input gets one line naming the problem, exit code 2, never a traceback."""

import gzip
import json
import subprocess
import sys

from helpers import write_module


def kernelbot(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelbot.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0]


def test_unknown_model():
    _one_line_error(kernelbot("optimize", "--model", "gpt-17"), "unknown model", "llama-tiny")


def test_unwritable_run_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    _one_line_error(kernelbot("optimize", "--model", "llama-micro", "--run-dir", str(blocker / "run")),
                    "not writable", "--run-dir")


def test_corrupt_trace(tmp_path):
    bad = tmp_path / "trace.json.gz"
    bad.write_bytes(gzip.compress(json.dumps({"traceEvents": []}).encode())[:15])
    _one_line_error(kernelbot("rank", str(bad)), "trace.json.gz")


def test_a_device_this_host_lacks_or_does_not_know_is_one_line_naming_what_was_found_and_the_fix(tmp_path):
    """cuda:N is a device optimize and verify take (the N-th GPU this process sees); on this CPU-only host it is
    refused as any GPU is, before any run directory exists; a device no one knows is refused as such."""
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here: cuda:N may exist")
    for args in (("optimize", "--device", "cuda:1", "--run-dir", str(tmp_path / "run")),
                 ("verify", str(tmp_path / "ref.py"), str(tmp_path / "c.py"), "--device", "cuda")):
        _one_line_error(kernelbot(*args), f"--device {args[args.index('--device') + 1]}: no CUDA device is visible "
                        "here (torch", "run on a GPU node or use --device cpu")
    assert not (tmp_path / "run").exists()
    _one_line_error(kernelbot("optimize", "--device", "gpu0"), "--device 'gpu0': unknown device", "cuda:N")


def test_an_unknown_target_architecture_is_one_line_naming_the_known_ones(tmp_path):
    _one_line_error(kernelbot("verify", str(tmp_path / "ref.py"), str(tmp_path / "c.py"), "--target", "sm_91"),
                    "--target sm_91: unknown GPU architecture", "sm_90")
    _one_line_error(kernelbot("optimize", "--target", "sm_91", "--run-dir", str(tmp_path / "run")),
                    "--target sm_91: unknown GPU architecture", "sm_90")
    assert not (tmp_path / "run").exists()


def test_optimizes_target_reaches_every_candidates_verification(tmp_path, monkeypatch):
    from kernelbot.agent import generate
    from kernelbot.agent.run_options import OptimizeOptions
    from kernelbot.agent.verify import evaluate
    from kernelbot.records import Candidate, Task

    seen = []
    monkeypatch.setattr(evaluate, "verify", lambda *args, **kwargs: seen.append(kwargs) or 1 / 0)
    task = Task(id="t", hotspot_id="h", family="rmsnorm", module_class="LlamaRMSNorm", dtype="float32",
                input_shapes=[[4, 1, 64]], free_dims=[[0]], init_args=[64], share=0.1, floor_us=1.0)
    cand = Candidate(id="c", task_id="t", backend="triton", proposer="p", config={}, source_hash="h")
    (tmp_path / "c").mkdir()
    out = generate.local_evaluator(task, tmp_path, "cpu", OptimizeOptions(target="sm_80"))(
        cand, tmp_path / "c" / "candidate.py")
    assert seen[0]["target"] == "sm_80" and out.row.reason.startswith("harness error: ZeroDivisionError")


def test_missing_reference(tmp_path):
    _one_line_error(kernelbot("verify", str(tmp_path / "nope.py"), str(tmp_path / "c.py")), "nope.py")


def test_verify_exit_codes_and_json(tmp_path):
    ref = write_module(tmp_path / "ref.py", """
import torch
from torch import nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(6, 40)]

def get_init_inputs():
    return []
""")
    good = write_module(tmp_path / "good" / "candidate.py", """
import torch
import triton
import triton.language as tl
from torch import nn

@triton.jit
def relu(x, y, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    m = o < n
    tl.store(y + o, tl.maximum(tl.load(x + o, mask=m), 0.0), mask=m)

class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        relu[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), B=64)
        return y
""")
    bad = write_module(tmp_path / "bad" / "candidate.py",
                       "import torch\nfrom torch import nn\n\nclass ModelNew(nn.Module):\n"
                       "    def forward(self, x):\n        return x.clamp_min(0.01)\n")
    ok = kernelbot("verify", str(ref), str(good), "--json")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    data = json.loads(ok.stdout)
    assert data["verdict"] == "pass" and data["failed"] == [] and data["seed"] is not None
    assert {c["id"] for c in data["checks"]} >= {"race", "out_of_bounds", "reference_fallback", "result_caching"}
    assert all(set(c) >= {"id", "status", "detail"} for c in data["checks"])
    # the compile gate: the launched kernel compiled for sm_90 (an H100) on this CPU, in the verdict
    build, = data["builds"]
    assert (build["kernel"], build["target"], build["ok"], build["flags"]) == ("relu", "sm_90", True, [])
    assert build["registers"] > 0 and "B=64" in build["specialization"]
    text = kernelbot("verify", str(ref), str(good), "--target", "sm_80")
    assert text.returncode == 0 and "build    triton for sm_80 [" in text.stdout and "relu: " in text.stdout
    fail = kernelbot("verify", str(ref), str(bad), "--json")
    assert fail.returncode == 1
    data = json.loads(fail.stdout)
    assert data["verdict"] == "fail" and "correctness" in data["failed"]
