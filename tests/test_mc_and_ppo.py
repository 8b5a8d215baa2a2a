"""Monte-Carlo targets at annotated prefixes, and PPO's clipped losses, against exact values."""

import pytest
import torch

from softrl.algorithms import ppo, spo
from softrl.tabular import TabularBatch, TabularProblem, train


@pytest.fixture(scope="module")
def problem():
    return TabularProblem.make(vocab=2, length=4, success_rate=0.3, seed=5)


def _exact_mc_targets(problem: TabularProblem) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions 1..T of every sequence and the exact target exp(Q*_t / beta) = E_pi0[exp(r/beta) | y_<=t]."""
    q_star = problem.optimal_q()
    n, length = problem.num_sequences, problem.length
    index = [problem.prefix_indices[t] for t in range(1, length)] + [torch.arange(n)]
    target = torch.stack([torch.exp(q_star[t + 1][index[t]] / problem.beta) for t in range(length)], dim=1)
    return torch.arange(1, length + 1).expand(n, length), target  # [N, T] each


def test_mc_targets_are_zero_loss_and_stationary_at_optimum(problem):
    positions, target = _exact_mc_targets(problem)
    logits = [x.clone().requires_grad_(True) for x in problem.optimal_logits()]
    logp, ref = problem.token_logp(logits), problem.token_logp(problem.ref_logits)
    q = spo.cumulative_q(torch.full((problem.num_sequences,), problem.v_star, dtype=logp.dtype),
                         spo.advantages(logp, ref, torch.ones_like(logp), problem.beta))
    loss = spo.mc_target_loss(q, positions, target, torch.ones_like(target), problem.beta, loss="squared")
    assert loss.abs().max() < 1e-12
    # exp(Q*_t / beta) of a binary reward is S_t + (1 - S_t) exp(-1/beta) with S_t the success rate
    success = (target - torch.exp(torch.tensor(-1 / problem.beta))) / (1 - torch.exp(torch.tensor(-1 / problem.beta)))
    assert torch.allclose(spo.success_to_prob(success.clamp(0, 1), problem.beta), target, atol=1e-12)


def test_mc_targets_alone_train_to_optimum(problem):
    positions, target = _exact_mc_targets(problem)

    def mc_only(b: TabularBatch) -> torch.Tensor:
        return spo.spo_loss(b.logp, b.ref_logp, b.mask, b.reward, b.q0, b.beta, terminal=0.0, mc=1.0,
                            loss="squared", mc_positions=positions[b.index], mc_target_prob=target[b.index],
                            weights=b.weights)[0]

    kl = train(problem, mc_only, steps=400, lr=0.3).kl
    assert kl[0] > 1.0 and kl[-1] < 1e-3


def test_mc_mask_drops_annotations_and_positions_are_checked(problem):
    q = torch.zeros(2, 4)
    positions = torch.tensor([[1, 3], [2, 2]])
    target = torch.full((2, 2), 0.5)
    full = spo.mc_target_loss(q - 1.0, positions, target, torch.ones(2, 2), 0.5, loss="squared")
    masked = spo.mc_target_loss(q - 1.0, positions, target, torch.tensor([[1.0, 0.0], [0.0, 0.0]]), 0.5, "squared")
    assert torch.allclose(masked, torch.stack([full[0] / 2, torch.tensor(0.0)]))
    with pytest.raises(ValueError, match="positions"):
        spo.mc_target_loss(q, torch.tensor([[4, 0], [0, 0]]), target, torch.ones(2, 2), 0.5)
    with pytest.raises(ValueError, match="target_prob"):
        spo.mc_target_loss(q, positions, target + 1, torch.ones(2, 2), 0.5)


def test_ppo_clipped_losses_hand_computed():
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 0.7, 1.1]]))  # ratios 1.5, 0.7, 1.1
    adv = torch.tensor([[1.0, 1.0, -2.0]])
    values, old_values = torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[0.5, 0.0, 0.0]])
    returns = torch.tensor([[0.0, 0.3, 0.0]])
    loss, metrics = ppo.ppo_loss(logp, old, values, old_values, adv, returns, torch.ones(1, 3),
                                 clip=0.2, value_clip=0.2, value_coef=1.0)
    # policy per token: -min(r A, clip(r) A): -1.2, -0.7, -min(-2.2, -2.2) = 2.2
    policy = -1.2 - 0.7 + 2.2
    # value per token: 1/2 max((V-G)^2, (clip(V, V_old +- .2) - G)^2): max(1, .49)/2, .09/2, 0
    value = 0.5 + 0.045
    assert loss.item() == pytest.approx(policy + value, abs=1e-6)
    assert metrics["ppo/clip_fraction"] == pytest.approx(2 / 3)
