"""The first-version verifier: right kernels pass, wrong, sloppy and misbehaving ones fail with the right check."""

import textwrap

import pytest
from helpers import write_module

from kernelbot.agent.tasks import reference_source
from kernelbot.agent.verify import shape_sets, task_from_reference, verify
from kernelbot.records import Task

RMS_TASK = Task(id="rms", hotspot_id="h", family="rmsnorm", module_class="LlamaRMSNorm", dtype="float32",
                input_shapes=[[8, 1, 64]], free_dims=[[0, 1]], init_args=[64, 1e-6], share=0.1, floor_us=1.0)

RMS_HEADER = """
import torch
from torch import nn

class ModelNew(nn.Module):
    def __init__(self, hidden_size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps
"""


def _verify_rms(tmp_path, forward_body: str, timeout: float = 120.0):
    ref = write_module(tmp_path / "reference.py", reference_source(RMS_TASK))
    cand = write_module(tmp_path / "cand" / "candidate.py",
                        RMS_HEADER + textwrap.indent(textwrap.dedent(forward_body), "    "))
    return verify(RMS_TASK, ref, cand, tmp_path / "work", timeout=timeout)


def test_fuzzed_shapes_cover_one_primes_and_the_observed():
    sets = shape_sets(RMS_TASK)
    assert sets[0] == [[8, 1, 64]]
    firsts = {s[0][0] for s in sets}
    assert {1, 3, 7, 13, 31} <= firsts
    assert len(sets) >= 6
    assert all(s[0][-1] == 64 for s in sets)  # the weight-bound dim never changes


def test_library_kernel_passes(tmp_path):
    ref = write_module(tmp_path / "reference.py", reference_source(RMS_TASK))
    cand = write_module(tmp_path / "cand" / "candidate.py",
                        "from kernelbot.kernel_library.rmsnorm.cpu import RMSNormCpp as ModelNew\n")
    verdict = verify(RMS_TASK, ref, cand, tmp_path / "work")
    assert verdict.verdict == "pass", verdict.checks
    assert {c.id for c in verdict.checks} >= {"compile", "correctness", "unwritten_output", "nondeterminism",
                                              "input_mutation"}


def test_rmsnorm_without_eps_is_rejected(tmp_path):
    verdict = _verify_rms(tmp_path, """
        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)))
    """)
    assert verdict.verdict == "fail"
    assert verdict.failed == ["correctness"]
    assert "tiny inputs" in next(c.detail for c in verdict.checks if c.id == "correctness")


def test_unwritten_output_is_caught(tmp_path):
    verdict = _verify_rms(tmp_path, """
        def forward(self, x):
            out = torch.empty_like(x)
            v = x.pow(2).mean(-1, keepdim=True)
            half = x.shape[-1] // 2
            out[..., :half] = (self.weight * x * torch.rsqrt(v + self.variance_epsilon))[..., :half]
            return out
    """)
    assert "unwritten_output" in verdict.failed


def test_nondeterminism_and_input_mutation_are_caught(tmp_path):
    verdict = _verify_rms(tmp_path, """
        calls = 0
        def forward(self, x):
            ModelNew.calls += 1
            y = self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            x.mul_(2)
            return y + (ModelNew.calls % 2) * 1e-3
    """)
    assert {"nondeterminism", "input_mutation", "correctness"} <= set(verdict.failed)


@pytest.mark.parametrize("body,check", [
    ("def forward(self, x)\n    return x\n", "compile"),
    ("def forward(self, x):\n    raise RuntimeError('kernel launch failed')\n", "crash"),
    ("def forward(self, x):\n    import ctypes\n    ctypes.string_at(0)\n", "crash"),
    ("def forward(self, x):\n    import os\n    os._exit(0)\n", "crash"),
    ("def forward(self, x):\n    while True:\n        pass\n", "timeout"),
])
def test_broken_candidates_get_a_verdict_not_an_exception(tmp_path, body, check):
    verdict = _verify_rms(tmp_path, body, timeout=20.0)
    assert verdict.verdict == "fail"
    assert check in verdict.failed


SOFTMAX_REF = """
import torch
from torch import nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=-1)

batch_size, dim = 16, 257

def get_inputs():
    return [torch.randn(batch_size, dim)]

def get_init_inputs():
    return []
"""


def test_softmax_without_max_subtraction_is_rejected(tmp_path):
    ref = write_module(tmp_path / "softmax.py", SOFTMAX_REF)
    naive = write_module(tmp_path / "naive" / "candidate.py", """
import torch
from torch import nn

class ModelNew(nn.Module):
    def forward(self, x):
        e = torch.exp(x)
        return e / e.sum(-1, keepdim=True)
""")
    stable = write_module(tmp_path / "stable" / "candidate.py", """
import torch
from torch import nn

class ModelNew(nn.Module):
    def forward(self, x):
        e = torch.exp(x - x.max(-1, keepdim=True).values)
        return e / e.sum(-1, keepdim=True)
""")
    task = task_from_reference(ref)
    assert task.input_shapes == [[16, 257]] and task.free_dims == [[0]]
    bad = verify(task, ref, naive, tmp_path / "w1")
    assert bad.failed == ["correctness"]
    assert "large inputs" in next(c.detail for c in bad.checks if c.id == "correctness")
    good = verify(task, ref, stable, tmp_path / "w2")
    assert good.verdict == "pass", good.checks
