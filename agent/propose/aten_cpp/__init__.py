"""Candidates for any generic task without an LLM: the reference's ATen graph translated to one C++ function.

A generic task's reference (written by engine/extract.py) computes `graph(*params, *inputs)`, a straight-line graph
of `torch.ops.aten.*` calls printed from make_fx. `generate()` turns it into candidates, one per config:

- `ops`: every node becomes a call of ATen's typed entry point `at::_ops::<op>_<overload>::call(...)`, in the
  graph's order with the graph's arguments, so the results are bitwise the graph's. What it saves is the Python
  dispatch of each op, which dominates small decode-time ops on a CPU.
- `fused`: the same, except that groups of pointwise ops and last-dim reductions (sum, mean, amax, amin; softmax
  and layer norm over the last dim are first spelled as those, in fp32 as ATen computes them) over one domain
  (rows x last dim) become one loop nest: at::parallel_for over rows, an inner loop per reduction level, fp32 math,
  and rounding to bf16/fp16 exactly where the graph's op rounds (each op's result in its own dtype). Operands are
  read through their strides, so broadcasts and views need no copies. At run time a group checks that its operands
  have the dtypes, layout and shapes it was built for; if not, it runs its ops through `_ops`, so every input the
  graph accepts stays correct. Matrix products whose right operand is a view of a parameter (`mm`, `addmm`: a
  Linear's `t(weight)`, a GPT-2 `Conv1D`'s weight as it is) run the project's own small-M GEMMs
  (kernel_library/small_m_gemm.h, the linear family's kernels) with the bias added in the GEMM's epilogue: the
  weight is packed into panels on the first call and kept by the candidate, repacked when the weight is replaced or
  written in place.

The candidate file is the reference's own text plus the C++ as a string and a `ModelNew(Model)` that calls the
built extension with `[*self.params(), *inputs]`. Candidates run in a sandbox whose filesystem is read-only, so the
trusted parent builds the extension first: `generate()` does (through cpp_build.load_cpp_source, into the shared
build cache); `prebuild(candidate_source)` does it for a candidate text kept from earlier.

The trades, bottom up: graph.py (the reference's graph read and run), signatures.py (ATen's C++ entry points),
values.py (Python values as C++), lowering.py (the `ops` translation), loop_ops.py (what a fused loop computes),
decompose.py (softmax and layer norm as loop ops), fusion_plan.py (which nodes one loop computes), emitter.py (a fused
group's C++), gemm.py (products with a parameter), cpp_file.py (the C++ file), candidates.py (the candidate file);
templates/ holds the C++ preludes and the candidate's Python as files.
"""

from kernelbot.agent.propose.aten_cpp.candidates import CONFIGS, generate, prebuild
from kernelbot.agent.propose.aten_cpp.cpp_file import GenericConfig, Mode, cpp_source
from kernelbot.agent.propose.aten_cpp.gemm import gemm_nodes
from kernelbot.agent.propose.aten_cpp.graph import Unsupported, load_generic_reference, trace_reference

__all__ = ["CONFIGS", "GenericConfig", "Mode", "Unsupported", "cpp_source", "gemm_nodes", "generate",
           "load_generic_reference", "prebuild", "trace_reference"]
