"""A small served model built from SGLang's real layer classes, behind the stand-in's HTTP surface.

Run under the SGLang test environment's python (.ci/sglang_env.sh) in place of `python -m sglang.launch_server`:
it takes the same arguments, and does what kernelbot relies on SGLang's scheduler doing. `load_plugins()` runs
first, before the model is built; one thread owns the model and the profiler; requests are batched
continuously (each new request's prefill, then one decode step for every running request), so the layers see
the changing row counts a server sees. The model follows SGLang's Llama: RMSNorm with its fused residual add;
where attention would be, a qkv projection split into q, k, v, SGLang's RotaryEmbedding (from its get_rope, at
each token's position) on q and k, and an output projection of the three (no mixing across tokens); then
gate_up → SiluAndMul → down. Weights are seeded; sizes come from --model-path's config.json (hidden_size,
intermediate_size, num_hidden_layers, vocab_size, rms_norm_eps, num_attention_heads, num_key_value_heads,
max_position_embeddings, rope_theta). SGLang runs on its CPU platform (SGLANG_USE_CPU_ENGINE=1).
/start_profile runs torch.profiler with shapes and Python stacks, as SGLang's does, and writes
`<profile_id>-TP-0.trace.json.gz`. One TP rank only.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from sglang_child import _torchvision_ops  # noqa: E402
from standin_sglang_server import Emit, parse_args, serve  # noqa: E402


@dataclass
class Request:
    tokens: list[int]
    left: int
    emit: Emit
    done: threading.Event


def build_model(config: dict, seed: int = 0):
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.rotary_embedding import get_rope

    h, inter, eps = config["hidden_size"], config["intermediate_size"], config["rms_norm_eps"]
    heads = config.get("num_attention_heads", 4)
    head_dim = h // heads
    q_size, kv_size = heads * head_dim, config.get("num_key_value_heads", heads) * head_dim

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.input_layernorm = RMSNorm(h, eps=eps)
            self.qkv_proj = torch.nn.Linear(h, q_size + 2 * kv_size, bias=False)
            self.rotary_emb = get_rope(head_dim, head_dim, config.get("max_position_embeddings", 2048),
                                       config.get("rope_theta", 10000), is_neox_style=True)
            self.o_proj = torch.nn.Linear(q_size + 2 * kv_size, h, bias=False)
            self.post_attention_layernorm = RMSNorm(h, eps=eps)
            self.gate_up_proj = torch.nn.Linear(h, 2 * inter, bias=False)
            self.act_fn = SiluAndMul()
            self.down_proj = torch.nn.Linear(inter, h, bias=False)

        def forward(self, positions, x, residual):
            if residual is None:
                residual, x = x, self.input_layernorm(x)
            else:
                x, residual = self.input_layernorm(x, residual)
            q, k, v = self.qkv_proj(x).split([q_size, kv_size, kv_size], dim=-1)
            q, k = self.rotary_emb(positions, q, k)
            x, residual = self.post_attention_layernorm(self.o_proj(torch.cat([q, k, v], dim=-1)), residual)
            return self.down_proj(self.act_fn(self.gate_up_proj(x))), residual

    class TinyModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = torch.nn.Embedding(config["vocab_size"], h)
            self.layers = torch.nn.ModuleList(Layer() for _ in range(config["num_hidden_layers"]))
            self.norm = RMSNorm(h, eps=eps)
            self.lm_head = torch.nn.Linear(h, config["vocab_size"], bias=False)

        def forward(self, ids, positions):
            x, residual = self.embed_tokens(ids), None
            for layer in self.layers:
                x, residual = layer(positions, x, residual)
            x, _ = self.norm(x, residual)
            return torch.log_softmax(self.lm_head(x).float(), dim=-1)

    torch.manual_seed(seed)
    model = TinyModel()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                p.copy_(torch.rand_like(p) + 0.5)
            elif p.dim() == 2 and "embed" not in name:
                p.mul_(2.0)  # keep activations from shrinking layer by layer
    return model.eval()


class Scheduler:
    """One thread owns the model and the profiler (torch.profiler traces the thread that starts it)."""

    def __init__(self, model) -> None:
        self.model = model
        self.jobs: queue.Queue = queue.Queue()
        self.running: list[Request] = []
        self.profiler = None
        self.trace_path: Path | None = None
        threading.Thread(target=self._loop, daemon=True).start()

    def generate(self, input_ids: list[int], max_new_tokens: int, emit: Emit) -> None:
        done = threading.Event()
        self.jobs.put(("generate", Request(list(input_ids), max_new_tokens, emit, done)))
        done.wait()

    def start_profile(self, output_dir: Path, profile_id: str) -> None:
        self._call("start", output_dir / f"{profile_id}-TP-0.trace.json.gz")

    def stop_profile(self) -> None:
        self._call("stop", None)

    def _call(self, what: str, arg) -> None:
        done = threading.Event()
        self.jobs.put((what, (arg, done)))
        done.wait()

    def _loop(self) -> None:
        with torch.no_grad():
            while True:
                try:
                    job = self.jobs.get(block=not self.running)
                except queue.Empty:
                    job = None
                try:
                    self._handle(*job) if job else self._decode_step()
                except Exception:  # a failed step ends its requests (clients see short outputs), not the server
                    traceback.print_exc()
                    for req in [*self.running, *([job[1]] if job and job[0] == "generate" else [])]:
                        req.done.set()
                    self.running = []
                    if job and job[0] != "generate":
                        job[1][1].set()

    def _handle(self, what: str, arg) -> None:
        if what == "generate":
            self._prefill(arg)
            return
        path, done = arg
        if what == "start":
            self.trace_path = path
            self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                   record_shapes=True, with_stack=True)
            self.profiler.start()
        elif self.profiler is not None:
            self.profiler.stop()
            tmp = self.trace_path.with_name("." + self.trace_path.name)
            self.profiler.export_chrome_trace(str(tmp))
            os.replace(tmp, self.trace_path)
            self.profiler = None
        done.set()

    def _prefill(self, req: Request) -> None:
        logprobs = self.model(torch.tensor(req.tokens), torch.arange(len(req.tokens)))[-1]
        self._emit(req, logprobs)
        if req.left:
            self.running.append(req)

    def _decode_step(self) -> None:
        batch = list(self.running)
        logprobs = self.model(torch.tensor([r.tokens[-1] for r in batch]),
                              torch.tensor([len(r.tokens) - 1 for r in batch]))
        for req, row in zip(batch, logprobs, strict=True):
            self._emit(req, row)
        self.running = [r for r in self.running if r.left]

    @staticmethod
    def _emit(req: Request, logprobs) -> None:
        token = int(logprobs.argmax())
        req.tokens.append(token)
        req.left -= 1
        try:
            req.emit(token, float(logprobs[token]))
        except OSError:  # the client went away
            req.left = 0
        if not req.left:
            req.done.set()


def main() -> None:
    args = parse_args()
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"  # before SGLang's layers are imported: they read it then
    _torchvision_ops()
    from sglang.srt.plugins import load_plugins

    load_plugins()  # as SGLang's scheduler does, before any model code runs
    rendezvous = Path(tempfile.mkdtemp()) / "rendezvous"
    torch.distributed.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=0, world_size=1)
    config = json.loads((Path(args.model_path) / "config.json").read_text())
    model = build_model(config)
    serve(args, Scheduler(model), time.monotonic())
    from kernelbot.engine import sglang_plugin

    sglang_plugin.flush()
    os._exit(0)  # without waiting on the scheduler thread or the process group


if __name__ == "__main__":
    main()
