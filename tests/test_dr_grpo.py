"""Dr. GRPO, added through the registry alone (softrl/objectives/baselines.py): config, learner
(tests/test_training.py runs every registered objective), toy and benchmark pick it up."""

import pytest
import torch

import softrl.objectives as registry
from softrl.objectives import LossInputs, objective_loss


def inputs(reward, lengths, T=6):
    B = len(reward)
    logp = torch.full((B, T), -1.0, requires_grad=True)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).float()
    return LossInputs(logp=logp, ref_logp=logp.detach().clone(), old_logp=logp.detach().clone(), mask=mask,
                      reward=torch.tensor(reward), q0=torch.zeros(B), beta=0.1, group_size=B)


def test_every_consumer_reads_it_from_the_registry():
    from softrl_bench.learning import METHODS as BENCH
    from softrl.config import ConfigError, load_config
    from softrl.toy import METHODS as TOY

    config = load_config(None, ["data.objective.algorithm=dr-grpo", "data.objective.length=24"])
    assert config.data.objective.length == 24 and config.data.objective.algorithm == "dr-grpo"
    with pytest.raises(ConfigError, match="sampling.samples_per_prompt must be >= 2 for dr-grpo"):
        load_config(None, ["data.objective.algorithm=dr-grpo", "sampling.samples_per_prompt=1"])
    with pytest.raises(ConfigError, match="unknown key 'data.objective.std_eps'"):  # GRPO's option, not its
        load_config(None, ["data.objective.algorithm=dr-grpo", "data.objective.std_eps=1e-4"])
    assert TOY["dr-grpo"].data == ("on-policy",) and BENCH["dr-grpo"]["data.objective"] == {"algorithm": "dr-grpo"}


def test_every_token_weighs_the_same_and_rewards_are_not_rescaled():
    options = registry.get("dr-grpo").options(length=4.0)
    x = inputs([1.0, 0.0, 0.0, 0.0], lengths=[2, 6, 6, 6])
    objective_loss(options, x)[0].backward()
    g = x.logp.grad
    # advantages only centred: 0.75 and -0.25; at ratio 1 each real token's gradient is -A / length,
    # averaged over the 4 responses
    assert torch.allclose(g[0, :2], torch.full((2,), -0.75 / 4 / 4)) and torch.equal(g[0, 2:], torch.zeros(4))
    assert torch.allclose(g[1:], torch.full((3, 6), 0.25 / 4 / 4))
    # GRPO divides by each response's length and by the group's std: the short solved answer weighs more
    y = inputs([1.0, 0.0, 0.0, 0.0], lengths=[2, 6, 6, 6])
    objective_loss(registry.get("grpo").options(), y)[0].backward()
    assert y.logp.grad[0, 0] / y.logp.grad[1, 0] == pytest.approx(-3 * 6 / 2, rel=1e-4)
    # rewards 10x apart give 10x the gradient (no std normalisation)
    z = inputs([0.1, 0.0, 0.0, 0.0], lengths=[2, 6, 6, 6])
    objective_loss(options, z)[0].backward()
    assert torch.allclose(z.logp.grad * 10, g)


def test_toy_on_policy_moves_towards_the_optimum():
    from softrl.tabular import TabularProblem
    from softrl.toy import METHODS, run_method

    problem = TabularProblem.make(vocab=2, length=5, success_rate=0.25, seed=0)
    kl = run_method(problem, METHODS["dr-grpo"], "on-policy", steps=200, lr=0.3)
    assert kl[-1] < kl[0] / 3
