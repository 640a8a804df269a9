"""Round three's held-out classes, each with a candidate of its own in tests/verify_corpus/: correct kernels the
verifier used to reject (a real Liger-Kernel import, a lock-protected accumulation, exact special values, transposed
reference inputs, a torch.compile'd reference) pass, and the cheats that got through fail for the right check."""

import sys
import types
from pathlib import Path

import pytest
import torch
from helpers import write_module
from test_verify import RMS_TASK

from kernelbot.agent.tasks.references import reference_source
from kernelbot.agent.verify import cases
from kernelbot.agent.verify.bench import bench
from kernelbot.agent.verify.numerics import compare
from kernelbot.agent.verify.run import task_from_reference, verify
from kernelbot.loading import load_module

CORPUS = Path(__file__).resolve().parent / "verify_corpus"


def _verify(tmp_path, reference: str, candidate: str, **kwargs):
    ref = CORPUS / f"{reference}.py"
    return verify(task_from_reference(ref), ref, CORPUS / f"{candidate}.py", tmp_path / "work", seed=4, **kwargs)


def _failed_alone(verdict, check: str) -> None:
    assert verdict.verdict == "fail" and verdict.failed == [check], verdict.problems


@pytest.mark.slow  # an honest Triton kernel passing every case: the two-pass layer norm below stays fast
def test_a_real_liger_kernel_softmax_passes(tmp_path):
    pytest.importorskip("liger_kernel", reason="liger-kernel is not installed (pip install --no-deps liger-kernel)")
    ref = write_module(tmp_path / "softmax.py", (CORPUS / "silu_ref.py").read_text().replace(
        "torch.nn.functional.silu(x)", "torch.softmax(x, dim=-1)"))
    cand = write_module(tmp_path / "liger" / "candidate.py", """
from liger_kernel.ops.softmax import LigerSoftmaxFunction
from torch import nn


class ModelNew(nn.Module):
    def forward(self, x):
        return LigerSoftmaxFunction.apply(x)
""")
    verdict = verify(task_from_reference(ref), ref, cand, tmp_path / "work", seed=4)
    assert verdict.verdict == "pass", verdict.problems
    fallback = next(c.detail for c in verdict.checks if c.id == "reference_fallback")
    assert "Triton launch" in fallback  # the interpreter ran the package's own kernels


def test_a_lock_protected_accumulation_passes_and_reports_its_order_dependence(tmp_path):
    verdict = _verify(tmp_path, "colsum_ref", "colsum_locked")
    assert verdict.verdict == "pass", verdict.problems
    assert any("writes inside a lock in _locked_colsum" in n for n in verdict.notes)


@pytest.mark.slow  # the lockset and atomics rules: the lock-protected accumulation below stays fast
def test_a_ticket_ordered_reduction_is_a_race_though_another_kernel_has_float_atomics(tmp_path):
    verdict = _verify(tmp_path, "colsum_ref", "colsum_ticket")
    _failed_alone(verdict, "race")
    assert "shuffled program order (_total kept in natural order" in \
        next(c.detail for c in verdict.checks if c.id == "race")


def test_an_erf_gelu_exact_at_infinity_passes(tmp_path):
    assert _verify(tmp_path, "gelu_ref", "gelu_erf").verdict == "pass"


def test_a_special_value_must_agree_with_the_native_or_the_float64_reference():
    native, exact = torch.tensor([float("nan"), 1.0]), torch.tensor([float("inf"), 1.0])
    assert compare(torch.tensor([float("inf"), 1.0]), native, exact) is None
    assert compare(torch.tensor([float("nan"), 1.0]), native, exact) is None
    assert "positions must match" in compare(torch.tensor([float("-inf"), 1.0]), native, exact)
    assert "positions must match" in compare(torch.tensor([0.0, 1.0]), native, exact)


def test_a_reference_with_transposed_inputs_is_verified_in_its_own_layout(tmp_path):
    ref = CORPUS / "transposed_ref.py"
    cand = write_module(tmp_path / "self" / "candidate.py", ref.read_text() + "\nModelNew = Model\n")
    verdict = verify(task_from_reference(ref), ref, cand, tmp_path / "work", seed=4)
    _failed_alone(verdict, "reference_fallback")  # itself: right everywhere, with no kernel of its own


@pytest.mark.slow  # in-place changes of a timed call's inputs: test_sandbox_and_bench's fast benchmark tests keep it
def test_the_benchmark_changes_elements_of_transposed_inputs_in_place(tmp_path):
    ref = CORPUS / "transposed_ref.py"
    cand = write_module(tmp_path / "self" / "candidate.py", ref.read_text() + "\nModelNew = Model\n")
    result = bench(task_from_reference(ref), ref, cand, tmp_path / "bench", rounds=2, device="cpu")
    assert result.rounds == 2 and result.candidate_us > 0


@pytest.mark.slow
def test_a_torch_compiled_reference_against_itself_fails_for_compiling_after_it_loaded(tmp_path):
    """torch.compile builds its code on the first call, with processes of its own (compile workers, the C++
    compiler): once a CPU candidate has loaded, the process filter ends its runner for that. Had it run, its code would
    be torch.compile's (reference_fallback)."""
    ref = write_module(tmp_path / "compiled.py", """
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.step = torch.compile(self._step)

    def _step(self, x):
        return torch.nn.functional.gelu(self.proj(x)) * x

    def forward(self, x):
        return self.step(x)


batch_size, dim = 8, 64


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
""")
    cand = write_module(tmp_path / "self" / "candidate.py", ref.read_text() + "\nModelNew = Model\n")
    verdict = verify(task_from_reference(ref), ref, cand, tmp_path / "work", seed=3)
    # a deepcopy of the reference kept running the original's weights (new weights looked stale), its compile
    # threads looked like work left running, and its ISA probe and header hash looked like foreign programs
    assert verdict.verdict == "fail" and "sandbox_violation" in verdict.failed, verdict.problems
    assert any("refused once it loaded" in p for p in verdict.problems), verdict.problems


@pytest.mark.slow
def test_a_cpp_kernel_that_reads_past_its_input_fails_out_of_bounds_under_addresssanitizer(tmp_path):
    load_module(CORPUS / "rowsum_overread.py", "kb_test_rowsum_overread")  # builds it (cached): the sandbox cannot
    verdict = _verify(tmp_path, "rowsum_odd_ref", "rowsum_overread")
    _failed_alone(verdict, "out_of_bounds")
    detail = next(c.detail for c in verdict.checks if c.id == "out_of_bounds")
    assert "guard regions around 1 input buffer(s) intact" in detail  # the guards saw nothing: it writes in bounds
    assert "AddressSanitizer:" in detail and "READ" in detail


@pytest.mark.slow
def test_a_cpp_kernel_that_takes_its_chunks_for_its_threads_fails_race_with_one_thread(tmp_path):
    load_module(CORPUS / "rowsum_threads.py", "kb_test_rowsum_threads")  # builds it (cached): the sandbox cannot
    verdict = _verify(tmp_path, "rowsum_ref", "rowsum_threads")
    _failed_alone(verdict, "race")
    assert "(one thread)" in next(c.detail for c in verdict.checks if c.id == "race")


@pytest.mark.parametrize("reference,candidate,label", [
    ("silu_ref", "silu_flat", "non-contiguous inputs"),
    ("layernorm_ref", "layernorm_one_pass", "offset by a large mean"),
    pytest.param("layernorm_ref", "rows_capped", "beyond the scaled sizes", marks=pytest.mark.slow),
])
def test_a_case_the_plan_never_made_catches_its_cheat(tmp_path, reference, candidate, label):
    verdict = _verify(tmp_path, reference, candidate)
    assert "correctness" in verdict.failed
    assert label in next(c.detail for c in verdict.checks if c.id == "correctness")


def test_the_two_pass_layer_norm_passes_every_case(tmp_path):
    verdict = _verify(tmp_path, "layernorm_ref", "layernorm_two_pass")
    assert verdict.verdict == "pass", verdict.problems
    assert any("offset by a large mean" in c for c in verdict.cases)
    assert any("beyond the scaled sizes" in c for c in verdict.cases)
    assert any("rows permuted" in c for c in verdict.cases)


@pytest.mark.parametrize("baked,verdict_", [pytest.param(False, "pass", marks=pytest.mark.slow), (True, "fail")])
def test_parameters_named_otherwise_still_get_new_weights(tmp_path, baked, verdict_):
    ref = write_module(tmp_path / "reference.py", reference_source(RMS_TASK))
    name = "rmsnorm_renamed_baked" if baked else "rmsnorm_renamed"
    verdict = verify(RMS_TASK, ref, CORPUS / f"{name}.py", tmp_path / "work", seed=4)
    assert verdict.verdict == verdict_, verdict.problems
    caching = next(c.detail for c in verdict.checks if c.id == "result_caching")
    if baked:
        assert verdict.failed == ["result_caching"] and "new weights" in caching
    else:
        assert "so did new weights" in caching


RESHAPED = """
from torch import nn

from kernelbot.kernel_library.rmsnorm.cpp import RMSNormCpp


class ModelNew(RMSNormCpp):
    def __init__(self, *args):
        super().__init__(*args)
        self.scale = nn.Parameter(self.weight.detach().reshape(1, -1).clone())  # named and shaped otherwise
        del self.weight

    def forward(self, x):
        weight = self.scale.detach().reshape(-1).to(x.dtype).contiguous()
        return self._ext.rmsnorm(x.contiguous(), weight, self.variance_epsilon, 8)
"""


def test_parameters_that_match_neither_by_name_nor_in_order_fail_result_caching_saying_why(tmp_path):
    """Right on every input set, but new weights cannot be copied into a (1, n) `scale` for an (n,) `weight`: the
    new-weights test fails, never skipped, and says so."""
    ref = write_module(tmp_path / "reference.py", reference_source(RMS_TASK))
    cand = write_module(tmp_path / "reshaped" / "candidate.py", RESHAPED)
    verdict = verify(RMS_TASK, ref, cand, tmp_path / "work", seed=4)
    _failed_alone(verdict, "result_caching")
    assert "neither by name nor in order" in next(c.detail for c in verdict.checks if c.id == "result_caching")


def _module(source: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, name, "exec"), module.__dict__)
    sys.modules.pop(name, None)
    return module


ATTENTION = """
import torch
from torch import nn


class Model(nn.Module):
    def forward(self, q, k):
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ k


batch, seq, dim = 2, 32768, 64


def get_inputs():
    return [torch.randn(batch, seq, dim), torch.randn(batch, seq, dim)]


def get_init_inputs():
    return []
"""


def test_a_reference_whose_intermediates_need_gigabytes_is_judged_at_a_size_that_fits():
    module = _module(ATTENTION, "kb_test_attention")
    assert cases.footprint(module, {}) > 8 << 30  # 32k x 32k scores, twice: the inputs are 32 MiB
    plan = cases.plan(module, _task(module), seed=1)
    main = plan.cases[0]
    assert main.label == "scaled" and cases.footprint(module, cases.materialize(module, {
        "seq": main.inputs[0].shape[1]})) <= cases.SCALED_BYTES
    assert any("intermediates alive at once" in n for n in plan.notes)
    assert all(c.inputs[0].shape[1] < 32768 for c in plan.cases)


def test_a_reference_over_the_original_budget_is_also_run_at_a_large_size():
    module = _module(ATTENTION.replace("seq, dim = 2, 32768, 64", "seq, dim = 2, 4096, 64"), "kb_test_attention2")
    plan = cases.plan(module, _task(module), seed=1)
    large = [c for c in plan.cases if c.label.startswith("large sizes")]
    assert len(large) == 1 and large[0].inputs[0].shape[1] > plan.cases[0].inputs[0].shape[1]
    assert cases.ORIGINAL_BYTES < cases.footprint(module, cases.materialize(module, {
        "seq": large[0].inputs[0].shape[1]})) <= cases.LARGE_BYTES


def _task(module: types.ModuleType):
    from kernelbot.records import Task

    with torch.device("meta"):
        shapes = [list(x.shape) for x in module.get_inputs()]
    return Task(id="t", hotspot_id="", family="", module_class="Model", dtype="float32", input_shapes=shapes,
                free_dims=[], init_args=[], share=0.0, floor_us=0.0)
