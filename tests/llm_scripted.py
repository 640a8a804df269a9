"""A local OpenAI-compatible chat server that answers from scripted conversations.

Each request is matched to a conversation by the task id in its prompt ("Task id: ..."), and the step within
that conversation by how many previous attempts the prompt reports ("### Attempt "), so a repair round gets
the next answer only if the loop really fed the last one back. A step is an answer (text), or an HTTP error
(status, body), optionally repeated. Run as a script to serve the built-in rmsnorm conversation:
`python tests/llm_scripted.py --port 8765`.
"""

from __future__ import annotations

import argparse
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

KERNELS = Path(__file__).with_name("llm_kernels")


@dataclass
class Reply:
    text: str = ""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    raw: bool = False  # send `text` as the whole body (a malformed response)


def fenced(code: str, prose: str = "Here is the kernel.") -> str:
    return f"{prose}\n\n```python\n{code}```\n\nThis should be faster than the reference."


# The failing answers are the correct kernel with one bug each, so the three differ in exactly that line.
BUGS = {
    "rmsnorm_compile_error": ("float ss = 0.f;", "float ss = 0.f  /* missing semicolon */"),
    "rmsnorm_numeric_bug": ("1.f / sqrtf(ss / (float)n + (float)eps);",
                            "1.f / (ss / (float)n + (float)eps);  /* forgot the square root */"),
}


def kernel(name: str) -> str:
    if name in BUGS:
        source, (right, wrong) = kernel("rmsnorm_correct"), BUGS[name]
        assert right in source, f"{name}: the line to break is gone from rmsnorm_correct.py"
        return source.replace(right, wrong)
    return (KERNELS / f"{name}.py").read_text()


class Script:
    """conversations: {task-id substring: [step, step, ...]}; a step is a Reply or a list of Replies (served in
    order for the same step: e.g. a 429 then the answer)."""

    def __init__(self, conversations: dict[str, list]) -> None:
        self.conversations = conversations
        self.requests: list[dict] = []
        self.served: dict[tuple[str, int], int] = {}
        self.lock = threading.Lock()

    def reply(self, body: dict, headers: dict[str, str]) -> Reply:
        prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
        match = re.search(r"Task id: (\S+)", prompt)
        task = match.group(1) if match else ""
        step = prompt.count("### Attempt ")
        with self.lock:
            self.requests.append({"task": task, "step": step, "prompt": prompt, "body": body,
                                  "authorization": headers.get("authorization", "")})
            key = next((k for k in self.conversations if k in task), None)
            if key is None:
                return Reply(json.dumps({"error": {"message": f"no script for task {task!r}"}}), 400)
            steps = self.conversations[key]
            entry = steps[min(step, len(steps) - 1)]
            if isinstance(entry, list):
                n = self.served.get((key, step), 0)
                self.served[(key, step)] = n + 1
                entry = entry[min(n, len(entry) - 1)]
            return entry


def _handler(script: Script) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            reply = script.reply(body, {k.lower(): v for k, v in self.headers.items()})
            if reply.raw:
                payload = reply.text.encode()
            elif reply.status != 200:
                payload = reply.text.encode() or json.dumps({"error": {"message": "scripted failure"}}).encode()
            else:
                prompt_chars = sum(len(str(m.get("content", ""))) for m in body.get("messages", []))
                payload = json.dumps({
                    "id": "chatcmpl-scripted", "object": "chat.completion", "created": 0,
                    "model": body.get("model", "scripted"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": reply.text}}],
                    "usage": {"prompt_tokens": prompt_chars // 4, "completion_tokens": len(reply.text) // 4,
                              "total_tokens": prompt_chars // 4 + len(reply.text) // 4},
                }).encode()
            self.send_response(reply.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            for k, v in reply.headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(payload)

    return Handler


class ScriptedServer:
    """Serves in a thread of this process; `stop()` ends it (no process is started)."""

    def __init__(self, script: Script, port: int = 0) -> None:
        self.script = script
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(script))
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def rmsnorm_conversation() -> list:
    """Does not compile, then a numeric bug, then a correct kernel."""
    return [Reply(fenced(kernel("rmsnorm_compile_error"))), Reply(fenced(kernel("rmsnorm_numeric_bug"))),
            Reply(fenced(kernel("rmsnorm_correct")))]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    server = ScriptedServer(Script({"rmsnorm": rmsnorm_conversation()}), args.port)
    print(f"serving {server.api_base}", flush=True)
    server.httpd.serve_forever()
