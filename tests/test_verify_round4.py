"""Round four's classes, each with a candidate of its own in tests/verify_corpus/ (checked outside the sandbox to be
right in normal use and wrong where claimed): correct kernels the verifier used to reject pass, and the bugs an LLM
really writes fail for the right check. The candidates are C++ built from their text (tens of seconds each on a cold
build cache), so their runs are slow tests; the cases they need are checked on the plan in the fast set."""

import re
from pathlib import Path

import pytest
import torch

from kernelbot.agent.verify import cases, probes, provenance
from kernelbot.agent.verify.run import load_reference, task_from_reference, verify
from kernelbot.kernel_library import cpp_build
from kernelbot.loading import load_module

CORPUS = Path(__file__).resolve().parent / "verify_corpus"


def _verify(tmp_path, reference: str, candidate: str, **kwargs):
    """The candidate verified against the reference; its C++ is built here first (the sandbox can only load what the
    build cache holds)."""
    load_module(CORPUS / f"{candidate}.py", f"kb_test_{candidate}")
    ref = CORPUS / f"{reference}.py"
    return verify(task_from_reference(ref), ref, CORPUS / f"{candidate}.py", tmp_path / "work", seed=4, **kwargs)


def _plan(reference: str) -> cases.Plan:
    ref = CORPUS / f"{reference}.py"
    return cases.plan(load_reference(ref), task_from_reference(ref), seed=4)


def _detail(verdict, check: str) -> str:
    return next(c.detail for c in verdict.checks if c.id == check)


# ---------------------------------------------------------------- false positives

@pytest.mark.slow
def test_a_kernel_called_through_ctypes_on_its_own_library_passes(tmp_path):
    verdict = _verify(tmp_path, "silu_wide_ref", "silu_ctypes")
    assert verdict.verdict == "pass", verdict.problems
    assert "ctypes call(s)" in _detail(verdict, "reference_fallback")


@pytest.mark.slow
def test_two_outputs_in_disjoint_halves_of_one_allocation_are_no_aliasing(tmp_path):
    verdict = _verify(tmp_path, "gates_ref", "gates_halves")
    assert verdict.verdict == "pass", verdict.problems


def test_outputs_alias_by_the_bytes_they_lie_in_not_by_their_storage():
    both = torch.empty(2, 8, 4)
    assert probes.aliasing([both[0], both[1]], [], []) == []
    assert probes.aliasing([both[0], both[0, 1:]], [], []) == ["output 1 shares memory with another output of the "
                                                               "same call"]
    earlier = probes.spans([both[1]])
    assert probes.aliasing([both[0]], [], earlier) == []
    assert "earlier call" in probes.aliasing([both[1, ::2]], [], earlier)[0]


# ---------------------------------------------------------------- what decides is read where the candidate cannot write

def test_a_library_copied_into_the_box_is_not_the_candidates_own_code(tmp_path):
    """numpy's OpenBLAS, copied into the box at import and doing the whole product through ctypes, lies where the
    candidate's builds lie; its bytes are the installed library's. (Not loaded here first: it copies into its working
    directory, which only in the sandbox is its box.)"""
    ref = CORPUS / "matmul_ref.py"
    verdict = verify(task_from_reference(ref), ref, CORPUS / "matmul_blas_copy.py", tmp_path / "work", seed=4)
    assert verdict.failed == ["reference_fallback"], verdict.problems
    assert "runs no code of its own" in _detail(verdict, "reference_fallback")


@pytest.mark.slow
def test_an_honest_cpp_kernels_cpu_samples_land_in_its_own_code_sampled_from_outside_its_process(tmp_path):
    """The harness samples the runner's threads itself (test_parent_sampling.py): a softmax that does its own work has
    its samples in its own code, by the content of its build."""
    verdict = _verify(tmp_path, "softmax_wide_ref", "softmax_rows")
    assert verdict.verdict == "pass", verdict.problems
    own = re.search(r"(\d+) CPU samples in its own code", _detail(verdict, "reference_fallback"))
    assert own is not None and int(own.group(1)) >= 20, _detail(verdict, "reference_fallback")


@pytest.mark.slow
def test_a_forged_launch_window_does_not_make_torchs_softmax_the_candidates_own_code(tmp_path):
    """torch's softmax kernel called from C++ beneath the dispatcher, each call inside a forged Triton launch window
    (in the runner's list and as a launch event, with a window the harness reads): it passed when the runner sampled
    itself; a window counts only for code a launch runs, never torch's libraries."""
    verdict = _verify(tmp_path, "softmax_wide_ref", "softmax_forged_windows")
    assert "reference_fallback" in verdict.failed, verdict.checks
    assert "torch, numpy and other libraries take" in _detail(verdict, "reference_fallback")


def test_a_copy_of_an_installed_library_has_that_librarys_identity(tmp_path):
    numpy = pytest.importorskip("numpy")
    installed = sorted(Path(numpy.__file__).parent.parent.glob("numpy.libs/*openblas*.so*"))
    if not installed:
        pytest.skip("this numpy has no OpenBLAS of its own")
    copy = tmp_path / "mine.so"
    copy.write_bytes(installed[0].read_bytes())
    assert provenance.identity(str(copy)) in provenance.installed_libraries()
    built = next(iter(Path(cpp_build.cache_root()).glob("kb_rmsnorm_*/kb_rmsnorm_*.so")), None)
    if built is not None:  # a build of kernelbot's own: in no installed folder
        assert provenance.identity(str(built)) not in provenance.installed_libraries()


# ---------------------------------------------------------------- the cases a plan makes

def test_new_weights_are_drawn_afresh_for_parameters_and_buffers_each_alone_and_together():
    ref = CORPUS / "batchnorm_ref.py"
    plan = _plan("batchnorm_ref")
    references = cases.References(load_reference(ref), plan.init_args, 5)
    loaded = references.build(0).state_dict()
    alternates = dict(references.alternates(0, seed=4))
    assert list(alternates) == ["parameters", "buffers (running statistics and the like)", "parameters and buffers"]
    changed = {label: {n for n, t in sd.items() if not torch.equal(t, loaded[n])} for label, sd in alternates.items()}
    assert changed["parameters"] == {"norm.weight", "norm.bias"}
    assert changed["buffers (running statistics and the like)"] == {"norm.running_mean", "norm.running_var"}
    assert changed["parameters and buffers"] == {"norm.weight", "norm.bias", "norm.running_mean", "norm.running_var"}
    both = alternates["parameters and buffers"]
    assert bool((both["norm.bias"] != 0).all()) and bool((both["norm.running_mean"] != 0).all())  # zeros move
    assert bool((both["norm.running_var"] > 0).all()) and both["norm.running_var"].std() > 0.1  # a variance stays one
    assert torch.equal(both["norm.num_batches_tracked"], loaded["norm.num_batches_tracked"])


def test_a_causal_mask_buffer_is_not_redrawn():
    mask = torch.tril(torch.ones(4, 4))
    assert cases._mask_buffer(mask) and not cases._mask_buffer(torch.ones(4)) and not cases._mask_buffer(torch.zeros(4))


def test_every_input_comes_in_the_other_memory_order_whatever_the_references_own():
    for reference in ("softmax_ref", "transposed_ref"):
        plan = _plan(reference)
        main = plan.cases[0]
        flipped = next(c for c in plan.cases if "other memory order" in c.label)
        for before, after in zip(main.inputs, flipped.inputs, strict=True):
            assert torch.equal(before, after) and before.is_contiguous() != after.is_contiguous()


def test_sizes_go_well_past_the_scaled_ones_and_past_256_rows():
    assert [cases.past(n) for n in (1, 32, 64, 100, 4096)] == [257, 257, 257, 513, 16385]
    beyond = next(c for c in _plan("rownorm_ref").cases if "beyond the scaled sizes" in c.label)
    assert beyond.inputs[0].shape[0] == 257


def test_values_go_past_float16s_range_and_near_the_largest_the_reference_keeps_finite():
    plan = _plan("gelu_bf16_ref")
    ranged = [c for c in plan.cases if "float16's range" in c.label or "keeps finite" in c.label]
    assert len(ranged) == 2 and all(c.rescaled for c in ranged)
    past_fp16, near = (float(c.inputs[0].float().abs().max()) for c in ranged)
    assert past_fp16 > 65504 and near > 1e35
    sums = next(c for c in _plan("colsum_ref").cases if "keeps finite" in c.label)  # room for another order of sums
    assert torch.isfinite(sums.inputs[0].sum(0)).all() and torch.isfinite(sums.inputs[0].flip(0).sum(0)).all()


# ---------------------------------------------------------------- the bugs, each with a candidate of its own

@pytest.mark.slow
@pytest.mark.parametrize("reference,candidate,check,finding", [
    ("layernorm_affine_ref", "layernorm_no_bias", "result_caching", "new weights drawn afresh for its parameters"),
    ("batchnorm_ref", "batchnorm_no_stats", "result_caching", "new weights drawn afresh for its buffers"),
    ("softmax_ref", "softmax_column_stride", "correctness", "other memory order (transposed)"),
    ("rownorm_ref", "rownorm_256_rows", "correctness", "beyond the scaled sizes: rows=257"),
    ("rowsum_ref", "rowsum_four_threads", "race", "(four times as many threads as cores)"),
    ("gelu_bf16_ref", "gelu_bf16_through_fp16", "correctness", "past float16's range"),
    ("silu_ref", "silu_memo_noise", "nondeterminism", "run again after other calls, other bits"),
])
def test_a_bug_an_llm_writes_fails_the_right_check(tmp_path, reference, candidate, check, finding):
    verdict = _verify(tmp_path, reference, candidate)
    assert verdict.failed == [check], verdict.problems
    assert finding in _detail(verdict, check)


@pytest.mark.slow
def test_a_publication_race_that_shows_only_under_load_fails_race_under_contention(tmp_path):
    """Wrong once in a while, and only when another process takes thread 0's core between its "zeroed" and its
    zeroing: the fresh values' call repeated while processes of the harness's own load the cores shows it."""
    verdict = _verify(tmp_path, "rowsum_ref", "rowsum_publish_early")
    assert "race" in verdict.failed, verdict.problems
    assert "repeated while other processes loaded the cores" in _detail(verdict, "race")
