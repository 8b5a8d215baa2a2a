"""Train any loss on a tabular problem, with exact expectations or with sampled sequences.

The trainer knows no algorithm: a loss is any callable `TabularBatch -> scalar`. In exact mode
the batch holds every group of `group_size` sequences (as multisets, see `exact_groups`) with its
probability under `mu` spread over its members, so a loss that reduces with `weights` yields the
exact expectation of its (group) estimator under `mu`. In sampled mode the batch holds `samples`
sequences drawn from `mu`, in groups of `group_size`, and `weights` is None (plain mean).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from softrl.algorithms.spo import q0_from_samples
from softrl.tabular.problem import TabularPolicy, TabularProblem

DATA_KINDS = ("on-policy", "off-policy")


@dataclass
class TabularBatch:
    """What a learner would hand an algorithm, for sequences `index` `[B]` of a tabular problem."""

    index: Tensor  # [B] sequence ids
    logp: Tensor  # [B, T] log pi(y_t|y_<t), differentiable
    ref_logp: Tensor  # [B, T] log pi0
    old_logp: Tensor  # [B, T] log pi at batch creation (detached): PPO's ratio denominator
    behavior_logp: Tensor  # [B, T] log mu, the policy the batch was sampled from (detached)
    token_kl: Tensor  # [B, T] exact KL(pi || pi0) at each prefix, differentiable
    values: Tensor  # [B, T] value table V(y_<t), differentiable (PPO)
    old_values: Tensor  # [B, T] values at batch creation (detached)
    mask: Tensor  # [B, T]
    reward: Tensor  # [B]
    q0: Tensor  # [B] the exact Q0_hat = V*
    beta: float
    group_size: int
    weights: Tensor | None  # [B] exact-expectation weights, None when sampled


LossFn = Callable[[TabularBatch], Tensor]


@dataclass
class TrainResult:
    policy: TabularPolicy
    kl: list[float] = field(default_factory=list)  # KL(pi || pi*) before each step and after the last
    skipped_steps: int = 0


@functools.lru_cache(maxsize=8)
def _multisets(n_seq: int, group_size: int) -> tuple[Tensor, Tensor]:
    """Every multiset of `group_size` of `n_seq` ids `[M, n]`, and its multiplicity `n!/prod count!` `[M]`."""
    if math.comb(n_seq + group_size - 1, group_size) > 500_000:
        raise ValueError(f"exact expectation over groups of {group_size} of {n_seq} sequences is too large: sample instead")
    groups = torch.combinations(torch.arange(n_seq), r=group_size, with_replacement=True)  # [M, n]
    counts = torch.nn.functional.one_hot(groups, n_seq).sum(1)  # [M, N]
    log_multiplicity = math.lgamma(group_size + 1) - torch.lgamma(counts.double() + 1).sum(-1)  # [M]
    return groups, log_multiplicity.exp()


def exact_groups(probs: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """Every multiset of `group_size` sequences, flattened: (index `[M * n]`, weight `[M * n]`).

    A group estimator is symmetric in the order of its group, so the exact expectation over
    ordered i.i.d. tuples equals the sum over multisets weighted by their multinomial probability
    `n! / prod_v count_v! * prod_i mu(y_i)`, spread as `1/n` over the members.
    """
    groups, multiplicity = _multisets(probs.shape[0], group_size)
    prob = multiplicity.to(probs.dtype) * probs[groups].prod(-1)  # [M]
    return groups.reshape(-1), (prob[:, None] / group_size).expand_as(groups).reshape(-1)


def make_batch(
    problem: TabularProblem,
    policy: TabularPolicy,
    index: Tensor,
    old_logp: Tensor,
    behavior_logp: Tensor,
    old_values: Tensor,
    group_size: int,
    weights: Tensor | None,
    q0: str = "exact",
) -> TabularBatch:
    """Gather every per-sequence quantity of the current policy for the sequences `index`. `q0`: "exact"
    (the problem's V*), or estimated from each group of `group_size` consecutive rows, as a run without a
    stored Q0 would (`spo.q0_from_samples`, importance-weighted by pi0 / mu; "group" plain, "jackknife"
    corrected)."""
    logits = policy.policy_parameters()
    full = problem.next_token_logp(logits)  # [N, T, V]
    ref_full = problem.ref_next_token_logp  # [N, T, V]
    seqs = problem.sequences
    logp = full.gather(-1, seqs[..., None]).squeeze(-1)  # [N, T]
    ref_logp = ref_full.gather(-1, seqs[..., None]).squeeze(-1)  # [N, T]
    token_kl = (full.exp() * (full - ref_full).nan_to_num(0.0)).sum(-1)  # [N, T] (0 at the environment's)
    values = value_table(problem, policy)  # [N, T]
    mask = problem.policy_mask.to(logp.dtype).expand_as(logp)  # [N, T]: the environment's tokens are no action

    def policy_only(x: Tensor) -> Tensor:  # as a learner sees them: the environment's positions hold 0
        return torch.where(mask > 0, x, torch.zeros_like(x))

    return TabularBatch(
        index=index,
        logp=policy_only(logp)[index],
        ref_logp=policy_only(ref_logp)[index],
        old_logp=policy_only(old_logp)[index],
        behavior_logp=policy_only(behavior_logp)[index],
        token_kl=token_kl[index],
        values=values[index],
        old_values=old_values[index],
        mask=mask[index],
        reward=problem.reward[index],
        q0=batch_q0(problem, index, behavior_logp, group_size, q0),
        beta=problem.beta,
        group_size=group_size,
        weights=weights,
    )


Q0_ESTIMATES = ("exact", "group", "jackknife")


def batch_q0(problem: TabularProblem, index: Tensor, behavior_logp: Tensor, group_size: int, how: str) -> Tensor:
    """Each row's Q0: the exact V*, or its group's estimate from the group's own rewards: `[B]`."""
    if how not in Q0_ESTIMATES:
        raise ValueError(f"q0 must be one of {', '.join(Q0_ESTIMATES)}, got q0={how!r}")
    if how == "exact":
        return torch.full((index.shape[0],), problem.v_star, dtype=torch.float64)
    log_w = (problem.seq_logp(problem.ref_logits) - behavior_logp.sum(-1))[index].view(-1, group_size)  # [G, n]
    estimate = q0_from_samples(problem.reward[index].view(-1, group_size), log_w, problem.beta,
                               "jackknife" if how == "jackknife" else "none")  # [G]
    return estimate.repeat_interleave(group_size)


def value_table(problem: TabularProblem, policy: TabularPolicy) -> Tensor:
    """`V(y_<t)` of every sequence and position from the policy's value tables: `[N, T]`."""
    return torch.stack([policy.values[t][problem.prefix_indices[t]] for t in range(problem.length)], dim=1)


def train(
    problem: TabularProblem,
    loss_fn: LossFn,
    *,
    data: str = "off-policy",
    behaviour_logits: list[Tensor] | None = None,
    steps: int = 300,
    lr: float = 0.1,
    samples: int | None = None,
    group_size: int = 1,
    epochs: int = 1,
    final_lr_ratio: float = 0.01,
    max_grad_norm: float | None = None,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    q0: str = "exact",
    start_logits: list[Tensor] | None = None,
) -> TrainResult:
    """Adam on the policy's tables, starting at pi = pi0, learning rate decayed by a cosine from `lr`
    to `lr * final_lr_ratio` (BCE's kink at log-probability 0 makes a constant rate oscillate there).

    data: `on-policy` samples from the current pi (mu = pi, detached); `off-policy` from the fixed
    `behaviour_logits` (default pi0). `samples=None` uses exact expectations, otherwise `samples`
    sequences per step (`group_size` must divide it). `epochs` > 1 reuses each batch (PPO-style).
    `q0`: the rows' Q0 (`batch_q0`). `start_logits`: where pi starts (default pi0).
    """
    if data not in DATA_KINDS:
        raise ValueError(f"data must be one of {DATA_KINDS}, got data={data!r}")
    if samples is not None and (samples < group_size or samples % group_size):
        raise ValueError(f"samples={samples} must be a positive multiple of group_size={group_size}")
    behaviour = problem.ref_logits if behaviour_logits is None else behaviour_logits
    policy = TabularPolicy(problem.ref_logits if start_logits is None else start_logits)
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps * epochs, eta_min=lr * final_lr_ratio)
    gen = torch.Generator().manual_seed(seed)
    result = TrainResult(policy)
    for step in range(steps):
        old_logp = problem.token_logp([x.detach() for x in policy.policy_parameters()]).detach()  # [N, T]
        mu_logp = old_logp if data == "on-policy" else problem.token_logp(behaviour).detach()  # [N, T]
        old_values = value_table(problem, policy).detach()  # [N, T]
        probs = mu_logp.sum(-1).exp()  # [N]
        if samples is None:
            index, weights = exact_groups(probs, group_size)
            if problem.env_logp:  # groups the environment never gives weigh 0: left out, not 0 * a loss of -inf
                index, weights = index[weights > 0], weights[weights > 0]
        else:
            index, weights = torch.multinomial(probs, samples, replacement=True, generator=gen), None
        result.kl.append(problem.kl_to_optimal(policy.policy_parameters()))
        for _ in range(epochs):
            loss = loss_fn(make_batch(problem, policy, index, old_logp, mu_logp, old_values, group_size, weights, q0))
            optimizer.zero_grad()
            if not torch.isfinite(loss):
                result.skipped_steps += 1
                continue
            loss.backward()
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
            optimizer.step()
            scheduler.step()
        if progress is not None:
            progress(step)
    result.kl.append(problem.kl_to_optimal(policy.policy_parameters()))
    return result
