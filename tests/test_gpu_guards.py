"""On a GPU a verified call's inputs reach the device with their guard regions, in the same layout, so a write past an
input is found there as on a CPU (an H200 node, 2026-12-04: `Tensor.to` copied the elements alone, and every input of
a correct Triton kernel came back "written in its guard region"). Tried here on torch's meta device, which keeps
layouts and storage sizes without a GPU."""

from __future__ import annotations

import pytest
import torch

from kernelbot.agent.verify import runner_channel
from kernelbot.agent.verify.judge import guard, guards_intact


@pytest.mark.parametrize("front", [True, False])
def test_an_input_goes_to_another_device_with_its_whole_storage_in_the_same_layout(front: bool) -> None:
    sent = guard(torch.randn(6, 5).t(), front=front)  # strided, gaps and guard regions around it
    moved = runner_channel._on(sent, "meta")
    assert moved.device.type == "meta"
    assert (moved.shape, moved.stride(), moved.storage_offset()) == (sent.shape, sent.stride(), sent.storage_offset())
    assert moved.untyped_storage().nbytes() == sent.untyped_storage().nbytes()


def test_an_input_already_on_the_device_is_the_same_tensor_and_its_guards_read_back_intact() -> None:
    sent = guard(torch.randn(3, 4))
    assert runner_channel._on(sent, "cpu") is sent
    _, dtype, shape, stride, offset, raw = runner_channel._encode(sent, whole_storage=True)
    back = runner_channel._decode(("T", dtype, shape, stride, offset, raw))
    assert guards_intact(back, sent)
    storage = back.untyped_storage()
    last = storage.nbytes() - 1  # one byte of the guard after it
    storage[last] = storage[last] ^ 0xFF
    assert not guards_intact(back, sent)
