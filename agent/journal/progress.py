"""What a Ray cluster is doing for a run (`optimize --cluster`): its queue and each worker's candidate, kept by the
driver in the journal (meta `cluster`) and read back by `kernelbot status`."""

from __future__ import annotations

import time

from pydantic import BaseModel, Field


class Running(BaseModel):
    candidate: str
    node: str
    node_ip: str
    worker: str
    device: str
    attempt: int
    since: float


class ClusterProgress(BaseModel):
    """The queue and what each worker is doing; the driver keeps it in the journal (meta `cluster`) for status."""

    address: str
    nodes: int
    slots: int  # candidates the cluster can hold at once
    queued: int
    running: list[Running] = Field(default_factory=list)
    done: int = 0
    total: int = 0
    retried: int = 0  # candidates restarted after their worker or node died
    updated: float = 0.0

    def signature(self) -> tuple:
        """What changes when work moves (not merely ages)."""
        return (self.nodes, self.done, self.total, self.queued,
                tuple((r.candidate, r.node, r.attempt) for r in self.running))

    def lines(self, now: float | None = None) -> list[str]:
        now = now or time.time()
        head = (f"cluster {self.address}: {self.nodes} nodes, {self.slots} slots; {self.done}/{self.total} done, "
                f"{len(self.running)} running, {self.queued} queued" + (f", {self.retried} retried" if self.retried
                                                                         else ""))
        return [head] + [f"  {r.node[:8]} ({r.node_ip}) worker {r.worker[:8]} {r.device}: {r.candidate} "
                         f"{now - r.since:.0f} s" + (f", attempt {r.attempt}" if r.attempt > 1 else "")
                         for r in self.running]
