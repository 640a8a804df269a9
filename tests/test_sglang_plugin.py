"""The SGLang plugin against the real `sglang` package, on the CPU (SGLang's layers run forward_native).

Needs the SGLang test environment (`.ci/sglang_env.sh`, which `.ci/run` runs); skipped without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from helpers import free_port, generic_pack

from kernelbot.kernel_library import FAMILIES
from kernelbot.kernel_library.cpp_build import prebuild_library
from kernelbot.records import Pack, PackEntry, PluginReport

ROOT = Path(__file__).resolve().parents[1]
SGLANG_PY = Path(os.environ.get("KERNELBOT_SGLANG_VENV", ROOT / ".venv-sglang")) / "bin" / "python"
HIDDEN, EPS = 64, 1e-6
FP32_SHAPE, BF16_SHAPE = [2, 3, HIDDEN], [5, HIDDEN]  # the shapes the test pack's kernels were "verified" on
SILU_SHAPE = [5, 32]
ROPE = {"head": 32, "q_heads": 4, "kv_heads": 2, "tokens": 6, "max_pos": 256, "base": 10000.0}
ROPE_SHAPES = [[ROPE["tokens"]], [ROPE["tokens"], ROPE["q_heads"] * ROPE["head"]],
               [ROPE["tokens"], ROPE["kv_heads"] * ROPE["head"]]]

pytestmark = pytest.mark.skipif(not SGLANG_PY.exists(), reason=f"no SGLang test environment at "
                                f"{SGLANG_PY.parent.parent} (create it with .ci/sglang_env.sh)")


def _entry(cid: str, family: str, shapes: list[list[int]], dtype: str, init_args: list) -> PackEntry:
    module_class = {"rmsnorm": "RMSNorm", "add_rmsnorm": "RMSNorm", "silu_and_mul": "SiluAndMul",
                    "rotary_embedding": "RotaryEmbedding"}.get(family, "LlamaMLP")
    return PackEntry(task_id=cid, candidate_id=cid, family=family, module_class=module_class, input_shapes=shapes,
                     init_args=init_args, dtype=dtype, backend="cpp", config={"grain": 8},
                     source_file=f"kernels/{cid}.py", source_hash="test", verification="pass: test", speedup=1.2)


def _pack(pack_dir: Path) -> Pack:
    (pack_dir / "kernels").mkdir(parents=True)
    entries = [_entry("rms_fp32", "rmsnorm", [FP32_SHAPE], "float32", [HIDDEN, EPS, "float32"]),
               _entry("rms_bf16", "rmsnorm", [BF16_SHAPE], "bfloat16", [HIDDEN, EPS, "bfloat16"]),
               # SGLang's default RMSNorm multiplies the weight in fp32 (add_rmsnorm's weight_in_fp32)
               _entry("add_rms_fp32", "add_rmsnorm", [FP32_SHAPE] * 2, "float32", [HIDDEN, EPS, "float32", True]),
               _entry("add_rms_bf16", "add_rmsnorm", [BF16_SHAPE] * 2, "bfloat16", [HIDDEN, EPS, "bfloat16", False]),
               _entry("mlp", "gated_mlp", [[2, 3, HIDDEN]], "float32", [HIDDEN, 128, "float32"]),
               _entry("silu", "silu_and_mul", [SILU_SHAPE], "float32", []),
               _entry("rope", "rotary_embedding", ROPE_SHAPES, "float32",
                      [ROPE["head"], ROPE["head"], ROPE["max_pos"], ROPE["base"], True, "float32"])]
    for e in entries:
        (pack_dir / e.source_file).write_text(FAMILIES[e.family].candidate_source("cpp", e.config))
    pack = Pack(version="0.1.0+test", run_id="sglang-test", device="cpu", entries=entries)
    (pack_dir / "manifest.json").write_text(pack.model_dump_json(indent=1))
    return pack



@pytest.fixture(scope="module")
def sglang_run(tmp_path_factory) -> tuple[dict, list[PluginReport]]:
    from kernelbot.engine.router import read_reports

    tmp = tmp_path_factory.mktemp("sglang")
    _pack(tmp / "pack")
    prebuild_library()  # the C++ kernels, built once here; the child loads the cached build
    spec = {"pack_dir": str(tmp / "pack"), "counts_dir": str(tmp / "counts"), "out": str(tmp / "out.json"),
            "world": 2, "port": free_port(), "hidden": HIDDEN, "eps": EPS, "fp32_shape": FP32_SHAPE,
            "bf16_shape": BF16_SHAPE, "silu_width": SILU_SHAPE[-1], "rope": ROPE}
    (tmp / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "KERNELBOT_PACK", "PYTHON"))}
    env["SGLANG_USE_CPU_ENGINE"] = "1"  # SGLang's CPU platform (its rotary layer needs it to build here)
    start = time.monotonic()
    proc = subprocess.run([str(SGLANG_PY), str(ROOT / "tests" / "sglang_child.py"), str(tmp / "spec.json")],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(Path(spec["out"]).read_text())
    for rank, r in results.items():
        assert "error" not in r, f"rank {rank}: {r['error']}"
    print(f"sglang child: {time.monotonic() - start:.1f} s")
    return results, read_reports(Path(spec["counts_dir"]))


def test_plugin_loads_through_sglang_load_plugins_in_every_rank(sglang_run):
    results, reports = sglang_run
    assert results["0"]["hooked"] and results["1"]["hooked"]
    assert sorted(r.rank for r in reports) == [0, 1]  # one counters file per rank, from torch.distributed
    for r in reports:
        assert r.hooked == ["sglang.srt.layers.layernorm.RMSNorm", "sglang.srt.layers.activation.SiluAndMul",
                            "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding"]
        assert r.unrouted == [{"candidate_id": "mlp", "family": "gated_mlp",
                               "reason": "no sglang layer takes a gated_mlp kernel for LlamaMLP"}]


def test_not_allowlisted_plugin_changes_nothing(sglang_run):
    results, reports = sglang_run
    control = results["-1"]
    assert control["hooked"] is False
    assert len(reports) == 2  # the control process wrote no counters
    assert all(d == 0.0 for d in control["max_diff"].values())


def test_patched_layers_give_the_original_outputs(sglang_run):
    results, _ = sglang_run
    for rank in ("0", "1"):
        diffs = results[rank]["max_diff"]
        for name, d in diffs.items():
            if name.startswith("pack_fp32"):  # the silu kernel's exp differs from torch's by an ulp or so
                assert d <= 1e-5, (rank, name, d)
            elif name in ("pack_bf16", "residual_bf16"):
                assert d <= 1e-2, (rank, name, d)  # one bf16 ulp at values near 1
            else:  # fallbacks run SGLang's own path: identical
                assert d == 0.0, (rank, name, d)


def test_custom_and_fallback_counters_count_per_rank(sglang_run):
    _, reports = sglang_run
    pack_misses = "layer arguments, widths or dtype not in the pack"
    for report in reports:
        r = report.rank
        # check() calls each layer once through the hook (forward_native bypasses it); rank r makes r+1 calls at the
        # pack's shape and one with fewer rows; the fused residual add in fp32 goes to its own kernel
        # (and, in bf16, for the Llama-style layer: the kernel's weight order is an argument)
        assert {k: c.calls for k, c in report.custom.items()} == {
            "rms_fp32": r + 2, "rms_bf16": 1, "add_rms_fp32": 1, "add_rms_bf16": 1, "silu": 1, "rope": 2}
        assert report.fallback == {
            "RMSNorm": {"more rows than the pack's kernels were verified on": 1,
                        "numerics (weight multiplied before the cast)": 1,
                        "torch.compile (layer runs forward_native)": 1},
            "OwnNorm": {"subclass OwnNorm overrides forward_native": 1},
            "SiluAndMul": {"more rows than the pack's kernels were verified on": 1, pack_misses: 1},
            "RotaryEmbedding": {"more rows than the pack's kernels were verified on": 1, "position offsets": 1,
                                pack_misses: 1},
            "LinearScalingRotaryEmbedding": {
                "subclass LinearScalingRotaryEmbedding overrides _compute_cos_sin_cache": 1},
        }


def _generic_child(env_update: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "KERNELBOT_", "PYTHON"))}
    env.update({"SGLANG_PLUGINS": "kernelbot_pack", "SGLANG_USE_CPU_ENGINE": "1", **env_update})
    proc = subprocess.run([str(SGLANG_PY), str(ROOT / "tests" / "sglang_generic_child.py")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_fused_op_no_family_covers_is_captured_in_sglang_and_then_runs_a_generic_kernel_there(tmp_path):
    from kernelbot.engine.router import read_reports

    _generic_child({"KERNELBOT_CAPTURE_DIR": str(tmp_path / "capture")})
    captures = [g for r in read_reports(tmp_path / "capture") for g in r.generic if g.engine_class == "GemmaRMSNorm"]
    assert len(captures) == 1 and captures[0].calls == 3 and captures[0].reference, captures
    generic_pack(tmp_path / "pack", captures[0], "GemmaRMSNorm")
    out = _generic_child({"KERNELBOT_PACK_DIR": str(tmp_path / "pack"), "KERNELBOT_COUNTS_DIR": str(tmp_path / "c")})
    assert max(out["diffs"]) <= 2e-2  # the reference run as the kernel: SGLang's own numbers, to bf16's rounding
    (report,) = read_reports(tmp_path / "c")
    assert report.custom["k"].calls == 3 and not report.fallback, report
