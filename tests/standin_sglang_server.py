"""A stand-in for `python -m sglang.launch_server`: the HTTP surface kernelbot's SGLang adapter drives.

/health_generate; /generate, streamed (SSE chunks carrying meta_info.completion_tokens, as SGLang streams
them) or not (output_ids, and meta_info.output_token_logprobs with return_logprob); /start_profile and
/stop_profile (one Kineto trace per TP rank, written after the stop returns). Exits on SIGTERM.

What answers the requests is a backend. This file's own has no model (fixed token delay, a hand-made trace
naming a pack kernel when SGLANG_PLUGINS selects kernelbot's plugin): it checks the adapter against the
protocol. tests/tiny_sglang_server.py serves a small model built from SGLang's real layer classes instead.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Protocol

TOKEN_DELAY_S = 0.002

# emit(token_id, logprob) for each generated token, in order
Emit = Callable[[int, float], None]


class Backend(Protocol):
    def generate(self, input_ids: list[int], max_new_tokens: int, emit: Emit) -> None: ...
    def start_profile(self, output_dir: Path, profile_id: str) -> None: ...
    def stop_profile(self) -> None: ...


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--disable-cuda-graph", action="store_true")
    parser.add_argument("--startup-s", type=float, default=0.5)
    parser.add_argument("--die", action="store_true", help="exit before becoming ready")
    args, _ = parser.parse_known_args()
    return args


def serve(args: argparse.Namespace, backend: Backend, ready_at: float) -> None:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a) -> None:
            pass

        def _json(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health_generate" and time.monotonic() >= ready_at:
                self._json(200, {})
            else:
                self._json(503, {"error": "not ready"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path == "/generate":
                self._generate(body)
            elif self.path == "/start_profile":
                backend.start_profile(Path(body["output_dir"]), body.get("profile_id", "profile"))
                self._json(200, {"ok": True})
            elif self.path == "/stop_profile":
                self._json(200, {"ok": True})
                threading.Thread(target=backend.stop_profile).start()  # ranks write after the reply
            else:
                self._json(404, {"error": self.path})

        def _generate(self, body: dict) -> None:
            params = body.get("sampling_params", {})
            n, prompt = params["max_new_tokens"], body["input_ids"]
            ids: list[int] = []
            logprobs: list[list] = []

            def meta() -> dict:
                out = {"completion_tokens": len(ids), "prompt_tokens": len(prompt)}
                if body.get("return_logprob"):
                    out["output_token_logprobs"] = logprobs
                return out

            def emit(token: int, logprob: float) -> None:
                ids.append(token)
                logprobs.append([logprob, token, None])
                if body.get("stream"):
                    chunk = {"text": "x" * len(ids), "meta_info": meta()}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())

            if body.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                backend.generate(prompt, n, emit)
                self.wfile.write(b"data: [DONE]\n\n")
            else:
                backend.generate(prompt, n, emit)
                self._json(200, {"text": "x" * len(ids), "output_ids": ids, "meta_info": meta()})

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()


class FakeBackend:
    """No model: a token every TOKEN_DELAY_S; the trace is two hand-made kernel events per rank."""

    def __init__(self, tp: int) -> None:
        self.tp = tp
        self.plugin = os.environ.get("SGLANG_PLUGINS") == "kernelbot_pack"
        self.profile_dir: Path | None = None

    def generate(self, input_ids: list[int], max_new_tokens: int, emit: Emit) -> None:
        for i in range(max_new_tokens):
            time.sleep(TOKEN_DELAY_S)
            emit((sum(input_ids) + i) % 1000, -0.5)

    def start_profile(self, output_dir: Path, profile_id: str) -> None:
        self.profile_dir = output_dir

    def stop_profile(self) -> None:
        time.sleep(0.3)
        assert self.profile_dir is not None
        for rank in range(self.tp):
            kernels = ["ampere_sgemm_128x64_tn", "kb_rmsnorm_kernel" if self.plugin else "RMSNormKernel"]
            events = [{"ph": "X", "cat": "kernel", "name": k, "ts": 10 * i, "dur": 5, "pid": 0, "tid": 7}
                      for i, k in enumerate(kernels)]
            with gzip.open(self.profile_dir / f"kernelbot-TP-{rank}.trace.json.gz", "wt") as f:
                json.dump({"traceEvents": events}, f)


def main() -> None:
    args = parse_args()
    if args.die:
        sys.exit(3)
    serve(args, FakeBackend(args.tp), time.monotonic() + args.startup_s)


if __name__ == "__main__":
    main()
