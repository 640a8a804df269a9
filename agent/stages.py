"""A run's progress lines: each stage printed as it starts and appended to the run's log.txt; while a step that takes
more than a few seconds runs, a spinner on the console says what it is doing (the log keeps only the lines)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from kernelbot.records import Hotspot


class Stages:
    """Prints each stage as it starts and appends it to the run's log.txt (readable with tail -f)."""

    def __init__(self, console: Console, run_dir: Path, t0: float = 0.0) -> None:
        self.console, self.log_path, self.t0 = console, run_dir / "log.txt", time.perf_counter() - t0

    def say(self, message: str, style: str = "") -> None:
        stamp = f"[{time.perf_counter() - self.t0:6.1f}s]"
        self.console.print(f"[dim]{stamp}[/dim] {message}", style=style, highlight=False)
        with open(self.log_path, "a") as log:
            log.write(f"{stamp} {message}\n")
            log.flush()

    @contextlib.contextmanager
    def working(self, message: str) -> Iterator[None]:
        """A spinner with `message` while the block runs; gone from the console when it ends."""
        with self.console.status(f"[dim]{message}[/dim]"):
            yield

    def hotspots(self, hotspots: list[Hotspot], shown: int = 6) -> None:
        """The top of a ranking, a line each: share of the profile, headroom over the roofline, and the pack kernel
        already running there."""
        for h in hotspots[:shown]:
            self.say(f"      {h.id} {h.module_class:28s} {h.share:6.1%}  headroom {h.score_us / 1e3:8.1f} ms"
                     + (f"  (pack kernel {h.kernel})" if h.kernel else ""))
