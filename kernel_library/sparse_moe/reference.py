import torch
import torch.nn.functional as F
from torch import nn


class Router(nn.Module):
    def __init__(self, hidden_size: int, num_experts: int, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(num_experts, hidden_size, dtype=dtype) * hidden_size ** -0.5)


class Experts(nn.Module):
    """Every expert's weights, stacked as transformers keeps them: gate_up_proj [E, 2I, H] (gate rows first),
    down_proj [E, H, I]."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, dtype: torch.dtype):
        super().__init__()
        self.gate_up_proj = nn.Parameter(
            torch.randn(num_experts, 2 * intermediate_size, hidden_size, dtype=dtype) * hidden_size ** -0.5)
        self.down_proj = nn.Parameter(
            torch.randn(num_experts, hidden_size, intermediate_size, dtype=dtype) * intermediate_size ** -0.5)


class Model(nn.Module):
    """Mixtral's sparse MoE block: a router scores every expert per token (softmax in fp32), the top k are kept and
    their probabilities renormalised to sum to one; each kept expert is a gated MLP, down(silu(gate(x)) * up(x)), and
    a token's output is its experts' outputs weighted by those probabilities."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 dtype: str = "float32"):
        super().__init__()
        self.top_k = top_k
        self.gate = Router(hidden_size, num_experts, getattr(torch, dtype))
        self.experts = Experts(hidden_size, intermediate_size, num_experts, getattr(torch, dtype))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [M,H] -> (weights [M,k] fp32, expert ids [M,k]): the same ops as Mixtral's router, so a kernel that
        routes through this method picks the experts the model picks."""
        probs = F.softmax(F.linear(x, self.gate.weight).float(), dim=-1)
        top, index = torch.topk(probs, self.top_k, dim=-1)
        return top / top.sum(dim=-1, keepdim=True), index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = x.shape[-1]
        rows = x.reshape(-1, hidden)
        weights, index = self.route(rows)
        out = torch.zeros_like(rows)
        inter = self.experts.down_proj.shape[-1]
        for e in range(self.experts.gate_up_proj.shape[0]):
            token, slot = torch.where(index == e)
            if token.numel() == 0:
                continue
            h = F.linear(rows[token], self.experts.gate_up_proj[e])
            y = F.linear(F.silu(h[:, :inter]) * h[:, inter:], self.experts.down_proj[e])
            out.index_add_(0, token, (y * weights[token, slot, None]).to(out.dtype))
        return out.view(x.shape)
