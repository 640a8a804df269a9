"""`kernelbot optimize --engine sglang` end to end, against a small model served from SGLang's real layer classes
on the CPU (tests/tiny_sglang_server.py, in the SGLang test environment): baseline server, per-rank traces, rank,
tasks, candidates verified and benchmarked, pack, the plugin in the server, counters, fidelity, report, promote's
refusal of a pack that did not engage.

Candidate generation is cut to one C++ candidate per task here (the proposer is tested on its own); needs the
SGLang test environment (`.ci/sglang_env.sh`), skipped without it.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from helpers import free_port
from test_sglang_plugin import SGLANG_PY

from kernelbot.cli import main
from kernelbot.records import ServedReport

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "tests" / "tiny_sglang_server.py"
CONFIG = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "vocab_size": 512,
          "rms_norm_eps": 1e-6, "torch_dtype": "float32", "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 2048, "rope_theta": 10000.0}
LAYERS = {"RMSNorm", "SiluAndMul", "RotaryEmbedding"}
LAYER_OF = {"rmsnorm": "RMSNorm", "silu_and_mul": "SiluAndMul", "rotary_embedding": "RotaryEmbedding"}

pytestmark = pytest.mark.skipif(not SGLANG_PY.exists(), reason=f"no SGLang test environment at "
                                f"{SGLANG_PY.parent.parent} (create it with .ci/sglang_env.sh)")


@pytest.fixture
def one_cpp_candidate(monkeypatch):
    from kernelbot.agent import proposer

    real = proposer.propose
    monkeypatch.setattr("kernelbot.agent.generate.propose",
                        lambda task, backends, reference: [c for c in real(task, backends, reference)
                                                           if c[0].backend == "cpp"][:1])


def _run(tmp_path: Path, launch: str, port: int, *extra: str) -> tuple[int, Path]:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(CONFIG))
    run_dir = tmp_path / "run"
    code = main(["optimize", "--engine", "sglang", "--model", str(model), "--launch-cmd", launch,
                 "--port", str(port), "--num-prompts", "8", "--input-len", "32", "--output-len", "16",
                 "--concurrency", "4", "--serving-rounds", "1", "--run-dir", str(run_dir),
                 "--families", "rmsnorm,silu_and_mul,rotary_embedding", *extra])
    return code, run_dir


def _port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_served_loop_profiles_packs_engages_and_keeps_outputs(tmp_path, one_cpp_candidate):
    port = free_port()
    # each layer is profiled at decode (4 rows) and prefill (32 rows): five tasks cover all three families. Which of
    # them win their benchmark depends on the host's load, so what is asserted follows what was accepted.
    code, run_dir = _run(tmp_path, f"{SGLANG_PY} {SERVER}", port, "--max-tasks", "5")
    assert code == 0
    report = ServedReport.model_validate_json((run_dir / "report.json").read_text())
    # the baseline trace came from the server's own profiler, with SGLang's layer classes in it
    assert LAYERS <= {h.module_class for h in report.hotspots_before}
    rope = next(h for h in report.hotspots_before if h.module_class == "RotaryEmbedding")
    assert [len(d) for d in rope.input_dims] == [1, 2, 2]  # positions, query, key: read from its views
    accepted = [k for k in report.kernels if k.status == "accepted"]
    assert accepted and all(k.backend == "cpp" and k.calls > 0 for k in accepted)
    manifest = json.loads((run_dir / "pack" / "manifest.json").read_text())
    packed = {e["family"] for e in manifest["entries"]}
    assert packed and packed <= set(LAYER_OF)
    # the plugin ran in the server: counters from rank 0, and the pack's labels in the server's trace
    assert report.engaged and report.per_rank["0"]["custom_calls"] > 0
    labelled = {h.module_class for h in report.hotspots_after if h.kernel}
    assert labelled == {LAYER_OF[f] for f in packed}, [(h.module_class, h.kernel) for h in report.hotspots_after]
    assert report.fidelity is not None and report.fidelity.greedy_match and not report.fidelity.repetition_collapse
    assert report.fidelity.max_abs_logit_diff < 1e-3
    assert report.after is not None and report.throughput_gain is not None  # claimed, since it engaged
    assert "## Engagement per rank" in (run_dir / "report.md").read_text()
    assert len(list((run_dir / "serve" / "baseline" / "traces").glob("*.trace.json.gz"))) == 1
    assert _port_closed(port)  # both servers were stopped
    assert main(["pr", str(run_dir), "--no-open"]) == 2  # a served run's evidence is its report, not a PR bundle


@pytest.mark.slow
def test_pack_that_never_loads_claims_nothing_and_is_not_promoted(tmp_path, one_cpp_candidate, capsys):
    # The server is started with another plugin allowlisted: kernelbot's never loads, whatever it is told.
    launch = f"env SGLANG_PLUGINS=some_other_plugin {SGLANG_PY} {SERVER}"
    code, run_dir = _run(tmp_path, launch, free_port(), "--max-tasks", "1")
    assert code == 0
    report = ServedReport.model_validate_json((run_dir / "report.json").read_text())
    assert [k for k in report.kernels if k.status == "accepted"]
    assert not report.engaged and report.throughput_gain is None
    assert any("counters from 0 of 1 ranks" in n for n in report.notes)
    capsys.readouterr()
    assert main(["promote", str(run_dir), "--base", "unused:1", "--tag", "127.0.0.1:1/x:1"]) == 2
    assert "did not engage" in capsys.readouterr().err
