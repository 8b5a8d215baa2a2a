"""The exact tabular problem with an environment between the policy's turns (issue 50, part 6): the soft
optimum takes an expectation at the environment's positions; with a deterministic environment every
SPO objective and off-policy AGRO reach pi* off-policy, as in the single-turn toy; with a stochastic
one, the objectives that assume a trajectory is a function of the policy's tokens do not (measured,
docs/ALGORITHMS.md, "Episodes: which objectives stay exact")."""

import json
import math
import subprocess
import sys

import pytest
import torch

from softrl.algorithms.ppo import gae, shaped_rewards
from softrl.tabular import TabularProblem
from softrl.tabular.problem import env_levels
from softrl.toy import METHODS, run_method


def test_the_environment_sits_between_turns():
    assert env_levels(5, 1) == [] and env_levels(5, 2) == [2] and env_levels(7, 3) == [2, 5]
    with pytest.raises(ValueError, match="3 turns need at least 5 tokens"):
        env_levels(4, 3)
    with pytest.raises(ValueError, match="env must be one of deterministic, stochastic"):
        TabularProblem.make(turns=2, length=5, env="random")
    problem = TabularProblem.make(vocab=2, length=5, turns=2, env="deterministic")
    assert problem.policy_mask.tolist() == [1, 1, 0, 1, 1]
    p = problem.seq_logp(problem.ref_logits).exp()
    assert (p == 0).sum() == 16 and math.isclose(p.sum().item(), 1.0)  # half the sequences never occur


@pytest.mark.parametrize("env", ["deterministic", "stochastic"])
def test_the_exact_optimum_maximises_the_regularised_reward(env):
    """pi* (`optimal_logits`: a log-sum-exp where the policy moves, an expectation where the environment
    does) has KL(pi* || pi*) = 0 and beats every perturbation of it on E[r] - beta KL(pi || pi0); with a
    deterministic environment its value is beta log E_pi0[exp(r / beta)], as with none."""
    problem = TabularProblem.make(vocab=2, length=5, turns=2, env=env, beta=0.5, seed=3)
    star = problem.optimal_logits()

    def objective(logits):
        return problem.expected_reward(logits) - problem.beta * problem.kl_to_reference(logits).item()

    assert problem.kl_to_optimal(star) < 1e-12
    assert math.isclose(objective(star), problem.optimal_q()[0].item(), abs_tol=1e-9)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        moved = [x + 0.3 * torch.randn(x.shape, generator=g, dtype=x.dtype) for x in star]
        assert objective(moved) < objective(star)
    if env == "deterministic":
        assert math.isclose(problem.v_star, problem.beta * problem.log_z.item()) and not problem.stochastic
    else:
        assert problem.stochastic  # and there, beta log E_pi0[exp(r/beta)] is more than the optimum:
        assert problem.beta * problem.log_z.item() > problem.v_star + 1e-3  # it lets the policy choose the draws


@pytest.mark.parametrize("name", ["spo-terminal-mse", "spo-terminal-bce", "spo-reverse-mse", "spo-advantage-bce",
                                  "agro-off"])
def test_with_a_deterministic_environment_spo_and_agro_reach_pi_star_off_policy(name):
    problem = TabularProblem.make(vocab=2, length=5, success_rate=0.25, turns=2, env="deterministic")
    kl = run_method(problem, METHODS[name], "off-policy", steps=600, lr=0.3)
    assert kl[0] > 1 and kl[-1] < 1e-2


def test_with_a_stochastic_environment_off_policy_spo_and_agro_are_biased_and_on_policy_gradients_are_not():
    """The measured finding docs/ALGORITHMS.md states: SPO's cumulative Q and AGRO's consistency take the
    environment's draw for the policy's doing, so off-policy they settle away from pi*; on-policy policy
    gradients (KL-PG, RLOO, PPO) reach it."""
    problem = TabularProblem.make(vocab=2, length=5, success_rate=0.25, turns=2, env="stochastic")
    for name in ("spo-terminal-mse", "agro-off"):
        assert run_method(problem, METHODS[name], "off-policy", steps=600, lr=0.3)[-1] > 1e-2, name
    for name in ("kl-pg", "rloo", "ppo"):
        assert run_method(problem, METHODS[name], "on-policy", steps=600, lr=0.3)[-1] < 1e-3, name


def test_with_a_stochastic_environment_importance_weighted_spo_is_exact_again():
    """The fix where mu's log-probs are known: SPO's squared terminal loss weighted by pi/mu (untruncated)
    has the on-policy fixed point, which is pi*; truncating the weight at 10 leaves a bias."""
    from softrl.toy import ToyMethod

    problem = TabularProblem.make(vocab=2, length=5, success_rate=0.25, turns=2, env="stochastic")
    weighted = {"terminal": 1.0, "loss": "squared", "is_correction": "sequence_truncate"}
    exact = run_method(problem, ToyMethod("x", "spo", {**weighted, "is_cap": 1e6}), "off-policy", steps=600, lr=0.3)
    capped = run_method(problem, ToyMethod("x", "spo", {**weighted, "is_cap": 10.0}), "off-policy", steps=600, lr=0.3)
    assert exact[-1] < 1e-3 < capped[-1]


def test_ppo_passes_over_the_environment_s_tokens():
    """GAE and the reward's place skip an unmarked token inside a response (an environment turn): the
    advantages of its policy tokens are those of the same response without it."""
    rewards = torch.tensor([[0.1, -0.2, 0.0, 0.3, 0.5]])
    values = torch.tensor([[0.4, 0.2, 9.0, -0.1, 0.3]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0]])
    adv, returns = gae(rewards, values, mask, lam=0.9)
    kept = [0, 1, 3, 4]
    dense_adv, dense_returns = gae(rewards[:, kept], values[:, kept], torch.ones(1, 4), lam=0.9)
    assert torch.allclose(adv[:, kept], dense_adv) and adv[0, 2] == 0
    assert torch.allclose(returns[:, kept], dense_returns)
    shaped = shaped_rewards(torch.zeros(1, 6), torch.zeros(1, 6), torch.tensor([1.0]),
                            torch.tensor([[1.0, 0.0, 1.0, 1.0, 0.0, 0.0]]), beta=0.1)
    assert shaped.tolist() == [[0.0, 0.0, 0.0, 1.0, 0.0, 0.0]]  # the last marked token, not the third


def test_softrl_toy_turns_prints_the_table(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "softrl", "toy", "--turns", "2", "--env", "deterministic",
                           "--methods", "spo-terminal-mse,kl-pg", "--steps", "300", "--json", "--workers", "1",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {(r["method"], r["data"]): r["final_kl"] for r in json.loads(proc.stdout)}
    assert rows[("spo-terminal-mse", "off-policy")] < 1e-2 and len(rows) == 4
    assert "2 turns, deterministic environment" in json.loads((tmp_path / "results.json").read_text())["setting"]
