"""Decode the way serving engines run it on GPUs: a static KV cache sized for the whole workload, and each decode step
replayed from a graph captured once on the device, so no step pays for launching its kernels one by one from
Python. This is the baseline a GPU user compares kernels against, beside eager and torch.compile.

The loop itself is device-neutral: the step reads its token and position from fixed input buffers and writes the next
token into a fixed output buffer, so replaying a captured step is the same as calling it. On a CPU there is nothing
to capture (the device layer says so) and the tests run the same static loop without a graph, against the eager
engine's tokens."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from kernelbot import KernelbotError

if TYPE_CHECKING:
    from kernelbot.engine.torch_engine import TorchEngine


class StaticDecode:
    """Greedy decoding of an engine's prompts over a transformers StaticCache; with `graphs`, the decode step is
    captured once on the device and replayed."""

    def __init__(self, engine: TorchEngine, graphs: bool) -> None:
        from transformers import StaticCache

        spec = engine.spec
        if engine.cache_name is None:
            raise KernelbotError(f"{spec.name}: its forward takes no KV cache, so it cannot decode over a static "
                                 "cache; compare against eager and torch.compile only")
        self.engine, self.graphs = engine, graphs
        place = engine.device.torch_device
        self.cache = StaticCache(config=engine.model.config, max_cache_len=spec.prompt_len + spec.decode_steps + 1)
        if graphs and any(getattr(layer, "is_sliding", False) for layer in getattr(self.cache, "layers", ())):
            raise KernelbotError(f"{spec.name}: its sliding-window cache layers track their position in Python, so a "
                                 "captured decode step would replay one step's positions; compare against eager and "
                                 "torch.compile only")
        self.token = torch.zeros(spec.batch, 1, dtype=torch.long, device=place)  # the step's input
        self.position = torch.zeros(1, dtype=torch.long, device=place)  # where the step writes in the cache
        self.next_token = torch.zeros(spec.batch, 1, dtype=torch.long, device=place)  # the step's output
        self._replay: Callable[[], None] | None = None

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        out = self.engine.model(input_ids=input_ids, cache_position=positions, use_cache=True,
                                **{self.engine.cache_name: self.cache}, **_last_logits_only(self.engine))
        return out.logits[:, -1].float().argmax(-1, keepdim=True)

    def _step(self) -> None:
        """One decode step from the fixed buffers to the fixed output: the body a graph captures."""
        self.next_token.copy_(self._forward(self.token, self.position))

    def _prefill(self) -> torch.Tensor:
        prompts = self.engine.prompts
        self.cache.reset()
        first = self._forward(prompts, torch.arange(prompts.shape[1], device=prompts.device))
        self.position.fill_(prompts.shape[1])
        return first

    def _stepper(self) -> Callable[[], None]:
        """The decode step to call per token: captured once, or the plain step where graphs are off. The cache
        writes where its own on-device counter says (advanced by the warm-up and captured calls too); every run
        starts by resetting cache and counter in place, so the replayed step and `position` (the masks' and RoPE's)
        stay in step."""
        if not self.graphs:
            return self._step
        if self._replay is None:
            self._prefill()
            self.token.copy_(self.engine.prompts[:, -1:])
            self._replay = self.engine.device.capture(self._step)
        return self._replay

    @torch.inference_mode()
    def run_workload(self) -> torch.Tensor:
        step = self._stepper()
        tokens = [self._prefill()]
        for _ in range(self.engine.spec.decode_steps):
            self.token.copy_(tokens[-1])
            step()
            tokens.append(self.next_token.clone())
            self.position.add_(1)
        return torch.cat(tokens, dim=1)

    def run_workload_and_wait(self) -> torch.Tensor:
        tokens = self.run_workload()
        self.engine.device.synchronize()
        return tokens


def _last_logits_only(engine: TorchEngine) -> dict[str, int]:
    return {"logits_to_keep": 1} if "logits_to_keep" in engine.forward_flags else {}


def checked_graph_decode(engine: TorchEngine) -> StaticDecode:
    """Graph-replayed decode that is known to decode what the same static loop decodes without a graph (a model that
    keeps a step's state in Python would replay stale state: its tokens would differ). Raises KernelbotError naming
    why there is none."""
    graphed = StaticDecode(engine, graphs=True)
    try:
        replayed = graphed.run_workload()
    except RuntimeError as exc:  # an op the capture cannot record (a host sync, a new allocation from a list)
        raise KernelbotError(f"capturing the decode step failed: {str(exc).splitlines()[0][:200]}") from exc
    if not torch.equal(replayed, StaticDecode(engine, graphs=False).run_workload()):
        raise KernelbotError("the replayed decode step decoded other tokens than the same loop without a graph")
    return graphed
