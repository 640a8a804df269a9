"""The store of accepted kernels, keyed by op signature, backend and device, so that a later run (or another model
with the same op) reuses a verified kernel before spending on a new one.

Data lives under $KERNELBOT_STORE, else ~/.cache/kernelbot/store (store/ under $KERNELBOT_CACHE when that is set; see
kernelbot.paths): one folder per (signature, backend, device) holding `candidate.py` and `entry.json` (the candidate,
its verdict and benchmark, the run it came from). A reused kernel is verified and benchmarked again in the run that
reuses it, like any candidate.

The same folder remembers losses (`losses.json`): candidates, by source identity, that verified but were slower than
the op beyond their benchmark's noise on a quiet host, so a later run does not propose them again for that op on that
device (a change to the candidate or to the library files it uses makes another identity, which is tried afresh).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Any

from kernelbot.kernel_library.identity import source_identity
from kernelbot.paths import store_dir as store_root  # where the store lives unless a caller names a root
from kernelbot.records import Task


def op_signature(task: Task) -> dict[str, Any]:
    """What a kernel must match to replace this op: family, module, dtype, shapes and weights' sizes."""
    return {"family": task.family, "module": task.module_class, "dtype": task.dtype,
            "input_shapes": task.input_shapes, "init_args": task.init_args}


def _key(signature: dict[str, Any], backend: str, device: str) -> str:
    text = json.dumps([signature, backend, device], sort_keys=True)
    return f"{signature['family']}-{backend}-{hashlib.sha256(text.encode()).hexdigest()[:20]}"


def current_imports(source: str) -> str:
    """A stored kernel's source with the library's module paths as they are now: the families' C++ wrappers moved
    from `<family>/cpu.py` to `<family>/cpp.py`, and kernels stored before that import the old path."""
    return re.sub(r"\b(kernelbot\.kernel_library\.\w+)\.cpu import\b", r"\1.cpp import", source)


class KernelStore:
    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root else store_root()

    def lookup(self, task: Task, backend: str, device: str) -> tuple[str, dict[str, Any]] | None:
        """(source, entry) of the stored kernel for this op, backend and device, or None. The entry's `source_hash`
        is the source's identity now (its text and the library files it imports as they are today), not when it was
        stored: a library edit since then makes it another candidate, which no journal has an outcome for."""
        folder = self.root / _key(op_signature(task), backend, device)
        try:
            entry = json.loads((folder / "entry.json").read_text())
            source = current_imports((folder / "candidate.py").read_text())
        except (OSError, ValueError):
            return None
        return source, {**entry, "source_hash": source_identity(source)}

    def add(self, task: Task, backend: str, device: str, source: str, entry: dict[str, Any]) -> Path:
        """Write (or replace) the kernel for this op; atomic per file, so a reader never sees half of one."""
        folder = self.root / _key(op_signature(task), backend, device)
        folder.mkdir(parents=True, exist_ok=True)
        entry = {**entry, "signature": op_signature(task), "backend": backend, "device": device,
                 "stored_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        for name, text in (("candidate.py", source), ("entry.json", json.dumps(entry, indent=2))):
            tmp = folder / f".{name}.tmp"
            tmp.write_text(text)
            tmp.replace(folder / name)
        return folder

    def record_loss(self, task: Task, backend: str, device: str, source_hash: str, speedup: float,
                    run_id: str) -> None:
        """Remember that this candidate lost to the op here."""
        folder = self.root / _key(op_signature(task), backend, device)
        folder.mkdir(parents=True, exist_ok=True)
        losses = self.losses(task, backend, device)
        losses[source_hash] = {"speedup": speedup, "run_id": run_id, "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        tmp = folder / ".losses.json.tmp"
        tmp.write_text(json.dumps(losses, indent=2))
        tmp.replace(folder / "losses.json")

    def losses(self, task: Task, backend: str, device: str) -> dict[str, dict[str, Any]]:
        """Candidates (source identity → speedup, run) that lost to this op on this device."""
        try:
            found = json.loads((self.root / _key(op_signature(task), backend, device) / "losses.json").read_text())
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}
