"""Round four's classes, each with a candidate of its own in tests/verify_corpus/ (checked outside the sandbox to be
right in normal use and wrong where claimed): correct kernels the verifier used to reject pass, and the bugs an LLM
really writes fail for the right check."""

from pathlib import Path

from kernelbot.agent.verify.run import task_from_reference, verify
from kernelbot.loading import load_module

CORPUS = Path(__file__).resolve().parent / "verify_corpus"


def _verify(tmp_path, reference: str, candidate: str, **kwargs):
    """The candidate verified against the reference; a C++ candidate is built here first (the sandbox can only load
    what the build cache holds)."""
    load_module(CORPUS / f"{candidate}.py", f"kb_test_{candidate}")
    ref = CORPUS / f"{reference}.py"
    return verify(task_from_reference(ref), ref, CORPUS / f"{candidate}.py", tmp_path / "work", seed=4, **kwargs)


def _detail(verdict, check: str) -> str:
    return next(c.detail for c in verdict.checks if c.id == check)


def test_a_kernel_called_through_ctypes_on_its_own_library_passes(tmp_path):
    verdict = _verify(tmp_path, "silu_ref", "silu_ctypes")
    assert verdict.verdict == "pass", verdict.problems
    assert "ctypes call(s)" in _detail(verdict, "reference_fallback")


def test_two_outputs_in_disjoint_halves_of_one_allocation_are_no_aliasing(tmp_path):
    verdict = _verify(tmp_path, "gates_ref", "gates_halves")
    assert verdict.verdict == "pass", verdict.problems
