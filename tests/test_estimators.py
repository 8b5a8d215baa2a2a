"""Unbiasedness and variance of the AGRO estimators, and the identities between estimators, checked
against exact gradients on a tabular problem (exact expectations and 10^5-sample means)."""

import pytest
import torch

from softrl.algorithms import agro, rloo
from softrl.tabular import TabularProblem, exact_groups
from softrl.tabular.estimators import exact_gradient, group_gradients, sequence_jacobians

BETA = 0.3


@pytest.fixture(scope="module")
def setup():
    problem = TabularProblem.make(vocab=2, length=4, beta=BETA, success_rate=0.3, seed=3)
    g = torch.Generator().manual_seed(0)
    logits = [x + 0.7 * torch.randn(x.shape, generator=g, dtype=x.dtype) for x in problem.ref_logits]
    return problem, logits, sequence_jacobians(problem, logits)


def _regulariser(estimator):
    return lambda lp, ref, m, kl, r: agro.regulariser_surrogate(lp, ref, m, estimator, kl).mean()


def _relative_error(estimate, exact):
    return ((estimate - exact).norm() / exact.norm()).item()


def _seq_probs(problem, logits):
    return problem.seq_logp(logits).exp().detach()


def _var_objective(problem, mu_logits=None):
    """`Var_mu[R] / (2 beta)`, mu = pi (on-policy) or a fixed mu."""

    def objective(lg):
        logp = problem.seq_logp(lg)
        mu = logp.exp() if mu_logits is None else _seq_probs(problem, mu_logits)
        big_r = problem.reward - BETA * (logp - problem.seq_logp(problem.ref_logits))
        return (mu * (big_r - (mu * big_r).sum()) ** 2).sum() / (2 * BETA)

    return objective


def _exact_expectation(problem, logits, surrogate, probs, group_size, jac):
    index, weight = exact_groups(probs, group_size)
    per_group = group_gradients(problem, logits, surrogate, index, group_size, jac)  # [M, P]
    return (weight.view(-1, group_size)[:, :1] * group_size * per_group).sum(0)


def test_token_estimators_unbiased_with_ordered_variances(setup):
    problem, logits, jac = setup
    exact = exact_gradient(problem, logits, problem.kl_to_reference)  # grad KL(pi || pi0)
    pi = _seq_probs(problem, logits)
    sample = torch.multinomial(pi, 100_000, replacement=True, generator=torch.Generator().manual_seed(1))
    variances = {}
    for est in ("g1", "g2", "g3"):
        expectation = _exact_expectation(problem, logits, _regulariser(est), pi, 1, jac)
        assert torch.allclose(expectation, exact, atol=1e-10), est
        rows = group_gradients(problem, logits, _regulariser(est), sample, 1, jac)  # [S, P]
        assert _relative_error(rows.mean(0), exact) < 0.05, est
        variances[est] = rows.var(0).sum().item()
    print("variance (trace) of the regulariser-gradient estimators:", variances)
    assert variances["g3"] <= variances["g2"] <= variances["g1"]


def test_on_policy_agro_unbiased(setup):
    problem, logits, jac = setup
    exact = exact_gradient(problem, logits, _var_objective(problem))  # grad Var_pi[R] / (2 beta)

    def surrogate(lp, ref, m, kl, r):
        return agro.agro_on_policy_loss(lp, ref, m, r, BETA, group_size=3)[0]

    pi = _seq_probs(problem, logits)
    assert torch.allclose(_exact_expectation(problem, logits, surrogate, pi, 3, jac), exact, atol=1e-9)
    sample = torch.multinomial(pi, 3 * 100_000, replacement=True, generator=torch.Generator().manual_seed(2))
    groups = group_gradients(problem, logits, surrogate, sample, 3, jac)
    print("on-policy AGRO estimator variance (trace):", groups.var(0).sum().item())
    assert _relative_error(groups.mean(0), exact) < 0.05


def test_on_policy_agro_biased_without_variance_baseline_check(setup):
    """The test above can fail: dropping the c_i term leaves a bias the exact expectation exposes."""
    problem, logits, jac = setup
    exact = exact_gradient(problem, logits, _var_objective(problem))

    def off_only(lp, ref, m, kl, r):
        return agro.agro_off_policy_loss(lp, ref, m, r, BETA, group_size=3)[0]

    pi = _seq_probs(problem, logits)
    assert _relative_error(_exact_expectation(problem, logits, off_only, pi, 3, jac), exact) > 0.05


def test_off_policy_agro_is_unbiased_for_its_loss(setup):
    problem, logits, jac = setup
    mu = _seq_probs(problem, problem.ref_logits)
    exact = exact_gradient(problem, logits, _var_objective(problem, problem.ref_logits))

    def surrogate(lp, ref, m, kl, r):
        return agro.agro_off_policy_loss(lp, ref, m, r, BETA, group_size=2)[0]

    assert torch.allclose(_exact_expectation(problem, logits, surrogate, mu, 2, jac), exact, atol=1e-10)


def test_rloo_is_the_off_policy_agro_estimator(setup):
    problem, logits, jac = setup
    index = torch.multinomial(_seq_probs(problem, problem.ref_logits), 64, replacement=True,
                              generator=torch.Generator().manual_seed(3))

    def agro_g1(lp, ref, m, kl, r):
        return agro.agro_off_policy_loss(lp, ref, m, r, BETA, group_size=4)[0]

    def rloo_(lp, ref, m, kl, r):
        return rloo.rloo_loss(lp, ref, m, r, BETA, group_size=4)[0]

    a = group_gradients(problem, logits, agro_g1, index, 4, jac)
    b = group_gradients(problem, logits, rloo_, index, 4, jac)
    assert torch.allclose(a, b, atol=1e-12)


def test_kl_pg_equals_agro_on_policy_but_not_at_optimum_off_policy(setup):
    problem, logits, jac = setup

    def kl_pg(lp, ref, m, kl, r):
        return agro.kl_pg_loss(lp, ref, m, r, BETA, group_size=2)[0]

    def agro_off(lp, ref, m, kl, r):
        return agro.agro_off_policy_loss(lp, ref, m, r, BETA, group_size=2)[0]

    pi = _seq_probs(problem, logits)
    on_kl = _exact_expectation(problem, logits, kl_pg, pi, 2, jac)
    on_agro = _exact_expectation(problem, logits, agro_off, pi, 2, jac)
    assert torch.allclose(on_kl, on_agro, atol=1e-10)

    star = problem.optimal_logits()
    jac_star = sequence_jacobians(problem, star)
    mu = _seq_probs(problem, problem.ref_logits)
    assert _exact_expectation(problem, star, agro_off, mu, 2, jac_star).norm() < 1e-9
    # ALGORITHMS.md: at pi* the KL-PG expected gradient (ascent) is (V* - E_mu r) E_mu[grad log pi*]
    grad_log_pi_star = jac_star[0].sum(1)  # [N, P]
    ascent = (problem.v_star - (mu * problem.reward).sum()) * (mu[:, None] * grad_log_pi_star).sum(0)
    kl_pg_at_star = _exact_expectation(problem, star, kl_pg, mu, 2, jac_star)
    assert ascent.norm() > 1e-2
    assert torch.allclose(kl_pg_at_star, -ascent, atol=1e-10)
