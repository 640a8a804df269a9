"""`kernelbot optimize --engine sglang`, the one loop, against a small model served from SGLang's real layer classes
on the CPU (tests/tiny_sglang_server.py in the SGLang test environment: SGLang's server itself needs a GPU). The
profile server's plugin captures SGLang's layers; tasks come from those captures; the candidates are verified and
benchmarked; the packed server's plugin routes them; both servers are measured side by side; the report is the same
record as every run's.

Candidate generation is cut to one C++ candidate per task here (the proposer is tested on its own); needs the SGLang
test environment (`.ci/sglang_env.sh`), skipped without it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import free_port, port_closed
from test_sglang_plugin import SGLANG_PY

from kernelbot.cli import main
from kernelbot.records import Report

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "tests" / "tiny_sglang_server.py"
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
          "intermediate_size": 512, "num_hidden_layers": 2, "vocab_size": 512, "rms_norm_eps": 1e-6,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048}
LAYER_OF = {"rmsnorm": "RMSNorm", "add_rmsnorm": "RMSNorm", "silu_and_mul": "SiluAndMul",
            "rotary_embedding": "RotaryEmbedding"}

pytestmark = pytest.mark.skipif(not SGLANG_PY.exists(), reason=f"no SGLang test environment at "
                                f"{SGLANG_PY.parent.parent} (create it with .ci/sglang_env.sh)")


@pytest.mark.slow  # 3.5 min on 2 cores: the fast suite's served loop is vLLM's; SGLang's seams have fast tests
def test_the_served_loop_captures_sglangs_layers_packs_them_and_measures_both_servers(tmp_path, one_cpp_candidate):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))
    run_dir, port = tmp_path / "run", free_port()
    code = main(["optimize", "--engine", "sglang", "--model", str(model), "--engine-python", str(SGLANG_PY),
                 "--launch-cmd", f"{SGLANG_PY} {SERVER}", "--port", str(port), "--batch", "4", "--prompt-len", "32",
                 "--decode-steps", "16", "--requests-per-round", "4", "--rounds", "5", "--iterations", "1",
                 "--no-compile", "--no-store", "--max-tasks", "4", "--run-dir", str(run_dir),
                 "--families", ",".join(LAYER_OF)])
    assert code == 0
    report = Report.model_validate_json((run_dir / "report.json").read_text())
    assert report.engine == "sglang" and report.serving is not None
    # the tasks came from what the profile server's plugin captured in SGLang's own layers
    captured = {h.module_class for h in report.hotspots_before if h.family in LAYER_OF}
    assert captured == {"RMSNorm", "SiluAndMul", "RotaryEmbedding"}
    accepted = [k for k in report.kernels if k.status == "accepted"]
    manifest = json.loads((run_dir / "pack" / "manifest.json").read_text())
    assert {e["module_class"] for e in manifest["entries"]} <= set(LAYER_OF.values())
    if accepted:  # which candidates win their benchmark depends on the host's load
        assert all(k.calls > 0 for k in accepted), [(k.candidate_id, k.calls) for k in accepted]
        assert report.serving.engaged and report.serving.throughput_gain is not None
    assert len(report.serving.stock_rounds) == len(report.serving.pack_rounds) == 5
    assert report.fidelity.greedy_match and not report.fidelity.repetition_collapse
    assert "## Serving" in (run_dir / "report.md").read_text()
    assert port_closed(port)  # every server was stopped
