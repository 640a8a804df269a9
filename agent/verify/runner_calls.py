"""The runner's side of the harness's sampled pass and op log: the calls the harness samples from outside (`op_sample`:
as many as each request asks for, no count of the runner's own), then the op log's call, and the outputs of both
checked and held (`op_profile`). The runner binds these into its tools before the candidate loads and seals this
module with its own (runner.py); what the harness measures of the pass is in parent_sampling.py.

Imported by runner.py only; imports nothing of the harness's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from kernelbot.agent.verify.messages import SampleRequest

if TYPE_CHECKING:
    from kernelbot.agent.verify.runner import Tools, Watch

HELD_BYTES = 64 << 20  # outputs of the sampled (and repeated) calls the runner holds to the end of the job
# the sampled pass's state between its requests: (its inputs, the outputs of its calls held so far, bytes left to hold)
NO_PASS: tuple = ((), (), HELD_BYTES)


def kept(tools: Tools, encoded: list[Any], items: list[Any]) -> tuple:
    """What the runner holds of a call's outputs to the end of the job: the objects, digests of their encoded bytes
    (compared again when the job ends), the byte ranges their elements lie in."""
    return items, tuple(tools.sha256(e[5]).digest() if e else None for e in encoded), tuple(tools.spans(items))


def op_sample(watch: Watch, model: torch.nn.Module, request: SampleRequest, sampled: tuple,
              channel: tuple[int, int]) -> tuple:
    """`request.calls` calls on the pass's inputs (staged by the request that brings them), each one's outputs held
    while they fit HELD_BYTES (not encoded: that would be time in torch, counted as the candidate's). The harness
    samples these calls from outside the process, its sampler on exactly around them: a mark before the first and
    after the last (messages.SampleMark), each answered before the runner goes on (`channel`: the runner's ends of
    the pipes, to read and to write). Nothing about the calls is reported back."""
    tools = watch.tools
    calls = request.calls  # read before the first call
    inputs, outputs, room = sampled
    if request.inputs is not None:
        inputs, outputs, room = tuple(tools.to(request.inputs, watch.setup.device)), (), HELD_BYTES
    made = []
    if not calls:
        return inputs, outputs, room
    start, end = (tools.dumps(("event", "sample_mark", {"phase": phase})) for phase in ("start", "end"))
    _mark(tools, channel, start)
    try:
        with torch.inference_mode():
            for _ in range(calls):
                items = tools.leaves(model(*inputs))
                size = sum(t.numel() * t.element_size() for t in items if isinstance(t, torch.Tensor))
                if size <= room:
                    room -= size
                    made.append(items)
    finally:
        _mark(tools, channel, end)
    return inputs, (*outputs, *made), room


def _mark(tools: Tools, channel: tuple[int, int], mark: bytes) -> None:
    """A sampling mark (pickled before the calls: no pickling while the sampler is on) to the harness, then its answer
    (the harness's sampler switched on or off)."""
    tools.send(channel[1], mark)
    tools.recv(channel[0])


def op_profile(watch: Watch, model: torch.nn.Module, inputs: list[Any], held: tuple, facts: dict[str, list[str]],
               sampled: tuple, checked: list[int]) -> tuple[dict[str, Any], list[list[Any]], tuple]:
    """The op log of one call. Its outputs and the sampled calls' are held too, and none may share memory with an
    output held before it: a candidate that cycles through more output buffers than a verification makes calls is
    caught reusing one. The profiled call's outputs and the sampled calls' the harness picked (`checked`, once the
    pass had run) go back encoded to be checked: a call made under the profiler or the sampler is a call like any
    other."""
    tools = watch.tools
    picks = sorted(set(checked))  # read before the call
    with torch.inference_mode():
        profile = tools.profile_call(model, inputs, watch.places, tools.windows)
    profiled = [tools.leaves(out) for out in profile.pop("outputs")]
    sampled_outputs = list(sampled[1])
    earlier = [r for h in held for r in h[2]]
    for items in sampled_outputs + profiled:
        found = tools.aliasing(items, inputs, earlier)
        if found:
            facts["aliasing"].append(f"one of {len(sampled_outputs) + len(profiled)} repeated calls: {found[0]}")
            break
        earlier += tools.spans(items)
    picked = [k for k in picks if 0 <= k < len(sampled_outputs)]
    sent = [tools.outputs_of(items, facts) for items in profiled + [sampled_outputs[k] for k in picked]]
    unread = [items for k, items in enumerate(sampled_outputs) if k not in picked]
    return profile, [encoded for encoded, _ in sent], (
        *held, *(kept(tools, encoded, items) for encoded, items in sent),
        *((items, (), tuple(tools.spans(items))) for items in unread))
