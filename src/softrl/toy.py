"""`softrl toy`: every loss trained on the exact tabular problem, scored by KL(pi || pi*).

This module composes `softrl.algorithms` with `softrl.tabular`; it holds no math of its own
beyond wiring a `TabularBatch` into each objective's arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from softrl.algorithms import agro, grpo, ppo, spo
from softrl.tabular import TabularBatch, TabularProblem, train

B = TabularBatch


@dataclass(frozen=True)
class ToyMethod:
    name: str
    loss: Callable[[TabularBatch], Tensor]
    group_size: int = 1  # generations per prompt the estimator needs (exact mode enumerates tuples)
    data: tuple[str, ...] = ("off-policy", "on-policy")
    epochs: int = 1


def _spo(**objective) -> Callable[[TabularBatch], Tensor]:
    def loss(b: B) -> Tensor:
        return spo.spo_loss(b.logp, b.ref_logp, b.mask, b.reward, b.q0, b.beta, weights=b.weights, **objective)[0]

    return loss


def _agro(fn: Callable, **kw) -> Callable[[TabularBatch], Tensor]:
    def loss(b: B) -> Tensor:
        return fn(b.logp, b.ref_logp, b.mask, b.reward, b.beta, b.group_size,
                  token_kl=b.token_kl, weights=b.weights, **kw)[0]

    return loss


def _ppo(b: B) -> Tensor:
    adv, returns = ppo.ppo_advantages(b.old_logp, b.ref_logp, b.old_values, b.reward, b.mask, b.beta, lam=0.95)
    return ppo.ppo_loss(b.logp, b.old_logp, b.values, b.old_values, adv, returns, b.mask, weights=b.weights)[0]


def _grpo(b: B) -> Tensor:
    adv = grpo.group_advantages(b.reward, b.group_size)
    return grpo.grpo_loss(b.logp, b.old_logp, b.ref_logp, adv, b.mask, b.beta, weights=b.weights)[0]


ON_POLICY = ("on-policy",)
METHODS: dict[str, ToyMethod] = {
    m.name: m
    for m in [
        ToyMethod("spo-terminal-mse", _spo(terminal=1.0, loss="squared")),
        ToyMethod("spo-terminal-bce", _spo(terminal=1.0, loss="bce")),
        ToyMethod("spo-reverse-mse", _spo(terminal=0.0, reverse=1.0, loss="squared")),
        ToyMethod("spo-reverse-bce", _spo(terminal=0.0, reverse=1.0, loss="bce")),
        ToyMethod("spo-advantage-bce", _spo(terminal=0.0, advantage=1.0)),
        ToyMethod("agro-off", _agro(agro.agro_off_policy_loss), group_size=2),
        ToyMethod("agro-on", _agro(agro.agro_on_policy_loss), group_size=3, data=ON_POLICY),
        ToyMethod("kl-pg", _agro(agro.kl_pg_loss, kl="sequence"), group_size=2),
        ToyMethod("kl-pg-token", _agro(agro.kl_pg_loss, kl="token"), group_size=2),
        ToyMethod("ppo", _ppo, data=ON_POLICY),
        ToyMethod("grpo", _grpo, group_size=3, data=ON_POLICY),
    ]
}


def run_method(
    problem: TabularProblem, method: ToyMethod, data: str, *, steps: int, lr: float,
    samples: int | None = None, seed: int = 0,
) -> list[float]:
    """Train one method on one kind of data; returns KL(pi || pi*) per step (and after the last)."""
    group = method.group_size if samples is None else max(method.group_size, 1)
    if samples is not None and method.group_size > 1:
        group = samples  # one prompt: all sampled generations form one group
    result = train(problem, method.loss, data=data, steps=steps, lr=lr, samples=samples,
                   group_size=group, epochs=method.epochs, seed=seed)
    return result.kl
