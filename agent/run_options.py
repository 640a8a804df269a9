"""`kernelbot optimize`'s options: one pydantic record with its constraints, the command line's defaults read from
it (kernelbot/flags.py), stored in the run's journal as JSON so a resumed run reads what the first session was given
(the stored shape is the fields by name; older journals read back alike)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kernelbot.agent.llm.llm_options import LLMOptions
from kernelbot.engine.serving.serve_options import Lengths, ServeOptions


class OptimizeOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    model: str = "llama-tiny"
    dtype: str = "auto"
    batch: int = Field(8, ge=1)
    prompt_len: int = Field(32, ge=1)
    decode_steps: int = Field(32, ge=1)
    lengths: Lengths = Lengths.FIXED  # how each request's prompt and output lengths are drawn (served runs)
    seed: int = 0
    run_dir: Path | None = None
    min_share: float = Field(0.005, ge=0, lt=1)  # hotspots under this share of the profiled time get no task
    max_tasks: int = Field(8, ge=0)  # per iteration
    timeout: float = Field(300.0, gt=0)  # seconds per candidate job in the sandbox
    bench_rounds: int = Field(15, ge=1)
    e2e_rounds: int = Field(7, ge=1, json_schema_extra={"flag": "--rounds"})
    compile: bool = True
    families: list[str] | None = None  # only these kernel_library families (default: all)
    llm: LLMOptions | None = None  # generate with this LLM instead of the built-in proposer
    budget_hours: float | None = Field(None, gt=0)  # wall time of the whole run, every resumed session included
    iterations: int = Field(3, ge=1)  # profile → generate → integrate rounds at most
    max_task_minutes: float | None = Field(None, gt=0)  # per task, built-in and stored candidates
    store: Path | None = None  # kernel store to reuse from and add to (None: none)
    device: str = "auto"  # auto: a GPU when one is visible, else the CPU (hardware/device.py)
    # the GPU architecture candidates' kernels are compiled for ahead of time (agent/verify/compile_gate.py): None,
    # sm_90 on a CPU and the GPU's own on a GPU
    target: str | None = None
    cluster: str | None = None  # a Ray cluster's address: candidates are evaluated there (agent/cluster.py)
    serve: ServeOptions | None = None  # the model served by vLLM or SGLang (None: in this process)
    # the device's peaks as given, instead of measured
    peak_tflops: float | None = Field(None, gt=0)
    peak_gbps: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _lengths_need_a_server(self) -> OptimizeOptions:
        if self.lengths is not Lengths.FIXED and self.serve is None:
            raise ValueError(f"--lengths {self.lengths.value} needs a served engine (--engine vllm or sglang): in this "
                             "process the batch runs as one block of equal lengths; use --lengths fixed here")
        return self
