"""A reference that moves (issue 51), on the exact tabular problem: SPO's rounds follow mirror descent,
pi_k ~ pi0 exp(k r / beta), with the exact Q0 and, measurably less closely, with Q0 estimated online
from the groups it samples; the online estimate's bias, exactly."""

import math

import pytest
import torch

from softrl.algorithms.spo import q0_from_rewards, q0_from_samples
from softrl.tabular import SPO_BETA, TabularProblem
from softrl.tabular.moving import q0_bias, reference_rounds
from softrl.toy import METHODS

SPO = METHODS["spo-terminal-bce"]


@pytest.fixture(scope="module")
def problem():
    torch.set_num_threads(1)
    # beta 0.5: each round tilts by exp(r / 0.5), so three rounds are three distinct policies (at the
    # paper's beta the first round already puts all but 2e-4 of the mass on passing sequences)
    return TabularProblem.make(vocab=2, length=4, success_rate=0.25, seed=0, beta=0.5)


def test_the_closed_form_is_one_optimum_at_a_k_times_smaller_beta(problem):
    for k in (1, 2, 3):
        tilted = TabularProblem(problem.vocab, problem.length, problem.beta / k, problem.ref_logits, problem.reward)
        assert torch.allclose(problem.mirror_descent_seq_logp(k), tilted.optimal_seq_logp, atol=1e-12)
    with pytest.raises(ValueError, match="deterministic"):
        TabularProblem.make(vocab=2, length=3, turns=2, env="stochastic").mirror_descent_seq_logp(1)


def test_spo_with_a_reference_moved_after_each_convergence_follows_mirror_descent(problem):
    rounds = reference_rounds(problem, SPO.loss, 3)
    assert [r.round for r in rounds] == [1, 2, 3]
    assert max(r.kl_to_closed_form for r in rounds) < 1e-3, rounds
    rewards = [r.reward for r in rounds]
    assert rewards[0] < rewards[1] < rewards[2] < 0  # each move tilts further towards passing
    # the rounds are distinct policies: the closed form of round 1 is far from round 3's
    logp = problem.mirror_descent_seq_logp(1)
    assert (logp.exp() * (logp - problem.mirror_descent_seq_logp(3))).sum() > 0.1


def test_a_q0_estimated_from_each_group_is_low_and_moves_the_fixed_point_a_little(problem):
    """From a group of 4 of the reference's samples (the exact expectation over every group), round 1
    lands near its optimum, but measurably farther than with the exact Q0; the jackknife, which removes
    the estimate's 1/K bias where the expansion holds, lands farther still: one rare pass in a group
    sends its estimate above every reward."""
    exact = reference_rounds(problem, SPO.loss, 1)[0]
    group = reference_rounds(problem, SPO.loss, 1, q0="group", group_size=4)[0]
    jackknife = reference_rounds(problem, SPO.loss, 1, q0="jackknife", group_size=4)[0]
    assert exact.kl_to_closed_form < group.kl_to_closed_form < 1e-2 < jackknife.kl_to_closed_form
    one_pass = torch.tensor([0.0, -1.0, -1.0, -1.0], dtype=torch.float64)
    assert q0_from_samples(one_pass, torch.zeros(4, dtype=torch.float64), SPO_BETA, "jackknife") > 0


def test_sampled_spo_with_online_q0_tracks_the_moving_reference(problem):
    rounds = reference_rounds(problem, SPO.loss, 3, q0="group", group_size=8, samples=64, steps=1500,
                              max_grad_norm=1.0)
    assert max(r.kl_to_closed_form for r in rounds) < 1e-2, rounds


def test_the_online_q0_bias_exactly():
    """Low for every group size (Jensen), shrinking as the group grows; at the paper's beta a group of 4
    with a 5% pass rate is off by more than half a reward unit."""
    for beta in (SPO_BETA, 0.5):
        for success in (0.05, 0.25, 0.5):
            biases = [q0_bias(success, k, beta) for k in (2, 4, 8, 16, 64)]
            assert all(b < 0 for b in biases) and biases == sorted(biases)
    assert q0_bias(0.05, 4, SPO_BETA) < -0.5 and q0_bias(0.5, 64, SPO_BETA) > -0.01
    assert q0_bias(0.25, 1, 0.5) == pytest.approx(0.25 * 0 + 0.75 * -1 - 0.5 * math.log(0.25 + 0.75 * math.exp(-2)))


def test_importance_weights_make_another_policys_samples_estimate_the_reference():
    """Q0 of pi0 from mu's samples: with w = pi0 / mu the mean inside the log is pi0's; equal weights are
    `q0_from_rewards`; the leave-one-out form of the jackknife matches its definition."""
    rewards = torch.tensor([[0.0, -1.0, -0.5]], dtype=torch.float64)
    assert torch.allclose(q0_from_samples(rewards, torch.zeros_like(rewards), 0.3), q0_from_rewards(rewards, 0.3))
    # two outcomes, mu puts 1/2 on each, pi0 puts 0.9 on the first: the weights 1.8 and 0.2
    two = torch.tensor([[0.0, -1.0]], dtype=torch.float64)
    w = torch.log(torch.tensor([[1.8, 0.2]], dtype=torch.float64))
    expected = 0.3 * math.log(0.9 * 1 + 0.1 * math.exp(-1 / 0.3))
    assert q0_from_samples(two, w, 0.3).item() == pytest.approx(expected)
    f = lambda r: 0.3 * math.log(sum(math.exp(x / 0.3) for x in r) / len(r))  # noqa: E731
    r = [0.0, -1.0, -0.5]
    jack = 3 * f(r) - 2 * sum(f(r[:j] + r[j + 1:]) for j in range(3)) / 3
    assert q0_from_samples(rewards, torch.zeros_like(rewards), 0.3, "jackknife").item() == pytest.approx(jack)
    with pytest.raises(ValueError, match="correction"):
        q0_from_samples(rewards, torch.zeros_like(rewards), 0.3, "bootstrap")
