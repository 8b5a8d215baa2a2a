"""Exact gradients and per-sample gradient estimates on a tabular problem.

A gradient estimator is a surrogate loss over a batch of rows. Its gradient with respect to the
policy's parameters theta (flattened, `[P]`) is, by the chain rule,
    sum_{b,t} dS/dlogp[b,t] * dlogp[b,t]/dtheta + dS/dKL[b,t] * dKL[b,t]/dtheta,
and the Jacobians `dlogp/dtheta`, `dKL/dtheta` of every sequence are computed once, exactly. One
backward pass through the surrogate then yields the gradient estimate of every row at once, which
makes means and variances over 10^5 samples cheap and exact expectations possible.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from softrl.tabular.problem import TabularProblem

# surrogate(logp [B, T], ref_logp [B, T], mask [B, T], token_kl [B, T], reward [B]) -> scalar
Surrogate = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


def flatten(logits: list[Tensor]) -> Tensor:
    return torch.cat([x.detach().flatten() for x in logits])


def unflatten(problem: TabularProblem, flat: Tensor) -> list[Tensor]:
    sizes = [problem.vocab ** (t + 1) for t in range(problem.length)]
    return [x.view(-1, problem.vocab) for x in torch.split(flat, sizes)]


def token_kl_of(problem: TabularProblem, logits: list[Tensor]) -> Tensor:
    """Exact `KL(pi(.|y_<t) || pi0(.|y_<t))` at every position of every sequence: `[N, T]`."""
    full = problem.next_token_logp(logits)
    return (full.exp() * (full - problem.ref_next_token_logp)).sum(-1)


def sequence_jacobians(problem: TabularProblem, logits: list[Tensor]) -> tuple[Tensor, Tensor]:
    """(`dlogp/dtheta`, `dKL_t/dtheta`), each `[N, T, P]`, at the policy `logits`."""
    flat = flatten(logits)
    jac = torch.autograd.functional.jacobian
    j_logp = jac(lambda v: problem.token_logp(unflatten(problem, v)), flat, vectorize=True)
    j_kl = jac(lambda v: token_kl_of(problem, unflatten(problem, v)), flat, vectorize=True)
    return j_logp, j_kl


def exact_gradient(problem: TabularProblem, logits: list[Tensor], objective: Callable[[list[Tensor]], Tensor]) -> Tensor:
    """`d objective(logits) / d theta` by autograd on the enumeration: `[P]`."""
    flat = flatten(logits).requires_grad_(True)
    (grad,) = torch.autograd.grad(objective(unflatten(problem, flat)), flat)
    return grad


def group_gradients(
    problem: TabularProblem,
    logits: list[Tensor],
    surrogate: Surrogate,
    index: Tensor,
    group_size: int,
    jacobians: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """The estimate of each group of `group_size` consecutive rows of `index`: `[G, P]`.

    `surrogate` must average over its rows (as the objectives of `softrl.algorithms` do without
    weights), so that G groups give `(1/G) sum_g estimate_g`.
    """
    j_logp, j_kl = sequence_jacobians(problem, logits) if jacobians is None else jacobians
    logp = problem.token_logp(logits).detach()[index].requires_grad_(True)  # [B, T]
    kl = token_kl_of(problem, logits).detach()[index].requires_grad_(True)  # [B, T]
    ref = problem.token_logp(problem.ref_logits)[index]
    loss = surrogate(logp, ref, torch.ones_like(ref), kl, problem.reward[index])
    d_logp, d_kl = torch.autograd.grad(loss, (logp, kl), allow_unused=True)
    rows = torch.einsum("bt,btp->bp", d_logp, j_logp[index])
    if d_kl is not None:
        rows = rows + torch.einsum("bt,btp->bp", d_kl, j_kl[index])
    groups = index.shape[0] // group_size
    return rows.view(groups, group_size, -1).sum(1) * groups
