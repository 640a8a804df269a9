"""The run directory: where every stage writes its records (docs/records.md walks through it)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from pydantic import BaseModel

from kernelbot import KernelbotError

DEFAULT_ROOT = Path("runs")


def new_run_dir(run_dir: Path | None) -> tuple[str, Path]:
    """Create (or reuse an empty) run directory; fail in one line when it cannot be written."""
    if run_dir is None:
        run_id = dt.datetime.now().strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        run_dir = DEFAULT_ROOT / run_id
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise KernelbotError(f"run directory {run_dir} is not writable ({exc.strerror}): pass --run-dir DIR") from None
    return run_dir.name, run_dir


def write_record(path: Path, record: BaseModel | list[BaseModel]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(record, list):
        text = "[\n" + ",\n".join(r.model_dump_json(indent=2) for r in record) + "\n]\n"
    else:
        text = record.model_dump_json(indent=2) + "\n"
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
