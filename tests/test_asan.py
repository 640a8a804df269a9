"""The AddressSanitizer check's parts that need no build: which of a candidate's native functions are kernelbot's
generated C++ builds, and ASan's report read into one line. (The check itself: tests/test_aten_cpp.py verifies a
generated kernel that passes it, tests/test_verify_corpus.py one that reads past its input and fails it.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbot.agent.verify import asan

REPORT = """=================================================================
==29852==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x6210009304a0 at pc 0x7ff1 bp 0x7ffd sp 0x7ffd
READ of size 4 at 0x6210009304a0 thread T0
    #0 0x7ff160215c9a  (/root/.cache/kernelbot/cpp/kb_oob_8ab3a888e72071bd_asan/kb_oob_8ab3a888e72071bd_asan.so+0x15c9a)
    #1 0x7ff16021b5a2  (/root/.cache/kernelbot/cpp/kb_oob_8ab3a888e72071bd_asan/kb_oob_8ab3a888e72071bd_asan.so+0x1b5a2)

0x6210009304a0 is located 0 bytes to the right of 4000-byte region [0x62100092f500,0x6210009304a0)
SUMMARY: AddressSanitizer: heap-buffer-overflow
==29852==ABORTING
"""


def test_asans_first_error_is_read_into_one_line_naming_the_access_and_the_library():
    assert asan.read_report(REPORT) == "heap-buffer-overflow: READ of size 4 in kb_oob_8ab3a888e72071bd_asan.so"
    assert asan.read_report("Traceback (most recent call last):\nRuntimeError: boom\n") == ""


def test_only_kernelbot_builds_count_and_only_generated_ones_are_rebuilt(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KERNELBOT_CACHE", str(tmp_path))
    kernels = ["kb_aten_cpp_0123456789abcdef.forward", "kb_linear_fedcba9876543210.small_m_linear",
               "kb_aten_cpp_0123456789abcdef.has_avx512_bf16", "mylib.run", "3 ctypes call(s)"]
    builds = asan.own_builds(kernels)
    assert builds == ["kb_aten_cpp_0123456789abcdef", "kb_linear_fedcba9876543210"]
    generated = tmp_path / "cpp" / builds[0]
    generated.mkdir(parents=True)
    (generated / f"{builds[0]}.cpp").write_text("// generated")
    assert asan.generated(builds) == [builds[0]]  # the library's own (loaded by path) has no text in the cache


LIBRARY_UNDER_ASAN = r'''
import sys
import torch
from pathlib import Path
from kernelbot.agent.tasks.references import reference_source
from kernelbot.kernel_library import FAMILIES
from kernelbot.loading import load_module
from kernelbot.records import Task

# sizes for the references that carry none (the rest run at their own INPUT_SHAPES and INIT_ARGS); odd widths, so
# tails are exercised. The last init arg, where "float32", becomes the dtype run.
SIZES = {"rmsnorm": ([[3, 2, 67]], [67, 1e-6, "float32"]), "linear": ([[3, 1, 67]], [67, 45, True, "float32"]),
         "gated_mlp": ([[3, 1, 66]], [66, 94, "float32"]), "silu_and_mul": ([[3, 1, 2 * 75]], []),
         "sparse_moe": ([[5, 1, 64]], [64, 96, 4, 2, "float32"])}
ran = []
for family in FAMILIES.values():
    if "cpp" not in family.wrappers:
        continue
    own = load_module(family.reference_path, f"kb_asan_ref_{family.name}")
    shapes, init = SIZES.get(family.name) or (own.INPUT_SHAPES, own.INIT_ARGS)
    for dtype in family.dtypes["cpp"]:
        args = [dtype if a == "float32" else a for a in init]
        task = Task(id="t", hotspot_id="h", family=family.name, module_class="M", dtype=dtype, input_shapes=shapes,
                    free_dims=[], init_args=args, share=0.1, floor_us=1.0)
        ref_path = Path(sys.argv[1]) / f"ref_{family.name}_{dtype}.py"
        ref_path.write_text(reference_source(task))
        ref_module = load_module(ref_path, f"kb_asan_task_{family.name}_{dtype}")
        torch.manual_seed(0)
        reference = ref_module.Model(*ref_module.get_init_inputs()).eval()
        path = Path(sys.argv[1]) / f"{family.name}_{dtype}.py"
        path.write_text(family.candidate_source("cpp", family.configs["cpp"][0]))
        kernel = load_module(path, f"kb_asan_cand_{family.name}_{dtype}").ModelNew(*ref_module.get_init_inputs())
        kernel.load_state_dict(reference.state_dict())
        inputs = ref_module.get_inputs()
        with torch.inference_mode():
            got, want = kernel.eval()(*inputs), reference(*inputs)
        got, want = (list(x) if isinstance(x, (tuple, list)) else [x] for x in (got, want))
        for g, w in zip(got, want, strict=True):
            tol = 1e-3 if dtype == "float32" else 6e-2
            torch.testing.assert_close(g.float(), w.float(), rtol=tol, atol=tol, msg=f"{family.name} {dtype}")
        ran.append(f"{family.name}/{dtype}")
print("ran", " ".join(ran))
'''


@pytest.mark.slow
def test_every_library_cpp_kernel_runs_clean_under_addresssanitizer(tmp_path: Path):
    """The project's own C++ (each family's wrapper, at its reference's sizes, fp32 and bf16) built with ASan and run
    in a process with its runtime: no load or store outside an allocation (ASan ends the process at the first)."""
    import os
    import subprocess
    import sys

    from kernelbot.kernel_library import cpp_build

    env = cpp_build.asan_environment()
    if not env:
        pytest.skip("the compiler has no AddressSanitizer runtime (libasan)")
    done = subprocess.run([sys.executable, "-c", LIBRARY_UNDER_ASAN, str(tmp_path)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=3000)
    assert done.returncode == 0, (asan.read_report(done.stderr) or done.stderr[-3000:])
    ran = done.stdout.split("ran", 1)[1].split()
    assert {r.split("/")[0] for r in ran} >= {"linear", "decode_attention", "neox_attention", "moe_experts"}, ran
