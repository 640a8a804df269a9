"""A stand-in for `python -m sglang.launch_server`: the HTTP surface kernelbot's SGLang adapter drives, with no
model behind it. /health_generate, streaming /generate (SSE chunks carrying meta_info.completion_tokens, as
SGLang streams them), /start_profile and /stop_profile (one Kineto-style trace per TP rank, written after the
stop returns, naming a pack kernel when SGLANG_PLUGINS selects kernelbot's plugin). Exits on SIGTERM.

It checks the adapter against the protocol, not SGLang itself (a real server needs a GPU)."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TOKEN_DELAY_S = 0.002


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--disable-cuda-graph", action="store_true")
    parser.add_argument("--startup-s", type=float, default=0.5)
    parser.add_argument("--die", action="store_true", help="exit before becoming ready")
    args, _ = parser.parse_known_args()
    if args.die:
        sys.exit(3)
    state = {"profile_dir": None, "ready_at": time.monotonic() + args.startup_s}
    plugin = os.environ.get("SGLANG_PLUGINS") == "kernelbot_pack"

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
            if self.path == "/health_generate" and time.monotonic() >= state["ready_at"]:
                self._json(200, {})
            else:
                self._json(503, {"error": "not ready"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path == "/generate":
                n = body["sampling_params"]["max_new_tokens"]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for i in range(1, n + 1):
                    time.sleep(TOKEN_DELAY_S)
                    chunk = {"text": "x" * i, "meta_info": {"completion_tokens": i,
                                                            "prompt_tokens": len(body["input_ids"])}}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
            elif self.path == "/start_profile":
                state["profile_dir"] = Path(body["output_dir"])
                self._json(200, {"ok": True})
            elif self.path == "/stop_profile":
                self._json(200, {"ok": True})
                threading.Thread(target=write_traces, args=(state["profile_dir"], args.tp, plugin)).start()
            else:
                self._json(404, {"error": self.path})

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()


def write_traces(out: Path, tp: int, plugin: bool) -> None:
    time.sleep(0.3)  # ranks write after /stop_profile has returned
    for rank in range(tp):
        kernels = ["ampere_sgemm_128x64_tn", "kb_rmsnorm_kernel" if plugin else "RMSNormKernel"]
        events = [{"ph": "X", "cat": "kernel", "name": k, "ts": 10 * i, "dur": 5, "pid": 0, "tid": 7}
                  for i, k in enumerate(kernels)]
        with gzip.open(out / f"kernelbot-TP-{rank}.trace.json.gz", "wt") as f:
            json.dump({"traceEvents": events}, f)


if __name__ == "__main__":
    main()
