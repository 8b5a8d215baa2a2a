"""Hand-computed and brute-force checks of the shared pieces, GAE, GRPO and pass@k; argument errors."""

import itertools
import math

import pytest
import torch

from softrl.algorithms import agro, common, grpo, ppo, rloo, spo
from softrl.algorithms.passk import mean_pass_at_k, pass_at_k
from softrl.tabular import TabularProblem


def test_log1mexp_matches_high_precision_and_stays_finite():
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    x = -torch.logspace(-12, 2, 200, dtype=torch.float64)
    exact = torch.tensor([float(mpmath.log(1 - mpmath.exp(mpmath.mpf(v)))) for v in x.tolist()], dtype=torch.float64)
    assert torch.allclose(common.log1mexp(x), exact, rtol=1e-7, atol=0)
    tiny = common.log1mexp(torch.tensor([-1e-30, -800.0], dtype=torch.float32))
    assert torch.isfinite(tiny).all() and tiny[1] == 0


def test_leave_one_out_mean_and_var_brute_force():
    torch.manual_seed(0)
    v = torch.randn(12, dtype=torch.float64)
    n = 4
    mean, var = common.leave_one_out_mean(v, n), common.leave_one_out_var(v, n)
    for i in range(12):
        g = i // n
        others = torch.cat([v[g * n : i], v[i + 1 : (g + 1) * n]])
        assert mean[i].item() == pytest.approx(others.mean().item(), abs=1e-12)
        assert var[i].item() == pytest.approx(others.var(unbiased=True).item(), abs=1e-12)


def test_gae_hand_computed_with_padding():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 9.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [0.1, 0.2, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = ppo.gae(rewards, values, mask, gamma=1.0, lam=0.5)
    # row 0: A2 = 1 - .7 = .3; A1 = (.7 - .6) + .5*.3 = .25; A0 = (.6 - .5) + .5*.25 = .225
    # row 1 (length 2): A1 = 2 - .2 = 1.8; A0 = (.2 - .1) + .5*1.8 = 1.0; padding 0
    assert torch.allclose(adv, torch.tensor([[0.225, 0.25, 0.3], [1.0, 1.8, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[0.725, 0.85, 1.0], [1.1, 2.0, 0.0]]))


def test_gae_lambda_one_is_return_to_go_minus_value():
    torch.manual_seed(1)
    r, v = torch.randn(3, 5), torch.randn(3, 5)
    adv, _ = ppo.gae(r, v, torch.ones(3, 5), lam=1.0)
    assert torch.allclose(adv, common.reverse_cumsum(r) - v, atol=1e-6)


def test_shaped_rewards_put_reward_on_last_real_token():
    old, ref = torch.tensor([[-1.0, -2.0, -3.0]]), torch.tensor([[-1.5, -2.0, -1.0]])
    out = ppo.shaped_rewards(old, ref, torch.tensor([5.0]), torch.tensor([[1.0, 1.0, 0.0]]), beta=0.5)
    assert torch.allclose(out, torch.tensor([[-0.25, 5.0, 0.0]]))


def test_grpo_group_advantages_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    adv = grpo.group_advantages(r, group_size=4, eps=0.0)
    s = math.sqrt(3) / 2  # group 1: mean .5, sample std sqrt(1/3)
    assert torch.allclose(adv, torch.tensor([s, -s, -s, s, -0.5, -0.5, -0.5, 1.5]), atol=1e-6)
    assert torch.allclose(grpo.group_advantages(r, 4, scale=False)[:4], torch.tensor([0.5, -0.5, -0.5, 0.5]))


def test_k3_is_unbiased_for_kl():
    torch.manual_seed(2)
    logp, ref = torch.log_softmax(torch.randn(7), 0), torch.log_softmax(torch.randn(7), 0)
    exact = (logp.exp() * (logp - ref)).sum()
    assert (logp.exp() * grpo.k3_kl(logp, ref)).sum().item() == pytest.approx(exact.item(), rel=1e-6)
    assert (grpo.k3_kl(logp, ref) >= 0).all()


def test_token_kl_matches_definition():
    torch.manual_seed(3)
    a, b = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    pa = torch.softmax(a, -1)
    expected = (pa * (pa.log() - torch.log_softmax(b, -1))).sum(-1)
    assert torch.allclose(common.token_kl(a, b), expected, atol=1e-6)


@pytest.mark.parametrize("n", [1, 5, 8])
def test_pass_at_k_brute_force(n):
    for c in range(n + 1):
        items = [1] * c + [0] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(items, k))
            brute = sum(any(s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)
    assert mean_pass_at_k([0, n], n, 1) == pytest.approx(0.5)


def test_pass_at_k_large_n_is_stable():
    value = pass_at_k(2000, 3, 1000)
    assert 0 < value <= 1 and value == pytest.approx(1 - math.comb(1997, 1000) / math.comb(2000, 1000))


def _batch():
    torch.manual_seed(4)
    logp, ref = -torch.rand(4, 3), -torch.rand(4, 3)
    return logp, ref, torch.ones(4, 3), -torch.rand(4), torch.zeros(4)


@pytest.mark.parametrize("beta", [0.0, -1.0, float("nan")])
def test_bad_beta_is_named(beta):
    logp, ref, mask, r, q0 = _batch()
    with pytest.raises(ValueError, match="beta"):
        spo.spo_loss(logp, ref, mask, r, q0, beta)
    with pytest.raises(ValueError, match="beta"):
        agro.agro_off_policy_loss(logp, ref, mask, r, beta, group_size=2)
    with pytest.raises(ValueError, match="beta"):
        spo.q0_from_rewards(r, beta)
    with pytest.raises(ValueError, match="beta"):
        rloo.rloo_loss(logp, ref, mask, r, beta, group_size=2)
    with pytest.raises(ValueError, match="beta"):
        TabularProblem.make(beta=beta)


def test_mismatched_shapes_are_named():
    logp, ref, mask, r, q0 = _batch()
    with pytest.raises(ValueError, match="ref_logp"):
        spo.spo_loss(logp, ref[:, :2], mask, r, q0, 0.1)
    with pytest.raises(ValueError, match="reward"):
        spo.spo_loss(logp, ref, mask, r[:3], q0, 0.1)
    with pytest.raises(ValueError, match="q0"):
        spo.spo_loss(logp, ref, mask, r, q0[:2], 0.1)
    with pytest.raises(ValueError, match="group_size"):
        agro.agro_off_policy_loss(logp, ref, mask, r, 0.1, group_size=3)
    with pytest.raises(ValueError, match="group_size"):
        agro.agro_on_policy_loss(logp, ref, mask, r, 0.1, group_size=2)
    with pytest.raises(ValueError, match="token_kl"):
        agro.agro_off_policy_loss(logp, ref, mask, r, 0.1, group_size=2, estimator="g3")


def test_bce_with_positive_reward_is_refused():
    logp, ref, mask, r, q0 = _batch()
    r = r.clone()
    r[0] = 0.5
    with pytest.raises(ValueError, match="reward must be <= 0"):
        spo.spo_loss(logp, ref, mask, r, q0, 0.1, loss="bce")
    with pytest.raises(ValueError, match="reward must be <= 0"):
        spo.spo_loss(logp, ref, mask, r, q0, 0.1, terminal=0.0, reverse=1.0, loss="bce")
    spo.spo_loss(logp, ref, mask, r, q0, 0.1, loss="squared")  # squared takes any bounded reward


def test_unknown_options_are_named():
    logp, ref, mask, r, q0 = _batch()
    with pytest.raises(ValueError, match="loss"):
        spo.spo_loss(logp, ref, mask, r, q0, 0.1, loss="hinge")
    with pytest.raises(ValueError, match="estimator"):
        agro.agro_off_policy_loss(logp, ref, mask, r, 0.1, group_size=2, estimator="g4")
    with pytest.raises(ValueError, match="kl"):
        agro.kl_pg_loss(logp, ref, mask, r, 0.1, group_size=2, kl="both")
    with pytest.raises(ValueError, match="token_reduction"):
        ppo.ppo_loss(logp, logp, r[:, None].expand(4, 3), r[:, None].expand(4, 3), logp, logp, mask,
                     token_reduction="max")
    with pytest.raises(ValueError, match="eps"):
        spo.log_prob_bce(logp, torch.ones_like(logp), eps=0.0)


def test_spo_logs_the_passed_rows_its_terminal_loss_lifts_no_higher():
    """`spo/passed_at_cap`: passed rows whose pi/pi0 reached 1/S (Q_T >= 0) get no gradient from the
    terminal BCE; the others, and every failed row, do. By hand: S = 0.25, so the cap is log-ratio log 4."""
    beta, q0 = 0.1, torch.full((4,), 0.1 * math.log(0.25))  # Q0 = beta log S (no failure term: tiny)
    log_ratio = torch.tensor([2.0, 1.0, 2.0, -1.0])  # rows 0 and 2 above log 4 = 1.386
    reward = torch.tensor([0.0, 0.0, -1.0, -1.0])  # rows 0, 1 passed
    logp = (log_ratio[:, None] / 2).expand(4, 2).clone().requires_grad_(True)
    ref, mask = torch.zeros(4, 2), torch.ones(4, 2)
    loss, metrics = spo.spo_loss(logp, ref, mask, reward, q0, beta)
    assert metrics["spo/passed_at_cap"].item() == pytest.approx(0.25)  # row 0 only, of 4 rows
    loss.backward()
    lifted = logp.grad.abs().sum(-1)
    assert lifted[0] == 0 and (lifted[1:] > 0).all()
