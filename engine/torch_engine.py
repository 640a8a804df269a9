"""In-process PyTorch/transformers engine: any causal LM that engine/models.py builds, run as a server would."""

from __future__ import annotations

import copy
import inspect
from pathlib import Path

import torch

from kernelbot.engine.graph_decode import StaticDecode, checked_graph_decode
from kernelbot.engine.kv_cache import cache_kwarg, returned_cache
from kernelbot.engine.models import (  # noqa: F401 (re-exported: callers import these from here)
    BUILTIN_MODELS,
    build_llama,
    build_model,
    builtin_spec,
    cpu_has_fast_bf16,
    resolve_spec,
)
from kernelbot.engine.patching import PackPatcher
from kernelbot.hardware.device import DeviceChoice, pick_device
from kernelbot.records import ModelSpec, Pack


def without_grouped_experts(model: torch.nn.Module) -> torch.nn.Module:
    """Mixture-of-experts layers default to torch's grouped_mm, which has no float64 kernel; the plain per-expert
    loop computes the same in any dtype."""
    implementation = getattr(getattr(model, "config", None), "_experts_implementation", None)
    if implementation not in (None, "eager") and hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    return model


def _tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    return [*model.parameters(), *model.buffers()]


def float64_copy(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A copy of `model` whose parameters and buffers are on `device`, floating ones in float64, copied tensor by
    tensor (tied weights stay tied): the model's own weights, without a second copy of it where it lives."""
    def widened(t: torch.Tensor) -> torch.Tensor:
        w = t.detach().to(device, torch.float64 if t.is_floating_point() else t.dtype)
        return torch.nn.Parameter(w, requires_grad=False) if isinstance(t, torch.nn.Parameter) else w

    return copy.deepcopy(model, {id(t): widened(t) for t in _tensors(model)})


def _greedy(logits: torch.Tensor) -> torch.Tensor:
    """The next token of each sequence from the last position's logits, taken in fp32 as transformers' generate
    and serving engines sample (argmax over bf16 logits is also several times slower on CPUs)."""
    return logits[:, -1].float().argmax(-1, keepdim=True)


class TorchEngine:
    """Runs a transformers causal LM in this process, the way a serving engine would:
    a batch of prompts through prefill, then greedy decode steps over the KV cache."""

    def __init__(self, spec: ModelSpec, device: DeviceChoice | str = "cpu") -> None:
        """The model and prompts on `device` (a DeviceChoice, or what pick_device takes). Weights and prompts are
        drawn on the CPU from the spec's seed and then moved, so every device runs the same model."""
        self.spec = spec
        self.device = device if isinstance(device, DeviceChoice) else pick_device(device)
        self._use(build_model(spec).to(self.device.torch_device))
        gen = torch.Generator().manual_seed(spec.seed + 1)
        prompts = torch.randint(0, spec.vocab, (spec.batch, spec.prompt_len), generator=gen)
        self.prompts = prompts.to(self.device.torch_device)
        self.patcher = PackPatcher(self.model)

    def _use(self, model: torch.nn.Module, forward_of: torch.nn.Module | None = None) -> None:
        """Run `model`; its forward's parameters are read from `forward_of` (a compiled model hides them)."""
        self.model = model
        self.cache_name = cache_kwarg((forward_of or model).forward)
        params = inspect.signature((forward_of or model).forward).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        self.forward_flags = {"use_cache": True} if "use_cache" in params or takes_any else {}
        if "logits_to_keep" in params:  # the last position's logits only, as generate and serving engines ask
            self.forward_flags["logits_to_keep"] = 1

    @torch.inference_mode()
    def generate(self, record_logits: bool = False,
                 forced: torch.Tensor | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Greedy decoding; with `forced` ([batch, decode_steps + 1] tokens), each step is fed the forced token
        instead of its own choice (teacher forcing), so logits compare in the same contexts."""
        out = self.model(input_ids=self.prompts, **self.forward_flags)
        cache = returned_cache(out)
        logits = [out.logits[:, -1].double()] if record_logits else []
        tokens = [_greedy(out.logits)]
        fed_so_far: list[torch.Tensor] = []
        for step in range(self.spec.decode_steps):
            fed = tokens[-1] if forced is None else forced[:, step:step + 1]
            fed_so_far.append(fed)
            if self.cache_name is not None and cache is not None:
                out = self.model(input_ids=fed, **self.forward_flags, **{self.cache_name: cache})
            else:  # a model that keeps no cache sees the whole sequence again
                out = self.model(input_ids=torch.cat([self.prompts, *fed_so_far], dim=1), **self.forward_flags)
            cache = returned_cache(out)
            if record_logits:
                logits.append(out.logits[:, -1].double())
            tokens.append(_greedy(out.logits))
        return torch.cat(tokens, dim=1), logits

    def run_workload(self) -> torch.Tensor:
        return self.generate()[0]

    def run_workload_and_wait(self) -> torch.Tensor:
        """The workload, returning once the device has finished it."""
        tokens = self.run_workload()
        self.device.synchronize()
        return tokens

    def profile(self, trace_path: Path) -> None:
        from kernelbot.engine.capture import profile_callable

        # on a GPU the workload ends when the device is done: a trace stopped earlier would miss its last kernels
        workload = self.run_workload_and_wait if self.device.is_gpu else self.run_workload
        workload()  # warm-up outside the trace
        profile_callable(workload, trace_path)

    def apply_pack(self, pack: Pack, pack_dir: Path) -> None:
        self.patcher.apply(pack, pack_dir)

    def remove_pack(self) -> None:
        self.patcher.remove()

    def in_float64(self) -> TorchEngine:
        """The same model and prompts in float64: how far the model's own dtype is from exact arithmetic. The twin
        lives where its float64 weights fit: on the model's GPU when its free memory holds them, else on the host
        (an 8B model's are 64 GB); its tensors are widened one by one, so no second copy of the model is made."""
        nbytes = sum(8 * t.numel() for t in _tensors(self.model) if t.is_floating_point())
        home = self.device if self.device.holds(nbytes) else pick_device("cpu")
        twin = object.__new__(TorchEngine)
        twin.spec, twin.prompts, twin.device = self.spec, self.prompts.to(home.torch_device), home
        twin._use(without_grouped_experts(float64_copy(self.model, home.torch_device)))
        twin.patcher = PackPatcher(twin.model)
        return twin

    def static_decode(self, graphs: bool) -> StaticDecode:
        """The same model and prompts decoded over a static KV cache; with `graphs` (GPUs), each decode step replays a
        captured graph, as serving engines run decode (captured and checked against the loop without a graph)."""
        return checked_graph_decode(self) if graphs else StaticDecode(self, graphs=False)

    @property
    def graph_decode_baseline(self) -> bool:
        """Whether the end-to-end rounds time graph-replayed decode: on a GPU, for a model that keeps a KV cache."""
        return self.device.is_gpu and self.cache_name is not None

    def compiled(self) -> TorchEngine:
        """The same engine with the model under torch.compile (dynamic shapes: decode grows the cache)."""
        twin = object.__new__(TorchEngine)
        twin.spec, twin.prompts, twin.patcher, twin.device = self.spec, self.prompts, self.patcher, self.device
        twin._use(torch.compile(self.model, dynamic=True), forward_of=self.model)
        return twin
