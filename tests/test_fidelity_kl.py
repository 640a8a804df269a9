"""Next-token distributions in the fidelity check: KL(eager ‖ pack), top-1/top-5 agreement, and the verdict that
holds the pack's KL from float64 to twice eager's (agent/measure/end_to_end.py, KLCheck in kernelbot/records.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from helpers import norm_off_after_first_call

from kernelbot.agent.measure.end_to_end import KL_FLOOR, KL_SLACK, fidelity, kl_check, next_token_kl, top_k_agreement
from kernelbot.engine import TorchEngine
from kernelbot.engine.models import resolve_spec
from kernelbot.records import Fidelity, KLCheck, Pack, PackEntry

LIBRARY_NORM = "from kernelbot.kernel_library.rmsnorm.cpp import RMSNormCpp as ModelNew\n"
ONE_PERCENT_OFF = norm_off_after_first_call("1.01")
OLD_REPORT = {"max_abs_logit_diff": 2e-6, "greedy_match": True, "token_agreement": 1.0, "dtype_noise": 1e-6,
              "pack_error": 1e-6, "within_noise": True}


def _kl(**changes: float) -> KLCheck:
    fields = dict(positions=10, mean=1e-7, max=2e-7, top1_agreement=1.0, top5_agreement=1.0, eager_mean=1e-7,
                  eager_max=2e-7, pack_mean=1e-7, pack_max=2e-7, slack=KL_SLACK, floor=KL_FLOOR)
    return KLCheck(**{**fields, **changes})


def test_kl_of_identical_distributions_is_zero_and_of_known_ones_is_the_textbook_value() -> None:
    logits = torch.randn(6, 50, dtype=torch.float32)
    assert torch.equal(next_token_kl(logits, logits), torch.zeros(6, dtype=torch.float64))
    p, q = torch.tensor([[0.5, 0.5]]).log(), torch.tensor([[0.9, 0.1]]).log()
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert float(next_token_kl(p, q)[0]) == pytest.approx(expected, rel=1e-6)
    assert float(next_token_kl(q, p)[0]) != pytest.approx(expected, rel=1e-3)  # KL is not symmetric


def test_top_k_agreement_counts_shared_tokens_on_a_hand_made_example() -> None:
    vocab = 10
    eager = torch.zeros(2, vocab)
    pack = torch.zeros(2, vocab)
    eager[0, [0, 1, 2, 3, 4]] = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])  # top-5: 0 1 2 3 4
    pack[0, [0, 1, 2, 9, 8]] = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])  # shares 0 1 2 of them
    eager[1, [5, 6, 7, 8, 9]] = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    pack[1, [9, 8, 7, 6, 5]] = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])  # the same five, reordered
    assert top_k_agreement(eager, pack, 5) == pytest.approx((3 / 5 + 5 / 5) / 2)
    assert top_k_agreement(eager, pack, 1) == 0.5  # row 0's most likely token agrees (0), row 1's does not (9, 5)
    check = kl_check(eager, pack, eager.double())
    assert check.top1_agreement == 0.5 and check.top5_agreement == pytest.approx(0.8) and check.positions == 2


def test_the_kl_verdict_holds_the_pack_to_twice_eagers_distance_or_the_floor() -> None:
    assert _kl(pack_mean=1.9e-7, pack_max=3.9e-7).within_noise
    assert not _kl(pack_mean=2.1e-7).within_noise
    assert not _kl(pack_max=4.1e-7).within_noise
    assert _kl(eager_mean=0.0, eager_max=0.0, pack_mean=KL_FLOOR / 2, pack_max=KL_FLOOR).within_noise


def test_a_failed_kl_fails_the_pack_even_when_every_greedy_token_agrees() -> None:
    good = Fidelity(**OLD_REPORT, kl=_kl())
    bad = Fidelity(**OLD_REPORT, kl=_kl(pack_mean=1e-5, pack_max=1e-5))
    assert good.passed and not bad.passed and bad.greedy_match
    assert "KL(eager ‖ pack) mean" in bad.summary() and "beyond 2x eager's" in bad.summary()
    written = json.loads(bad.model_dump_json())
    assert written["passed"] is False and written["kl"]["within_noise"] is False
    edited = {**written, "passed": True, "kl": {**written["kl"], "within_noise": True}}
    assert Fidelity.model_validate(edited).passed is False  # stale verdicts are recomputed


def test_reports_written_before_the_kl_check_still_read_and_pass_as_they_did() -> None:
    old = Fidelity.model_validate_json(json.dumps(OLD_REPORT))
    assert old.kl is None and old.passed
    assert "KL" not in old.summary()


LIBRARY_MLP = "from kernelbot.kernel_library.gated_mlp.cpp import GatedMLPCpp as ModelNew\n"


def _one_kernel_pack(tmp_path: Path, source: str, dtype: str, hidden: int, intermediate: int) -> tuple[Pack, Path]:
    """A pack of one library kernel (RMSNorm, or the gated MLP when the source names it), verified (as the records
    say) at the prefill shape [2, 5, hidden]."""
    (tmp_path / "kernels").mkdir(exist_ok=True)
    (tmp_path / "kernels" / "kernel.py").write_text(source)
    shape = [2, 5, hidden]
    if "gated_mlp" in source:
        family, module, init = "gated_mlp", "LlamaMLP", [hidden, intermediate, dtype]
        dims = [shape, [intermediate, hidden]]
    else:
        family, module, init, dims = "rmsnorm", "LlamaRMSNorm", [hidden, 1e-6, dtype], [shape]
    entry = PackEntry(task_id="t", candidate_id="kernel", family=family, module_class=module, input_shapes=[shape],
                      init_args=init, profiled_dims=dims, dtype=dtype, backend="cpp", config={},
                      source_file="kernels/kernel.py", source_hash="x", verification="pass", speedup=2.0)
    return Pack(version="test", run_id="r", device="cpu", entries=[entry]), tmp_path


@pytest.mark.parametrize(("dtype", "source", "passes"), [("float32", ONE_PERCENT_OFF, False),
                                                          ("float32", LIBRARY_NORM, True),
                                                          ("bfloat16", LIBRARY_NORM, True),
                                                          ("bfloat16", LIBRARY_MLP, True)],
                         ids=["fp32-norm-1%-off", "fp32-norm", "bf16-norm", "bf16-gated-mlp"])
def test_an_rmsnorm_one_percent_off_fails_kl_in_fp32_and_the_real_kernels_pass(tmp_path: Path, dtype: str,
                                                                                source: str, passes: bool) -> None:
    spec, _ = resolve_spec("llama-micro", dtype=dtype, batch=2, prompt_len=5, decode_steps=6)
    engine = TorchEngine(spec)
    pack, pack_dir = _one_kernel_pack(tmp_path, source, dtype, spec.hidden, spec.intermediate)
    engine.apply_pack(pack, pack_dir)
    engine.patcher.reset_counts()
    engine.run_workload()
    assert engine.patcher.counts["kernel"] > 0  # the kernel really runs in the prefill
    engine.remove_pack()
    fid = fidelity(engine, pack, pack_dir)
    kl = fid.kl
    assert kl is not None and kl.positions == 2 * (6 + 1)
    assert kl.within_noise is passes and fid.passed is passes
    assert 0.0 <= kl.mean <= kl.max and 0.0 < kl.eager_mean <= kl.eager_max
    if "gated_mlp" in source:  # its bf16 GEMMs round differently from eager's: a real difference, within noise
        assert kl.mean > 0
    if not passes:  # the 1% error sits far beyond fp32's own, though the most likely tokens do not move
        assert kl.pack_mean > 100 * KL_SLACK * kl.eager_mean and kl.pack_mean > KL_FLOOR
        assert fid.greedy_match and kl.top1_agreement == 1.0
