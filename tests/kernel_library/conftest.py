"""Fixtures the family tests share (tests/kernel_library/test_<family>.py, one file per kernel_library/ folder)."""

import pytest


@pytest.fixture
def bf16_dot_in_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The verifier's sandbox fix for the interpreter's bf16 tl.dot (triton-lang/triton#11584)."""
    from triton._C.libtriton import ir
    from triton.runtime import interpreter

    from kernelbot.agent.verify.triton_check import _checked_dot

    builder = interpreter.InterpreterBuilder
    monkeypatch.setattr(builder, "create_dot", _checked_dot(builder.create_dot, ir.INPUT_PRECISION.IEEE))
