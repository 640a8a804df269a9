"""How a transformers model takes and returns its KV cache: the keyword changed name in transformers 5."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

CACHE_NAMES = ("cache", "past_key_values")  # transformers 5 renamed past_key_values; older models keep it


def cache_kwarg(forward: Callable[..., Any]) -> str | None:
    """The name under which this forward (a model's, a layer's) takes its KV cache, or None when it takes none."""
    params = inspect.signature(forward).parameters
    return next((name for name in CACHE_NAMES if name in params), None)


def returned_cache(out: Any) -> Any:
    """The cache a forward returned, under whichever name it uses."""
    fields = out if isinstance(out, Mapping) else vars(out)
    return next((fields[name] for name in CACHE_NAMES if fields.get(name) is not None), None)
