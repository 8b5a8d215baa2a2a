"""The log-prob of the chosen token straight from hidden states, `z = hidden @ W^T + b`:

    log pi(y | .) = z_y - logsumexp(z),      d log pi(y | .) / dz = onehot(y) - softmax(z)

The `[N, V]` logits live only inside the forward pass and are recomputed in the backward pass, which
forms the gradient of the logits in place in one buffer: no log-softmax, gather-scatter or one-hot
tensors of the vocabulary's width, as autograd of `log_softmax(z).gather(y)` would build them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _wide(z: Tensor) -> Tensor:
    """Logits in at least fp32 (a bf16 or fp16 log-softmax loses the small probabilities)."""
    return z if z.dtype == torch.float64 else z.float()


class _ChosenLogp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, entropy: bool):
        z = F.linear(hidden, weight, bias)  # [N, V], in autocast's dtype where autocast is on
        ctx.dtype = z.dtype
        z = _wide(z)
        lse = torch.logsumexp(z, -1)  # [N]
        log_dist = z.sub_(lse[:, None])  # in place: z is not needed again
        logp = log_dist.gather(-1, targets[:, None]).squeeze(-1)  # [N]
        ent = -torch.linalg.vecdot(log_dist.exp(), log_dist) if entropy else None  # [N]
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        if ent is not None:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp: Tensor, _grad_entropy):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        dtype = ctx.dtype
        w = weight.to(dtype)
        z = _wide(F.linear(hidden.to(dtype), w, None if bias is None else bias.to(dtype)))  # [N, V]
        grad_z = z.sub_(lse[:, None]).exp_().mul_(-grad_logp[:, None])  # -g * softmax(z)
        grad_z.scatter_add_(-1, targets[:, None], grad_logp[:, None].to(grad_z.dtype))  # + g * onehot(y)
        grad_z = grad_z.to(dtype)
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = (grad_z @ w).to(hidden.dtype) if need_hidden else None
        grad_weight = (grad_z.t() @ hidden.to(dtype)).to(weight.dtype) if need_weight else None
        grad_bias = grad_z.sum(0).to(bias.dtype) if need_bias else None
        return grad_hidden, grad_weight, grad_bias, None, None


def chosen_logp(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, entropy: bool = False
                ) -> tuple[Tensor, Tensor | None]:
    """(log pi(y | .) `[N]`, the entropy `[N]` detached or None) for hidden states `[N, H]` and chosen
    tokens `[N]` under the output layer `hidden @ weight^T + bias` (weight `[V, H]`)."""
    return _ChosenLogp.apply(hidden, weight, bias, targets, entropy)
