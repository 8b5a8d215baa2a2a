"""Every loss trained on the exact tabular problem converges where the theory says it must:
off-policy (mu = pi0) with exact expectations and exact Q0, and with n = 8 sampled sequences."""

import pytest
import torch

from softrl.tabular import TabularProblem, train
from softrl.toy import METHODS, run_method

SPO = ["spo-terminal-mse", "spo-terminal-bce", "spo-reverse-mse", "spo-reverse-bce", "spo-advantage-bce"]


@pytest.fixture(scope="module")
def problem():
    torch.set_num_threads(1)
    return TabularProblem.make(vocab=2, length=5, success_rate=0.25, seed=0)


@pytest.mark.parametrize("name", SPO + ["agro-off"])
def test_exact_off_policy_reaches_optimum(problem, name):
    kl = run_method(problem, METHODS[name], "off-policy", steps=600, lr=0.3)
    assert kl[0] > 1.0  # starts far from pi*
    assert kl[-1] < 1e-3


@pytest.mark.parametrize("name", ["kl-pg", "kl-pg-token"])
def test_exact_off_policy_kl_pg_does_not(problem, name):
    kl = run_method(problem, METHODS[name], "off-policy", steps=600, lr=0.3)
    assert min(kl[300:]) > 0.05  # AGRO paper, figure 1: the wrong fixed point off-policy


@pytest.mark.parametrize("name", ["spo-terminal-bce", "spo-terminal-mse", "spo-advantage-bce", "agro-off"])
def test_sampled_off_policy_n8(problem, name):
    finals = [
        run_method(problem, METHODS[name], "off-policy", steps=2000, lr=0.3, samples=8, seed=seed, max_grad_norm=1.0)[-1]
        for seed in (0, 1)
    ]
    assert max(finals) < 1e-2, finals


def test_exact_on_policy_spo_and_ppo_converge(problem):
    for name in ("spo-terminal-bce", "ppo"):
        assert run_method(problem, METHODS[name], "on-policy", steps=600, lr=0.3)[-1] < 1e-2, name


def test_sampled_mode_rejects_bad_group(problem):
    with pytest.raises(ValueError, match="samples"):
        train(problem, METHODS["agro-off"].loss, samples=6, group_size=4)
    with pytest.raises(ValueError, match="data"):
        train(problem, METHODS["agro-off"].loss, data="offline")


def test_exact_mode_uses_the_exact_expectation(problem):
    """Exact mode is deterministic: two runs agree to the last bit, sampled runs with seeds differ."""
    m = METHODS["spo-terminal-bce"]
    a = train(problem, m.loss, steps=20, lr=0.3).kl
    b = train(problem, m.loss, steps=20, lr=0.3).kl
    c = train(problem, m.loss, steps=20, lr=0.3, samples=8, seed=1).kl
    assert a == b and a != c
