import torch
import torch.nn.functional as F
from torch import nn

# A task overrides these with the engine's observed shapes and the layer's arguments:
# x [tokens, hidden]; topk_weights [tokens, top_k] (fp32); topk_ids [tokens, top_k] (int32)
INPUT_SHAPES = [[6, 64], [6, 2], [6, 2]]
DTYPE = torch.float32
INIT_ARGS = [64, 96, 4, 2, "float32"]


class Model(nn.Module):
    """A mixture of experts' expert half, the router's choices given: token t goes to experts topk_ids[t] with
    weights topk_weights[t]; each expert is a gated SiLU MLP, down(silu(gate(x)) * up(x)), its gate and up rows stacked
    in w13_weight [E, 2I, H] (gate first), its down projection in w2_weight [E, H, I] (vLLM's FusedMoE layout). A
    token's output is the weighted sum of its experts' outputs, summed in fp32 and rounded once to x's dtype."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 dtype: str = "float32"):
        super().__init__()
        self.top_k = top_k
        self.w13_weight = nn.Parameter(
            torch.randn(num_experts, 2 * intermediate_size, hidden_size, dtype=getattr(torch, dtype))
            * hidden_size ** -0.5)
        self.w2_weight = nn.Parameter(
            torch.randn(num_experts, hidden_size, intermediate_size, dtype=getattr(torch, dtype))
            * intermediate_size ** -0.5)

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        inter = self.w2_weight.shape[-1]
        for e in range(self.w13_weight.shape[0]):
            token, slot = torch.where(topk_ids == e)
            if token.numel() == 0:
                continue
            h = F.linear(x[token], self.w13_weight[e])
            y = F.linear(F.silu(h[:, :inter]) * h[:, inter:], self.w2_weight[e])
            out.index_add_(0, token, y.float() * topk_weights[token, slot, None].float())
        return out.to(x.dtype)


def get_inputs():
    """Tokens at INPUT_SHAPES' sizes, each routed to top_k distinct experts with weights that sum to one, as a
    renormalised top-k router gives them."""
    (tokens, hidden), (_, top_k), _ = INPUT_SHAPES
    experts = INIT_ARGS[2]
    ids = torch.stack([torch.randperm(experts)[:top_k] for _ in range(tokens)]) if tokens else \
        torch.zeros(0, top_k, dtype=torch.int64)
    weights = torch.rand(tokens, top_k) + 0.05
    return [torch.randn(tokens, hidden, dtype=DTYPE), weights / weights.sum(-1, keepdim=True), ids.to(torch.int32)]


def get_init_inputs():
    return list(INIT_ARGS)
