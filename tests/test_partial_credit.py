"""Rewards in one unit: a task whose every response scores 0.5 leaves SPO's reference where it is.

Q0 is the soft value `beta * log mean exp(r / beta)` of the reference's rewards, in the task's units;
only SPO's registry entry moves both to `r - 1`. With every reward 0.5 the optimal policy is pi0,
so the expected SPO gradient at pi = pi0 must be zero. Reading Q0 from the pass rate instead (0 here:
nothing 'passes') would push the reference by about 0.5 / beta nats.
"""

import math

import pytest
import torch

import softrl.objectives as registry
from softrl.algorithms.spo import q0_from_rewards
from softrl.objectives import LossInputs, objective_loss
from softrl.tabular import TabularProblem
from softrl.tabular.problem import TabularPolicy
from softrl.tabular.train import exact_groups, make_batch

SPO_VARIANTS = [{"terminal": 1.0, "loss": "bce"}, {"terminal": 1.0, "loss": "squared"},
                {"terminal": 0.0, "reverse": 1.0}, {"terminal": 0.0, "advantage": 1.0}]


def expected_gradient(problem: TabularProblem, options: dict, q0: float, data: str) -> torch.Tensor:
    """The exact expectation of SPO's gradient at pi = pi0, every response scoring 0.5, over responses
    from pi0 itself or from a uniform behaviour policy (SPO is valid for any data)."""
    policy = TabularPolicy(problem.ref_logits)
    old = problem.token_logp(problem.ref_logits).detach()  # [N, T]
    mu = old.sum(-1).exp() if data == "pi0" else torch.full((old.shape[0],), 1 / old.shape[0], dtype=old.dtype)
    index, weights = exact_groups(mu, 1)
    b = make_batch(problem, policy, index, old, old, torch.zeros_like(old), 1, weights)
    inputs = LossInputs(b.logp, b.ref_logp, b.old_logp, b.mask, torch.full_like(b.reward, 0.5),
                        torch.full_like(b.q0, q0), b.beta, weights=b.weights)
    loss, _ = objective_loss(registry.get("spo").options(**options), inputs)
    grads = torch.autograd.grad(loss, policy.policy_parameters())
    return torch.cat([g.flatten() for g in grads])


@pytest.mark.parametrize("options", SPO_VARIANTS)
def test_expected_spo_gradient_is_zero_at_the_reference_for_constant_partial_credit(options):
    problem = TabularProblem.make(vocab=2, length=5, success_rate=0.25, seed=0)
    q0 = q0_from_rewards(torch.full((64,), 0.5, dtype=torch.float64), problem.beta).item()
    assert q0 == pytest.approx(0.5, abs=1e-12)  # a constant reward is its own soft value
    for data in ("pi0", "uniform"):
        assert expected_gradient(problem, options, q0, data).abs().max() < 1e-10
    # the pass-rate reading (no sample passes: S = 0, Q0 = 1 + beta log exp(-1/beta) = 0) is wrong:
    # it pushes every response down (on pi0's own samples that cancels in expectation at pi0 only)
    wrong_q0 = 1 + problem.beta * math.log(math.exp(-1 / problem.beta))
    assert expected_gradient(problem, options, wrong_q0, "uniform").abs().max() > 1e-3


def test_learner_leaves_the_reference_alone_when_every_response_scores_half(tiny):
    from softrl.config import load_config
    from softrl.models.loading import encode_prompt, encode_response, tokenizer_fingerprint
    from softrl.models.wrappers import PolicyModel, ReferenceModel
    from softrl.rollout import RolloutSpec, RolloutWorker
    from softrl.models.generation import HFGenerator
    from softrl.tasks.registry import load_task
    from softrl.training.batch import make_batch as make_model_batch
    from softrl.training.learner import Learner

    directory, model, tokenizer = tiny
    task = load_task("countdown", size=3)
    spec = RolloutSpec(task, HFGenerator(model, tokenizer), lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                       tokenizer_fingerprint(tokenizer), 6, source="online")
    rows = [{**r.to_row(), "mix_source": "online", "reward": 0.5, "passed": False}
            for r in RolloutWorker(spec, lambda t: encode_prompt(tokenizer, t)).collect(task.prompts(), 4, 0, seed=0)]
    config = load_config(None, ["data.mix={online: 1}", "optim.lr=1e-2", "optim.warmup_steps=0",
                                "sampling.samples_per_prompt=4"])

    def moved(q0: float) -> float:
        policy = PolicyModel.load(directory)
        learner = Learner(policy, ReferenceModel.from_policy(policy), config)
        batch = make_model_batch(rows, tokenizer_fingerprint(tokenizer), tokenizer.pad_token_id,
                                 lambda t: encode_prompt(tokenizer, t), lambda t: encode_response(tokenizer, t),
                                 {p.id: q0 for p in task.prompts()})
        before = [p.detach().clone() for p in policy.model.parameters()]
        for _ in range(3):
            learner.step(batch)
        return max((a - b).abs().max().item() for a, b in zip(before, policy.model.parameters()))

    assert moved(0.5) < 1e-6  # Q0 from the rewards: nothing to learn, nothing moves
    assert moved(0.0) > 1e-3  # Q0 from the pass rate: every step pushes the reference
