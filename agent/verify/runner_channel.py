"""The channel between the harness and its runners, both sides of it: length-prefixed frames over a pipe, what a
runner sends read back as plain data only (no class may be looked up, so no code of a runner's runs in the harness),
and tensors as plain data: ("T", dtype, shape, stride, offset, bytes), a call's outputs encoded in the runner and a
reply's values decoded in the harness; an input moved to the runner's device with its whole storage (_on).

Imported by runner.py (the runner's side) and harness.py (the harness's side), importing neither. The runner binds
these functions into its tools before the candidate loads, and its seal covers this module too.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any, NoReturn

import torch

from kernelbot.agent.verify import messages

# Bound before any candidate code runs: replacing these later does not reach the harness or the runner loop.
_Tensor = torch.Tensor
_T = torch._C.TensorBase
_detach, _cpu, _contiguous, _reshape, _view = _T.detach, _T.cpu, _T.contiguous, _T.reshape, _T.view
_numpy, _untyped_storage, _set, _empty = _T.numpy, _T.untyped_storage, _T.set_, torch.empty
_as_strided, _to_device = _T.as_strided, _T.to
_write, _read = os.write, os.read
_leaves = messages.output_leaves


class RunnerDied(Exception):
    """The runner ended, or its messages could not be read, in the middle of a request."""


# ---------------------------------------------------------------- framing (both sides)

def _send(fd: int, payload: bytes) -> None:
    data = len(payload).to_bytes(8, "little") + payload
    view = memoryview(data)
    while view:
        view = view[_write(fd, view):]


def _recv(fd: int) -> bytes:
    header = _read_exactly(fd, 8)
    return _read_exactly(fd, int.from_bytes(header, "little"))


def _read_exactly(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = _read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other end closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class _PlainUnpickler(pickle.Unpickler):
    """What a runner sends is plain data: no class may be looked up, so no code of its runs here."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise pickle.UnpicklingError(f"refused {module}.{name}: runners send plain data only")


def _plain_loads(data: bytes) -> Any:
    return _PlainUnpickler(io.BytesIO(data)).load()


# ---------------------------------------------------------------- tensors as plain data

def _encode(t: torch.Tensor, whole_storage: bool = False) -> tuple:
    """A plain tensor as plain data: ("T", dtype, shape, stride, offset, bytes). With `whole_storage`, every byte
    of its storage (guard regions around an input included); else a contiguous copy of its values."""
    if whole_storage:
        c = _on(_detach(t), "cpu")
        raw = _numpy(_set(_empty(0, dtype=torch.uint8), _untyped_storage(c))).tobytes()
        return ("T", str(t.dtype).removeprefix("torch."), tuple(t.shape), tuple(c.stride()), c.storage_offset(), raw)
    c = _contiguous(_cpu(_detach(t)))
    raw = _numpy(_view(_reshape(c, (-1,)), torch.uint8)).tobytes() if c.numel() else b""
    return ("T", str(t.dtype).removeprefix("torch."), tuple(t.shape), tuple(c.stride()), 0, raw)


def _decode(item: Any) -> Any:
    if not (isinstance(item, tuple) and len(item) == 6 and item[0] == "T"):
        return item
    _, dtype_name, shape, stride, offset, raw = item
    dtype = getattr(torch, str(dtype_name), None)
    if not isinstance(dtype, torch.dtype):
        raise RunnerDied(f"unknown dtype {str(dtype_name)[:40]!r} in a runner's reply")
    storage = torch.frombuffer(bytearray(raw), dtype=torch.uint8).untyped_storage() if raw else \
        torch.empty(0, dtype=torch.uint8).untyped_storage()
    return torch.empty(0, dtype=dtype).set_(storage, int(offset), tuple(shape), tuple(stride))


def _outputs(value: Any, facts: dict[str, list[str]]) -> tuple[list[Any], list[Any]]:
    """(encoded outputs, the output objects): containers opened as messages.output_leaves does (through the base
    types' own methods), plain tensors copied at once, numbers kept, anything else refused (a tensor subclass is not
    touched, so nothing lazy of it runs)."""
    items = _leaves(value)
    encoded = []
    for o in items:
        if type(o) is _Tensor:
            encoded.append(_encode(o))
        elif isinstance(o, torch.Tensor):
            facts["subclass"].append(f"returned a {type(o).__module__}.{type(o).__qualname__}")
            encoded.append(None)
        elif o is None or type(o) in (int, float, bool):
            encoded.append(o)
        else:
            facts["subclass"].append(f"returned a {type(o).__qualname__} (only tensors and numbers are outputs)")
            encoded.append(None)
    return encoded, items


def _on(t: torch.Tensor, device: str) -> torch.Tensor:
    """`t` on `device` in the same layout with its whole storage: guard regions around an input and a strided view's
    gaps go along, so writes a kernel makes there on a GPU are seen as on a CPU (`Tensor.to` copies the elements
    alone)."""
    if t.device.type == torch.device(device).type:
        return t
    item, nbytes = t.element_size(), _untyped_storage(t).nbytes()
    if nbytes % item:
        return _to_device(t, device)
    flat = _set(_empty(0, dtype=t.dtype, device=t.device), _untyped_storage(t), 0, (nbytes // item,), (1,))
    return _as_strided(_to_device(flat, device), t.shape, t.stride(), t.storage_offset())


def _decoded(values: list[Any] | None) -> list[Any]:
    return [_decode(v) for v in values] if values is not None else []
