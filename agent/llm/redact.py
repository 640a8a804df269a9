"""Secrets never leave the process: every record written about an LLM call goes through `redact`."""

from __future__ import annotations

import os
import re
from typing import Any

from kernelbot.sandbox.confine import SECRET_NAME

MASK = "[REDACTED]"
# Key shapes that are secrets whatever variable they came from (OpenAI/Anthropic/HF/AWS/Google/bearer tokens).
_PATTERNS = [
    re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-]{12,}"),
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    re.compile(r"\bAIza[0-9A-Za-z_\-]{30,}"),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=\-]{8,}"),
    re.compile(r"(?i)((?:api[_-]?key|token|secret|password)[\"']?\s*[:=]\s*[\"']?)[^\s\"'&,}]{6,}"),
]


def secret_values() -> list[str]:
    """Values of the environment's secret-looking variables, longest first (so overlaps mask fully)."""
    values = {v for k, v in os.environ.items() if SECRET_NAME.search(k) and len(v) >= 6}
    return sorted(values, key=len, reverse=True)


def redact(value: Any, extra: list[str] | None = None) -> Any:
    """The same structure with every secret masked: env values, explicitly given ones, and key-shaped strings."""
    secrets = [s for s in (extra or []) if s and len(s) >= 4] + secret_values()
    return _walk(value, secrets)


def _walk(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, MASK)
        for pattern in _PATTERNS:
            value = pattern.sub(lambda m: (m.group(1) if m.groups() else "") + MASK, value)
        return value
    if isinstance(value, dict):
        return {k: _walk(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_walk(v, secrets) for v in value]
    return value
