"""Where kernelbot keeps what it builds and stores on this machine, worked out in one place.

The root is $KERNELBOT_CACHE, else ~/.cache/kernelbot. Under it: `cpp/` (C++ kernel builds), `cscan-*.so` (the
profiler's compiled scanner) and `store/` (accepted kernels; $KERNELBOT_STORE moves the store on its own).
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "KERNELBOT_CACHE"
STORE_ENV = "KERNELBOT_STORE"


def cache_dir(*parts: str) -> Path:
    """The cache root ($KERNELBOT_CACHE, else ~/.cache/kernelbot), or `parts` joined under it; nothing is created."""
    root = os.environ.get(CACHE_ENV)
    return (Path(root) if root else Path.home() / ".cache" / "kernelbot").joinpath(*parts)


def store_dir() -> Path:
    """The kernel store's root: $KERNELBOT_STORE, else `store/` in the cache root."""
    root = os.environ.get(STORE_ENV)
    return Path(root) if root else cache_dir("store")
