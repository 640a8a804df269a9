"""Accepted kernels → a versioned kernel pack: pack/manifest.json plus each kernel's source."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from kernelbot import __version__
from kernelbot.outcomes import Accepted
from kernelbot.records import Pack, PackEntry, Verdict


def verification_summary(verdict: Verdict) -> str:
    passed = [c.id for c in verdict.checks if c.status == "pass"]
    return f"{verdict.verdict}: {', '.join(passed)} on {len(verdict.shapes)} input sets"


def build_pack(accepted: list[Accepted], run_id: str, device: str, pack_dir: Path) -> Pack:
    if pack_dir.exists():
        shutil.rmtree(pack_dir)
    (pack_dir / "kernels").mkdir(parents=True)
    entries = []
    for a in accepted:
        rel = f"kernels/{a.entry_id}.py"
        shutil.copyfile(a.source, pack_dir / rel)
        entries.append(PackEntry(
            task_id=a.task.id, candidate_id=a.entry_id, family=a.task.family,
            module_class=a.task.module_class, input_shapes=a.task.input_shapes, init_args=a.task.init_args,
            profiled_dims=a.task.profiled_dims, dtype=a.task.dtype,
            backend=a.candidate.backend, config=a.candidate.config, source_file=rel,
            source_hash=a.candidate.source_hash, verification=verification_summary(a.verdict),
            speedup=a.bench.speedup, signature=a.task.signature, module_paths=a.task.module_paths,
            layer_variant=a.task.layer_variant))
    digest = hashlib.sha256("".join(e.model_dump_json() for e in entries).encode()).hexdigest()[:12]
    pack = Pack(version=f"{__version__}+{digest}", run_id=run_id, device=device, entries=entries)
    (pack_dir / "manifest.json").write_text(pack.model_dump_json(indent=2))
    return pack
