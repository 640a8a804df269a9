"""What the LLM stage is given: the model and endpoint, samples and repair rounds, retries, and its budget (one
pydantic record with its constraints; the flags that set it are agent/llm/flags.py)."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kernelbot.agent.llm.budget import Budget
from kernelbot.agent.llm.client import safe_url


class LLMOptions(BaseModel):
    model_config = ConfigDict(frozen=True)

    model: str = Field(json_schema_extra={"flag": "--llm"})
    api_base: str | None = None
    samples: int = Field(2, ge=1)  # answers asked for per round
    repair_rounds: int = Field(2, ge=0)  # rounds after the first, each fed the reports of all earlier attempts
    budget: Budget = Field(default_factory=Budget)
    timeout: float = Field(180.0, gt=0, json_schema_extra={"flag": "--llm-timeout"})  # seconds per request
    max_retries: int = Field(4, ge=0, json_schema_extra={"flag": "--llm-retries"})
    backoff: float = Field(2.0, gt=0)  # first wait after a retryable failure; doubles each time
    temperature: float = Field(0.7, ge=0)
    # $ per million input/output tokens, for unpriced models
    price: tuple[float, float] | None = Field(None, json_schema_extra={"flag": "--llm-price"})

    @field_validator("model")
    @classmethod
    def _named(cls, model: str) -> str:
        if not model.strip():
            raise ValueError("--llm needs a litellm model string, e.g. openai/gpt-4o or hosted_vllm/my-model")
        return model

    @field_validator("api_base")
    @classmethod
    def _url(cls, api_base: str | None) -> str | None:
        if api_base and not re.match(r"https?://[^/\s]+", api_base):
            raise ValueError(f"--api-base must be an http(s) URL, got {safe_url(api_base)!r}")
        return api_base
