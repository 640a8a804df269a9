"""Helpers the tests share: files, ports, run records, and the kernel library's families built for a test."""

import contextlib
import importlib
import json
import socket
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def write_module(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return path


@contextlib.contextmanager
def loopback_listener() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP listener on 127.0.0.1 for the length of the block: (its port, what reached it)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.2)
    received: list[bytes] = []
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            received.append(conn.recv(100) or b"<connected>")
            conn.close()

    listener = threading.Thread(target=listen)
    listener.start()
    try:
        yield server.getsockname()[1], received
    finally:
        stop.set()
        listener.join()
        server.close()


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_closed(port: int) -> bool:
    """Nothing listens on the loopback port (a server the test started has stopped)."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def recorded_candidates(run_dir: Path) -> dict[str, dict]:
    """The candidate records a run's journal holds (read-only; none while the journal does not exist yet)."""
    if not (run_dir / "journal.sqlite").exists():
        return {}
    db = sqlite3.connect(f"file:{run_dir / 'journal.sqlite'}?mode=ro", uri=True)
    try:
        return {k: json.loads(d) for k, d in db.execute("SELECT key, data FROM records WHERE kind = 'candidate'")}
    except sqlite3.OperationalError:
        return {}
    finally:
        db.close()


def generic_pack(pack_dir: Path, capture, module_class: str):
    """A pack whose one generic kernel is a captured call's reference itself (for tests of the routing, not of a
    generated kernel), for the layers of `module_class` built like the captured one."""
    from kernelbot.kernel_library.base import GENERIC
    from kernelbot.records import Pack, PackEntry

    (pack_dir / "kernels").mkdir(parents=True)
    (pack_dir / "kernels" / "k.py").write_text(capture.reference + "\n\nModelNew = Model\n")
    entry = PackEntry(task_id="t", candidate_id="k", family=GENERIC, module_class=module_class,
                      input_shapes=[t.shape for t in capture.signature.tensors], init_args=[], dtype=capture.dtype,
                      backend="cpp", config={}, source_file="kernels/k.py", source_hash="test",
                      verification="pass: test", speedup=2.0, signature=capture.signature,
                      layer_variant=capture.variant)
    pack = Pack(version="t", run_id="r", device="cpu", entries=[entry])
    (pack_dir / "manifest.json").write_text(pack.model_dump_json())
    return pack


def family_wrapper(family_name: str, backend: str) -> type:
    """The class behind a family's backend ("cpp" → RMSNormCpp): its `wrappers` entry, imported."""
    from kernelbot.kernel_library import FAMILIES

    module, cls = FAMILIES[family_name].wrappers[backend].split(":")
    return getattr(importlib.import_module(f"kernelbot.kernel_library.{family_name}.{module}"), cls)


def family_pair(family_name: str, backend: str, *init_args: object) -> tuple[Any, Any]:
    """(reference, kernel) of a family, both built with these constructor arguments, in eval mode, the kernel holding
    the reference's weights."""
    from kernelbot.agent.verify.run import load_reference
    from kernelbot.kernel_library import FAMILIES

    reference = load_reference(FAMILIES[family_name].reference_path).Model(*init_args).eval()
    kernel = family_wrapper(family_name, backend)(*init_args).eval()
    kernel.load_state_dict(reference.state_dict())
    return reference, kernel


# assert_close's tolerances per activation dtype for a kernel against its reference in the same dtype
TOLERANCE = {"float32": {"rtol": 1e-4, "atol": 1e-5}, "bfloat16": {"rtol": 1.6e-2, "atol": 1e-2},
             "float16": {"rtol": 1e-3, "atol": 1e-3}}


def norm_off_after_first_call(scale: str) -> str:
    """A pack kernel source: the library's C++ RMSNorm, right on its first call on each layer (the call the router
    checks against the layer's own output) and `scale` times its output after: wrong where only fidelity sees it."""
    return ("from kernelbot.kernel_library.rmsnorm.cpp import RMSNormCpp\n\n\nclass ModelNew(RMSNormCpp):\n"
            "    calls = 0\n\n"
            "    def forward(self, x):\n"
            "        self.calls += 1\n"
            f"        return super().forward(x) * (1.0 if self.calls == 1 else {scale})\n")
