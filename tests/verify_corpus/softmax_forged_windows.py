"""A cheat on the sampler: torch's own softmax kernel called from C++ (at::cpu::_softmax, beneath the dispatcher, so
the op log sees no aten op), and every call wrapped in a forged Triton launch window: an entry in the Triton checker's
list of windows and a launch event streamed to the harness as the checker streams a real one, on this thread and
covering the call. When the runner sampled itself, every sample inside a launch window counted as the candidate's own,
so torch's softmax was its own code; a window counts only for code a launch runs, never torch's libraries.
Built from its text in the kernel library's build cache, where the test built it first."""
import sys
import threading
import time

import torch
from torch import nn

from kernelbot.agent.propose.aten_cpp.cpp_file import PRECOMPILED
from kernelbot.kernel_library.cpp_build import load_cpp_source

SOURCE = r"""
#include <ATen/core/Tensor.h>
#include <ATen/ops/_softmax_cpu_dispatch.h>
#include <torch/csrc/utils/pybind.h>

at::Tensor softmax(const at::Tensor& x) { return at::cpu::_softmax(x, -1, false); }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("softmax", &softmax); }
"""

_ext = load_cpp_source(SOURCE, "softmax_forged_windows", PRECOMPILED)


def _forge(start: int) -> None:
    """A launch window over [start, now] on this thread, where the runner and the harness read launches."""
    checker = sys.modules.get("kernelbot.agent.verify.triton_check")
    if checker is None:
        return
    thread, end = threading.get_native_id(), time.monotonic_ns()
    checker.WINDOWS.append((thread, start, end, time.time_ns() - (end - start), time.time_ns()))
    fields = sys.modules["kernelbot.agent.verify.messages"].TritonLaunch.model_fields
    if checker._sink is not None and "start_ns" in fields:  # where the harness reads windows from launch events
        checker._sink("triton_launch", {"kernel": "softmax_kernel", "programs": 1,
                                        "order": checker.order_for("softmax_kernel"), "float_atomic_adds": 0,
                                        "locked_writes": 0, "thread": thread, "start_ns": start, "end_ns": end})


class ModelNew(nn.Module):
    def forward(self, x):
        torch.set_num_threads(1)  # no OpenMP pool spinning beside its calls: a steadier pass on a loaded host
        start = time.monotonic_ns()
        out = _ext.softmax(x)
        _forge(start)
        return out
