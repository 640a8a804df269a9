"""agent/propose/aten_cpp/: a generic task's ATen graph becomes C++ candidates that compute what the graph computes.

The fixtures in tests/generic_refs are real make_fx output (transformers' LlamaRotaryEmbedding, LayerNorm + GELU,
residual add + LlamaRMSNorm, an MLP traced with symbolic sizes, and an "op zoo" of ~50 ops LLM blocks use) in the
format engine/extract.py writes. Each
extension takes seconds to build the first time (2 cores) and is cached after that; the cases that add little
beyond the fast ones are marked slow.
"""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path
from types import ModuleType

import pytest
import torch

from kernelbot import KernelbotError
from kernelbot.agent.propose import aten_cpp
from kernelbot.agent.propose.aten_cpp import Mode, Unsupported, generate
from kernelbot.agent.verify.probes import OpLog
from kernelbot.kernel_library import cpp_build
from kernelbot.loading import load_module

REFS = Path(__file__).parent / "generic_refs"
# the fast set: a bf16 reduction and an fp32 zoo of elementwise, view and reduction ops (the GEMMs have tests of their
# own below); every fixture runs under -m slow, each a compile of its own (8-23 s on a fresh cache)
FAST = ("residual_rmsnorm_bf16", "op_zoo_fp32")
FIXTURES = [pytest.param(p.stem, marks=() if p.stem in FAST else pytest.mark.slow) for p in sorted(REFS.glob("*.py"))]
# the fused loops round where the graph rounds, but their exp/sin/erf and summation order are not ATen's
TOLERANCE = {torch.float32: {"rtol": 1e-5, "atol": 1e-6}, torch.bfloat16: {"rtol": 2**-7, "atol": 1e-5}}

# A hand-written graph over what the fixtures do not reach: int arithmetic on sizes, lists of tensors in and out,
# Tensor?[] indices, _softmax, an in-place op, comparisons, where, and a max reduction.
ASSORTED_GRAPH = '''
def graph(p0, x0, x1):
    sym_size_int = torch.ops.aten.sym_size.int(x0, 0)
    sym_size_int_1 = torch.ops.aten.sym_size.int(x0, 2)
    mul = sym_size_int * 2
    floordiv = sym_size_int_1 // 2
    view = torch.ops.aten.view.default(x0, [mul, floordiv])
    split = torch.ops.aten.split.Tensor(view, 16, 1)
    getitem = split[0]
    getitem_1 = split[1]
    cat = torch.ops.aten.cat.default([getitem_1, getitem], -1)
    index = torch.ops.aten.index.Tensor(cat, [x1])
    amax = torch.ops.aten.amax.default(index, [-1], True)
    sub = torch.ops.aten.sub.Tensor(index, amax)
    exp = torch.ops.aten.exp.default(sub)
    sum_1 = torch.ops.aten.sum.dim_IntList(exp, [-1], True)
    div = torch.ops.aten.div.Tensor(exp, sum_1)
    gt = torch.ops.aten.gt.Scalar(div, 0.03)
    where = torch.ops.aten.where.self(gt, div, p0)
    _softmax = torch.ops.aten._softmax.default(index, -1, False)
    clone = torch.ops.aten.clone.default(_softmax)
    add_ = torch.ops.aten.add_.Tensor(clone, 1.0)
    clamp = torch.ops.aten.clamp.default(add_, 1.01, None)
    return (where, clamp, view)
'''


def reference_with_graph(template: str, graph: str) -> str:
    """A fixture's text with its graph() replaced."""
    return re.sub(r"\ndef graph\(.*?\n    return .*?\n", graph, template, count=1, flags=re.S)


def reference_from(graph: str, dtype: str, input_shapes: list[list[int]], input_dtypes: list[str]) -> str:
    """A generic reference (the fixtures' format) for a hand-written graph(p0, x0, x1): p0 is a [32] weight."""
    text = reference_with_graph((REFS / "residual_rmsnorm_fp32.py").read_text(), graph)
    text = re.sub(r"DTYPE = .*", f"DTYPE = torch.{dtype}", text)
    text = re.sub(r"INPUT_SHAPES = .*", f"INPUT_SHAPES = {input_shapes!r}", text)
    text = re.sub(r"INPUT_DTYPES = .*", f"INPUT_DTYPES = {input_dtypes!r}", text)
    text = re.sub(r"PARAMS = .*", f"PARAMS = [('w', [32], '{dtype}', 'parameter')]", text)
    draws = ", ".join(f'_like({s}, "{d}", 0.0, 1.0)' if d != "int64" else f"_ints({s}, 'int64', 0, 7)"
                      for s, d in zip(input_shapes, input_dtypes, strict=True))
    values = f'def _values():\n    return [_like([32], "{dtype}", 0.0, 0.02)]\n'
    text = re.sub(r"def _values\(\):.*?\n    \]\n", values, text, flags=re.S)
    return re.sub(r"def get_inputs\(\):.*?\n    \]\n", f"def get_inputs():\n    return [{draws}]\n", text, flags=re.S)


def assorted_reference(dtype: str) -> str:
    return reference_from(ASSORTED_GRAPH, dtype, [[4, 1, 64], [5]], [dtype, "int64"])


@functools.cache
def generated(path: Path) -> tuple[tuple[dict, str], ...]:
    return tuple(generate(path, configs=aten_cpp.CONFIGS))


def candidate_module(source: str, directory: Path) -> ModuleType:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "candidate.py").write_text(source)
    return load_module(directory / "candidate.py", f"kb_test_candidate_{abs(hash(str(directory)))}")


def outputs(value: object) -> list[torch.Tensor]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def models(module: ModuleType, seed: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(seed)
    reference = module.Model().eval()
    candidate = module.ModelNew().eval()
    candidate.load_state_dict(reference.state_dict())
    return reference, candidate


def assert_same(got: list[torch.Tensor], want: list[torch.Tensor], mode: str) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        if mode == Mode.OPS.value or not w.is_floating_point():
            assert torch.equal(g, w), f"{mode}: max difference {(g.double() - w.double()).abs().max()}"
        else:
            torch.testing.assert_close(g, w, **TOLERANCE[w.dtype])


def check_candidates(path: Path, tmp_path: Path, draws: int = 3) -> None:
    for config, source in generated(path):
        module = candidate_module(source, tmp_path / config["mode"])
        for seed in range(draws):
            reference, candidate = models(module, seed)
            inputs = module.get_inputs()
            with torch.no_grad():
                assert_same(outputs(candidate(*inputs)), outputs(reference(*inputs)), config["mode"])


@pytest.mark.parametrize("stem", FIXTURES)
def test_generated_candidates_compute_what_the_graph_computes_on_fresh_draws(stem: str, tmp_path: Path) -> None:
    check_candidates(REFS / f"{stem}.py", tmp_path)


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_sizes_lists_indices_softmax_and_in_place_ops_translate_exactly(dtype: str, tmp_path: Path) -> None:
    path = tmp_path / f"assorted_{dtype}.py"
    path.write_text(assorted_reference(dtype))
    check_candidates(path, tmp_path)


def test_sizes_read_from_sym_size_follow_the_inputs_at_run_time(tmp_path: Path) -> None:
    for config, source in generated(REFS / "mlp_fp32.py"):
        module = candidate_module(source, tmp_path / config["mode"])
        reference, candidate = models(module, 0)
        x = torch.randn(3, 1, 512)  # traced at batch 8
        with torch.no_grad():
            assert_same(outputs(candidate(x)), outputs(reference(x)), config["mode"])


def fused_candidate(path: Path, directory: Path) -> ModuleType:
    return candidate_module(next(s for c, s in generated(path) if c["mode"] == Mode.FUSED.value), directory)


def run_logged(model: torch.nn.Module, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], set[str]]:
    """The model's outputs, and the ATen compute ops it dispatched."""
    with torch.inference_mode(), OpLog() as log:
        out = outputs(model(*inputs))
    return out, set(log.compute)


def test_a_fused_loop_given_a_column_major_operand_falls_back_to_aten_exactly(tmp_path: Path) -> None:
    module = fused_candidate(REFS / "residual_rmsnorm_bf16.py", tmp_path)
    reference, candidate = models(module, 0)
    x = torch.randn(512, 8, dtype=torch.bfloat16).t().unsqueeze(1)  # [8, 1, 512], dims in column-major order
    residual = torch.randn(8, 1, 512, dtype=torch.bfloat16)
    got, ran = run_logged(candidate, [x, residual])
    assert {"pow", "mean", "rsqrt"} <= ran, "the loop ran on operands whose ATen results are not row-major"
    assert_same(got, outputs(reference(x, residual)), Mode.OPS.value)


@pytest.mark.slow
def test_a_fused_loop_falls_back_when_an_output_would_broadcast_to_another_shape(tmp_path: Path) -> None:
    graph = ("\ndef graph(p0, x0, x1):\n    exp = torch.ops.aten.exp.default(x0)\n"
             "    mul = torch.ops.aten.mul.Tensor(exp, x1)\n    return (exp, mul)\n")
    path = tmp_path / "reference.py"
    path.write_text(reference_from(graph, "float32", [[4, 1, 64], [4, 1, 64]], ["float32", "float32"]))
    module = fused_candidate(path, tmp_path / "fused")
    reference, candidate = models(module, 0)
    small, full = torch.randn(1, 1, 64), torch.randn(4, 1, 64)
    _, ran = run_logged(candidate, [full, full])
    assert not ran, f"traced shapes should take the loop, but ATen ran {ran}"
    got, ran = run_logged(candidate, [small, full])  # exp's result is [1, 1, 64] here, not the loop's [4, 1, 64]
    assert ran == {"exp", "mul"}
    assert_same(got, outputs(reference(small, full)), Mode.OPS.value)


def test_the_fused_config_computes_rmsnorm_in_one_loop_nest_without_aten_compute(tmp_path: Path) -> None:
    module = aten_cpp.load_generic_reference(REFS / "residual_rmsnorm_bf16.py")
    cpp = aten_cpp.cpp_source(aten_cpp.trace_reference(module), aten_cpp.GenericConfig(mode=Mode.FUSED))
    fast_path = cpp.split("} else {")[0]
    assert cpp.count("at::parallel_for") == 1 and "acc_" in fast_path
    assert not re.search(r"at::_ops::\w+::call", fast_path.split("kb_run(std::vector<at::Tensor> args")[1])
    # at run time: the loop ran, not the ATen fallback (whose ops a dispatch mode would see)
    reference, candidate = models(fused_candidate(REFS / "residual_rmsnorm_bf16.py", tmp_path), 0)
    inputs = module.get_inputs()
    assert run_logged(candidate, inputs)[1] == set()
    assert {"pow", "mean", "rsqrt", "mul", "add"} <= run_logged(reference, inputs)[1]


# GPT-2's Conv1D (addmm with the [K,N] weight as it is), a Linear without bias over a transposed parameter (mm
# through t), and a product of two activations, which is no weight and stays ATen's
GEMM_GRAPH = """
def graph(p0, p1, p2, p3, x0):
    view = torch.ops.aten.view.default(x0, [8, 512])
    addmm = torch.ops.aten.addmm.default(p1, view, p2)
    gelu = torch.ops.aten.gelu.default(addmm, approximate='tanh')
    t = torch.ops.aten.t.default(p0)
    t_1 = torch.ops.aten.t.default(t)
    mm = torch.ops.aten.mm.default(gelu, t_1)
    add = torch.ops.aten.add.Tensor(mm, p3)
    t_2 = torch.ops.aten.t.default(view)
    mm_1 = torch.ops.aten.mm.default(view, t_2)
    return (add, mm_1)
"""


@pytest.mark.parametrize("fixture", ["mlp_bf16", pytest.param("mlp_fp32", marks=pytest.mark.slow)])
def test_products_with_a_parameter_run_the_projects_own_gemm_and_repack_when_the_weight_changes(
        fixture: str, tmp_path: Path) -> None:
    path = tmp_path / "reference.py"
    path.write_text(reference_with_graph((REFS / f"{fixture}.py").read_text(), GEMM_GRAPH))
    traced = aten_cpp.trace_reference(aten_cpp.load_generic_reference(path))
    assert [n.name for n in aten_cpp.gemm_nodes(traced)] == ["addmm", "mm"]  # not the activations' product
    module = fused_candidate(path, tmp_path / "fused")
    reference, candidate = models(module, 0)
    x = module.get_inputs()
    got, ran = run_logged(candidate, x)
    assert "addmm" not in ran and ran <= {"mm"}, ran  # ATen multiplied only the two activations
    assert_same(got, outputs(reference(*x)), Mode.FUSED.value)
    with torch.no_grad():  # a weight written in place, then one replaced: the packed copies follow
        for model in (reference, candidate):
            model.get_parameter("fc2.weight").mul_(-0.5)
        assert_same(outputs(candidate(*x)), outputs(reference(*x)), Mode.FUSED.value)
        fresh = torch.randn(1376, 512).to(reference.get_parameter("fc1.weight").dtype) * 0.03
        for model in (reference, candidate):
            model.fc1.weight = torch.nn.Parameter(fresh.clone(), requires_grad=False)
        assert_same(outputs(candidate(*x)), outputs(reference(*x)), Mode.FUSED.value)


@pytest.mark.slow  # 46 s on a fresh build cache (the MLP's extension and its AddressSanitizer build)
def test_kernelbot_verify_accepts_a_generated_mlp_whose_gemms_are_its_own(tmp_path: Path) -> None:
    from kernelbot.agent.verify.run import task_from_reference, verify

    reference = REFS / "mlp_bf16.py"
    path = tmp_path / "fused" / "candidate.py"
    path.parent.mkdir()
    path.write_text(next(s for c, s in generated(reference) if c["mode"] == Mode.FUSED.value))
    verdict = verify(task_from_reference(reference), reference, path, tmp_path / "verify", timeout=120)
    # reference_fallback among them: before, the generated C++ called aten::addmm for the products
    assert verdict.verdict == "pass", [(c.id, c.detail) for c in verdict.checks if c.status == "fail"]


def test_the_ops_config_calls_every_op_through_its_typed_aten_entry_point() -> None:
    module = aten_cpp.load_generic_reference(REFS / "layernorm_gelu_fp32.py")
    cpp = aten_cpp.cpp_source(aten_cpp.trace_reference(module), aten_cpp.GenericConfig(mode=Mode.OPS))
    assert "at::_ops::native_layer_norm::call(" in cpp and "std::get<0>(" in cpp
    assert 'at::_ops::gelu::call(v_getitem, c10::string_view("tanh"))' in cpp or '::std::string_view("tanh")' in cpp
    assert "#include <torch/extension.h>" not in cpp and "at::parallel_for" not in cpp


@pytest.mark.parametrize(("graph", "op"), [
    ("def graph(p0, x0, x1):\n    c = torch.ops.prims.convert_element_type.default(x0, torch.float64)\n"
     "    return (c,)\n", "prims.convert_element_type.default"),
    ("def graph(p0, x0, x1):\n    s = torch.ops.aten._local_scalar_dense.default(x0)\n"
     "    m = torch.ops.aten.mul.Tensor(x1, s)\n    return (m,)\n", "aten._local_scalar_dense.default"),
])
def test_an_op_it_cannot_translate_is_refused_with_its_name(graph: str, op: str, tmp_path: Path) -> None:
    path = tmp_path / "reference.py"
    text = reference_with_graph((REFS / "residual_rmsnorm_fp32.py").read_text(), "\n" + graph)
    path.write_text(text.replace("_like([8, 1, 512], \"float32\", 0.0, 1.0),\n        _like",
                                 "_like([], \"float32\", 0.0, 1.0),\n        _like"))
    with pytest.raises(Unsupported, match=re.escape(op)):
        generate(path, prebuild=False)


def test_a_file_that_is_no_generic_reference_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "reference.py"
    path.write_text("import torch\n\nclass Model(torch.nn.Module):\n    pass\n")
    with pytest.raises(KernelbotError, match="not a generic task reference"):
        generate(path, prebuild=False)
    with pytest.raises(KernelbotError, match="not an aten_cpp candidate"):
        aten_cpp.prebuild("class ModelNew:\n    pass\n")


def test_kernelbot_verify_accepts_a_fused_candidate(tmp_path: Path) -> None:
    from kernelbot.agent.verify.run import task_from_reference, verify

    reference = REFS / "residual_rmsnorm_bf16.py"
    source = next(s for c, s in generated(reference) if c["mode"] == Mode.FUSED.value)
    aten_cpp.prebuild(source)  # what the parent does for a candidate kept from earlier (built already here)
    path = tmp_path / "fused" / "candidate.py"
    path.parent.mkdir()
    path.write_text(source)
    verdict = verify(task_from_reference(reference), reference, path, tmp_path / "verify", timeout=120)
    assert verdict.verdict == "pass", [(c.id, c.detail) for c in verdict.checks if c.status == "fail"]
    # its C++ ran once more, built with AddressSanitizer, on unguarded inputs
    assert "AddressSanitizer: no access outside an allocation" in next(
        c.detail for c in verdict.checks if c.id == "out_of_bounds")


def test_generated_cpp_builds_in_a_temporary_directory_when_the_cache_is_read_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("KERNELBOT_CACHE", str(cache))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setattr(cpp_build, "_writable", lambda path: False)
    source = ('#include <pybind11/pybind11.h>\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) '
              '{ m.def("answer", [] { return 42; }); }\n')
    module = cpp_build.load_cpp_source(source, "readonly_probe")
    assert module.answer() == 42
    assert Path(module.__file__).is_relative_to(tmp_path / "tmp") and not cache.exists()
