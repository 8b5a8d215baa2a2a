"""Decoupled PPO, M2PO, OAPL and GSPO (softrl/algorithms/stale.py) through the registry: each loss and
its gradient against a hand computation, rows without mu skipped, and where each converges in the toy."""

import math

import pytest
import torch

import softrl.objectives as registry
from softrl.algorithms.spo import q0_from_rewards
from softrl.algorithms.stale import second_moment_mask

D = torch.float64


def inputs(logp, behavior, reward, known, group_size=2, beta=0.5, ref=None, mask=None):
    mask = torch.ones_like(logp) if mask is None else mask
    return registry.LossInputs(logp=logp, ref_logp=logp.detach() if ref is None else ref, old_logp=logp.detach(),
                               mask=mask, reward=reward, q0=torch.zeros_like(reward), beta=beta,
                               group_size=group_size, behavior_logp=behavior, has_behavior=known)


def loss_and_grad(name, x, **options):
    loss, metrics = registry.objective_loss(registry.get(name).options(**options), x)
    (grad,) = torch.autograd.grad(loss, x.logp)
    return loss.item(), grad, {k: v.item() for k, v in metrics.items()}


# two groups of two rows, two tokens each; row 3 of unknown origin
LOGP = torch.log(torch.tensor([[0.5, 0.4], [0.2, 0.9], [0.6, 0.5], [0.3, 0.8]], dtype=D))
MU = torch.log(torch.tensor([[0.25, 0.4], [0.5, 0.3], [0.6, 0.05], [0.2, 0.5]], dtype=D))  # row 3's is not known
REWARD = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=D)
KNOWN = torch.tensor([True, True, True, False])
A = 0.5 / (math.sqrt(0.5) + 1e-6)  # group advantage of the better row of a {1, 0} group: (1 - 1/2) / std


def test_decoupled_ppo_by_hand():
    """pi_prox = pi (one update per batch): u = 1, so a token's gradient is w (-A + beta (1 - pi0/pi)) / N, the
    k3 term's derivative being 1 - exp(log pi0 - log pi); w = pi/mu where pi/mu <= cap, 0 above it (the
    token still counted in N)."""
    logp = LOGP.clone().requires_grad_(True)
    ref = LOGP - 0.3  # d = log pi0 - log pi = -0.3 at every token: k3 = e^-0.3 + 0.3 - 1
    loss, grad, metrics = loss_and_grad("decoupled-ppo", inputs(logp, MU, REWARD, KNOWN, beta=0.2, ref=ref), cap=5.0)
    w = torch.tensor([[2.0, 1.0], [0.4, 3.0], [1.0, 0.0], [0.0, 0.0]], dtype=D)  # 0.5/0.05 = 10 > 5: masked
    adv = torch.tensor([A, -A, A, -A], dtype=D)
    k3 = math.exp(-0.3) + 0.3 - 1
    n = 6  # the tokens of the three rows with mu, the masked one included
    assert loss == pytest.approx((w * (-adv[:, None] + 0.2 * k3)).sum().item() / n, rel=1e-9)
    assert torch.allclose(grad, w * (-adv[:, None] + 0.2 * (1 - math.exp(-0.3))) / n)
    assert metrics["decoupled/masked_fraction"] == pytest.approx(1 / 6)
    assert metrics["decoupled/skipped_fraction"] == pytest.approx(1 / 4)


def test_second_moment_mask_by_hand():
    # d^2 = 0, .01, .09, .25: the means of the 1..4 smallest are 0, .005, .0333, .0875: keep three
    d = torch.tensor([[0.0, 0.1], [0.3, -0.5]], dtype=D)
    counted = torch.ones_like(d)
    assert second_moment_mask(d, counted, 0.04).tolist() == [[1, 1], [1, 0]]
    assert second_moment_mask(d, counted, 0.1).tolist() == [[1, 1], [1, 1]]  # already under: nothing masked
    assert second_moment_mask(d, counted, 0.004).tolist() == [[1, 0], [0, 0]]
    # padding and rows without mu are never kept, and do not count towards the mean
    counted = torch.tensor([[1.0, 1.0], [0.0, 1.0]], dtype=D)
    assert second_moment_mask(d, counted, 0.04).tolist() == [[1, 1], [0, 0]]  # mean(0, .01, .25) > .04


def test_m2po_by_hand():
    """No clip: each kept token's gradient is -(pi/mu) A / N_kept. The squared log-ratios of the six tokens
    with mu are 0, 0, log(2)^2 = .48, log(.4)^2 = .84, log(3)^2 = 1.21, log(10)^2 = 5.3: with tau 0.3 the
    three largest go (the mean of the three smallest, .16, fits; of four, .33, does not)."""
    logp = LOGP.clone().requires_grad_(True)
    loss, grad, metrics = loss_and_grad("m2po", inputs(logp, MU, REWARD, KNOWN), tau=0.3)
    kept = torch.tensor([[1, 1], [0, 0], [1, 0], [0, 0]], dtype=D)
    adv = torch.tensor([A, -A, A, -A], dtype=D)
    ratio = (LOGP - MU).exp()
    assert torch.allclose(grad, -kept * ratio * adv[:, None] / 3)
    assert loss == pytest.approx((-kept * ratio * adv[:, None]).sum().item() / 3, rel=1e-9)
    assert metrics["m2po/masked_fraction"] == pytest.approx(3 / 6)
    d2 = [0, 0, math.log(2) ** 2, math.log(0.4) ** 2, math.log(3) ** 2, math.log(10) ** 2]
    assert metrics["m2po/second_moment"] == pytest.approx(sum(d2) / 6, rel=1e-9)


def test_oapl_by_hand():
    beta = 0.5
    logp = LOGP.clone().requires_grad_(True)
    loss, grad, metrics = loss_and_grad("oapl", inputs(logp, MU, REWARD, KNOWN, beta=beta))
    v = beta * math.log((math.exp(1 / beta) + 1) / 2)  # V* of a {1, 0} group
    assert q0_from_rewards(REWARD.view(2, 2), beta).tolist() == pytest.approx([v] * 2)
    log_ratio = (LOGP - MU).sum(-1)  # log(2 * 1), log(0.4 * 3), log(1 * 10), -
    residual = beta * log_ratio - (REWARD - v)
    assert loss == pytest.approx((residual[:3] ** 2).sum().item() / 3, rel=1e-9)
    expected = (2 * beta * residual / 3)[:, None].expand(4, 2).clone()
    expected[3] = 0
    assert torch.allclose(grad, expected)
    # another temperature for V*: NeMo RL's two betas
    loss2, _, _ = loss_and_grad("oapl", inputs(logp, MU, REWARD, KNOWN, beta=beta), vstar_beta=1.0)
    v1 = math.log((math.e + 1) / 2)
    assert loss2 == pytest.approx(((beta * log_ratio - (REWARD - v1))[:3] ** 2).sum().item() / 3, rel=1e-9)


def test_gspo_by_hand():
    """s = exp(mean_t log(pi/mu)): rows 0, 1, 2 have s = sqrt(2), sqrt(1.2), sqrt(10); with a clip of 0.3
    only row 1 (s = 1.095) is inside; row 0 (A > 0, s above 1.3) and row 2 are clipped: no gradient."""
    logp = LOGP.clone().requires_grad_(True)
    loss, grad, metrics = loss_and_grad("gspo", inputs(logp, MU, REWARD, KNOWN), clip_low=0.3, clip_high=0.3)
    s = torch.tensor([math.sqrt(2), math.sqrt(1.2), math.sqrt(10)], dtype=D)
    adv = torch.tensor([A, -A, A], dtype=D)
    per_row = -torch.minimum(s * adv, s.clamp(0.7, 1.3) * adv)
    assert loss == pytest.approx(per_row.sum().item() / 3, rel=1e-9)
    expected = torch.zeros(4, 2, dtype=D)
    expected[1] = -s[1] * adv[1] / 2 / 3  # d s / d log pi_t = s / |y|
    assert torch.allclose(grad, expected)
    assert metrics["gspo/clipped_fraction"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("name", ["decoupled-ppo", "m2po", "oapl", "gspo"])
def test_rows_without_mu_add_nothing(name):
    logp = LOGP.clone().requires_grad_(True)
    options = {"clip_low": 0.9, "clip_high": 9.0} if name == "gspo" else {}
    _, grad, _ = loss_and_grad(name, inputs(logp, MU, REWARD, KNOWN), **options)
    assert torch.equal(grad[3], torch.zeros(2, dtype=D))
    assert grad[:3].abs().sum() > 0
    nothing = registry.objective_loss(registry.get(name).options(**options),
                                      inputs(logp, MU, REWARD, torch.zeros(4, dtype=torch.bool)))[0]
    assert nothing.item() == 0  # a batch with no row of known origin is a zero loss, not nan


def test_toy_fixed_points():
    """From pi0's samples OAPL's anchor is pi0 itself, so its fixed point nears pi* (SPO's) as the group
    grows: V* is estimated from the row's own group, a bias of order 1/n. On its own samples it
    re-anchors every step and leaves pi* behind (no KL to pi0 is left)."""
    from softrl.tabular import TabularProblem
    from softrl.toy import ToyMethod, run_method

    problem = TabularProblem.make(vocab=2, length=4, success_rate=0.25, seed=0)
    kl = {(n, data): run_method(problem, ToyMethod("oapl", "oapl", group_size=n), data, steps=300, lr=0.3)[-1]
          for n in (2, 4) for data in ("off-policy", "on-policy")}
    assert kl[4, "off-policy"] < 0.01 < 0.05 < kl[2, "off-policy"] < 0.5
    assert kl[2, "on-policy"] > 1 and kl[4, "on-policy"] > 1


def test_spo_rows_weighed_by_their_truncated_sequence_ratio():
    """SPO with is_correction: the mean of w_i L_i, L_i each row's own SPO loss, w_i = min(pi(y)/mu(y), C)
    (sequence ratios 2, 1.2, 10 here: 10 truncated at 2, or masked), 1 for the row without mu (whose ratio,
    2.4, would be truncated to 2); the weights are constants: the gradient is sum_i w_i grad L_i / B."""
    spo = registry.get("spo")
    logp = LOGP.clone().requires_grad_(True)
    x = inputs(logp, MU, REWARD, KNOWN, beta=0.5, ref=LOGP - 0.2)
    x.q0 = torch.full((4,), 0.3, dtype=D)

    def row(i):
        one = registry.LossInputs(logp=x.logp[i:i + 1], ref_logp=x.ref_logp[i:i + 1], old_logp=x.old_logp[i:i + 1],
                                  mask=x.mask[i:i + 1], reward=x.reward[i:i + 1], q0=x.q0[i:i + 1], beta=0.5)
        loss = registry.objective_loss(spo.options(), one)[0]
        return loss.item(), torch.autograd.grad(loss, logp)[0]

    per_row = [row(i) for i in range(4)]
    for how, w in (("sequence_truncate", [2.0, 1.2, 2.0, 1.0]), ("sequence_mask", [2.0, 1.2, 0.0, 1.0])):
        loss = registry.objective_loss(spo.options(is_correction=how, is_cap=2.0), x)[0]
        assert loss.item() == pytest.approx(sum(wi * li for wi, (li, _) in zip(w, per_row)) / 4, rel=1e-9), how
        expected = sum(wi * gi for wi, (_, gi) in zip(w, per_row)) / 4
        assert torch.allclose(torch.autograd.grad(loss, logp)[0], expected), how
    plain = registry.objective_loss(spo.options(), x)[0].item()
    assert plain == pytest.approx(sum(li for li, _ in per_row) / 4, rel=1e-9)
    # is_rows failed: the solved rows 0 and 2 keep weight 1 (their ratios 2 and 10 unused), failed row 1 its 1.2
    loss, metrics = registry.objective_loss(spo.options(is_correction="sequence_truncate", is_rows="failed"), x)
    assert loss.item() == pytest.approx((per_row[0][0] + 1.2 * per_row[1][0] + per_row[2][0] + per_row[3][0]) / 4,
                                        rel=1e-9)
    assert metrics["tis/clipped_fraction"].item() == 0  # row 1, the one weighed, is under the cap
