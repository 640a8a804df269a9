"""`kernelbot optimize`'s options: one pydantic record, stored in the run's journal as JSON so a resumed run reads
what the first session was given (the stored shape is the fields by name; older journals read back alike)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from kernelbot.agent.llm.loop import LLMOptions
from kernelbot.engine.serving.served import ServeOptions


class OptimizeOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    model: str = "llama-tiny"
    dtype: str = "auto"
    batch: int = 8
    prompt_len: int = 32
    decode_steps: int = 32
    seed: int = 0
    run_dir: Path | None = None
    min_share: float = 0.005
    max_tasks: int = 8  # per iteration
    timeout: float = 300.0
    bench_rounds: int = 15
    e2e_rounds: int = 7
    compile: bool = True
    families: list[str] | None = None  # only these kernel_library families (default: all)
    llm: LLMOptions | None = None  # generate with this LLM instead of the built-in proposer
    budget_hours: float | None = None  # wall time of the whole run, every resumed session included
    iterations: int = 3  # profile → generate → integrate rounds at most
    max_task_minutes: float | None = None  # per task, built-in and stored candidates
    store: Path | None = None  # kernel store to reuse from and add to (None: none)
    device: str = "auto"  # auto: a GPU when one is visible, else the CPU (engine/device.py)
    cluster: str | None = None  # a Ray cluster's address: candidates are evaluated there (agent/cluster.py)
    serve: ServeOptions | None = None  # the model served by vLLM or SGLang (None: in this process)
    peak_tflops: float | None = None  # the device's peaks as given, instead of measured (--peak-tflops, --peak-gbps)
    peak_gbps: float | None = None

