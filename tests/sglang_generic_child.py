"""Run by tests/test_sglang_plugin.py under the SGLang test environment's python: loads SGLang's plugins as its
scheduler does, builds SGLang's own GemmaRMSNorm (a fused op no kernelbot family covers) and calls it with a fused
residual add. What the plugin does is set by the environment (capture, or route a pack). Prints JSON: each call's
largest difference from SGLang's forward_native."""

from __future__ import annotations

import json

import torch


def main() -> None:
    for op in ("nms", "qnms"):  # see sglang_child._torchvision_ops
        torch.library.define(f"torchvision::{op}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.layers.layernorm import GemmaRMSNorm

    from kernelbot.engine import sglang_plugin

    torch.manual_seed(0)
    norm = GemmaRMSNorm(64, eps=1e-6).to(torch.bfloat16)
    diffs = []
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64) * 0.1)
        for _ in range(3):
            x, residual = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(4, 64, dtype=torch.bfloat16)
            want = norm.forward_native(x.clone(), residual.clone())
            got = norm(x, residual)
            diffs.append(max(float((g.float() - w.float()).abs().max()) for g, w in zip(got, want, strict=True)))
    sglang_plugin.flush()
    print(json.dumps({"diffs": diffs}))


if __name__ == "__main__":
    main()
