"""How a served engine is run (which engine, from which Python, with which server arguments): light enough for the
command line to read its defaults without importing torch or the engine."""

from __future__ import annotations

import sys
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field


class Lengths(str, Enum):
    """How a load's request lengths are drawn (seeded), up to its prompt length and decode steps."""

    FIXED = "fixed"  # every request the whole prompt length and output
    UNIFORM = "uniform"  # each uniform between a quarter of the maximum and the maximum
    CHAT = "chat"  # long-tailed, as chat traffic is: log-normal around a quarter of the maximum, many short, few long


class EngineKind(str, Enum):
    VLLM = "vllm"
    SGLANG = "sglang"


class ServeOptions(BaseModel):
    """How the served engine is run: which engine, from which Python, with which extra server arguments; the
    workload's shape comes from the run's batch, prompt length and decode steps."""

    model_config = ConfigDict(frozen=True)

    engine: EngineKind
    # the engine environment's interpreter
    python: list[str] = Field(default_factory=lambda: [sys.executable], json_schema_extra={"flag": "--engine-python"})
    # the server's program instead of `python -m <the engine's server module>`
    launch: list[str] | None = Field(None, json_schema_extra={"flag": "--launch-cmd"})
    server_args: list[str] = Field(default_factory=list, json_schema_extra={"flag": "--server-arg"})
    port: int = Field(8100, ge=1, le=65535)  # taken when free, else another
    tp: int = Field(1, ge=1)
    requests_per_round: int = Field(32, ge=1)
    probe_prompts: int = Field(4, ge=1)
    ready_timeout: float = Field(900.0, gt=0)
