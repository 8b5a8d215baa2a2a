"""Truncated importance sampling, CISPO and TOPR (softrl/algorithms/offpolicy.py) through the registry:
hand-computed weights, exact expectations against a brute-force enumeration of every ordered group
written from the papers' formulas, what each converges to in the toy, and the refusals."""

import itertools
import math

import pytest
import torch

import softrl.objectives as registry
from softrl.algorithms.offpolicy import importance_weights, truncated_fraction
from softrl.tabular import TabularProblem, exact_groups
from softrl.tabular.problem import TabularPolicy
from softrl.tabular.train import make_batch
from softrl.toy import loss_inputs

CAP = 1.5


def test_weights_hand_computed_and_rows_without_mu_skipped():
    logp = torch.log(torch.tensor([[0.5, 0.4, 0.2], [0.2, 0.9, 0.5]], dtype=torch.float64))
    mu = torch.log(torch.tensor([[0.25, 0.4, 0.4], [0.5, 0.3, 0.5]], dtype=torch.float64))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    known = torch.tensor([True, True])
    token = importance_weights(logp, mu, mask, known, "token_truncate", CAP)
    assert torch.allclose(token, torch.tensor([[1.5, 1.0, 0.5], [0.4, 1.5, 1.0]], dtype=torch.float64))
    # sequence ratios: 2 * 1 * 0.5 = 1 and 0.4 * 3 = 1.2 (padding counts as ratio 1)
    seq = importance_weights(logp, mu, mask, known, "sequence_truncate", CAP)
    assert torch.allclose(seq, torch.tensor([[1.0] * 3, [1.2] * 3], dtype=torch.float64))
    masked = importance_weights(logp, mu, mask, known, "sequence_mask", 1.1)
    assert torch.allclose(masked, torch.tensor([[1.0] * 3, [0.0] * 3], dtype=torch.float64))
    assert torch.equal(importance_weights(logp, mu, mask, known, "none", CAP), torch.ones_like(logp))
    token_masked = importance_weights(logp, mu, mask, known, "token_mask", CAP)  # AReaL's cap: ratios above it drop
    assert torch.allclose(token_masked, torch.tensor([[0.0, 1.0, 0.5], [0.4, 0.0, 1.0]], dtype=torch.float64))
    # what the run logs as tis/clipped_fraction: 2 of the 5 real tokens above the cap; no row is
    assert truncated_fraction(logp, mu, mask, known, "token_truncate", CAP).item() == pytest.approx(0.4)
    assert truncated_fraction(logp, mu, mask, known, "sequence_truncate", CAP).item() == 0
    assert truncated_fraction(logp, mu, mask, known, "sequence_mask", 1.1).item() == pytest.approx(2 / 5)
    skipped = importance_weights(logp, mu, mask, torch.tensor([True, False]), "token_truncate", CAP)
    assert torch.equal(skipped[1], torch.zeros(3, dtype=torch.float64))
    far = importance_weights(torch.zeros(1, 2), torch.full((1, 2), -500.0), torch.ones(1, 2), known[:1],
                             "sequence_mask", CAP)
    assert torch.equal(far, torch.zeros(1, 2))  # a ratio of e^1000 is masked, not inf * 0 = nan
    with pytest.raises(ValueError, match="is_correction must be one of"):
        importance_weights(logp, mu, mask, known, "token", CAP)


# ---- exact expectations against every ordered group, from the papers' formulas --------------------

@pytest.fixture(scope="module")
def setup():
    problem = TabularProblem.make(vocab=2, length=3, beta=0.3, success_rate=0.4, seed=1)
    g = torch.Generator().manual_seed(0)
    pi = [x + 0.8 * torch.randn(x.shape, generator=g, dtype=x.dtype) for x in problem.ref_logits]
    mu = [x + 0.8 * torch.randn(x.shape, generator=g, dtype=x.dtype) for x in problem.ref_logits]
    return problem, pi, mu


def registry_expectation(problem, pi, mu, options, n):
    """The gradient of the registry's loss in the toy's exact mode: every multiset of n rows of mu."""
    policy = TabularPolicy(pi)
    mu_logp = problem.token_logp(mu).detach()
    old = problem.token_logp(pi).detach()
    index, weights = exact_groups(mu_logp.sum(-1).exp(), n)
    batch = make_batch(problem, policy, index, old, mu_logp, torch.zeros_like(old), n, weights)
    loss, _ = registry.objective_loss(options, loss_inputs(batch))
    return torch.autograd.grad(loss, policy.policy_parameters())


def brute_force_expectation(problem, pi, mu, n, per_group):
    """sum over ordered n-tuples of mu's sequences of P(tuple) * grad per_group(tuple)."""
    leaves = [x.detach().clone().requires_grad_(True) for x in pi]
    logp = problem.token_logp(leaves)  # [N, T]
    mu_logp = problem.token_logp(mu).detach()
    prob = mu_logp.sum(-1).exp()
    reward = problem.reward + 1  # the task's units, as softrl toy hands them to the registry
    total = 0
    for group in itertools.product(range(problem.num_sequences), repeat=n):
        p = math.prod(prob[i].item() for i in group)
        total = total + p * per_group(list(group), logp, mu_logp, reward)
    return torch.autograd.grad(total, leaves)


def normalised(reward, group, eps=1e-6):
    r = reward[group]
    return (r - r.mean()) / (r.std() + eps)


def token_weights(logp, mu_logp, i, how):
    d = (logp[i] - mu_logp[i]).detach()
    if how == "token_truncate":
        return d.exp().clamp(max=CAP)
    seq = d.sum().exp()
    w = min(seq.item(), CAP) if how == "sequence_truncate" else (seq.item() if seq.item() <= CAP else 0.0)
    return torch.full_like(d, w)


def grpo_tis_group(how, beta, ref, clip=0.2):
    def per_group(group, logp, mu_logp, reward):
        adv = normalised(reward, group)
        loss = 0
        for a, i in zip(adv, group):
            rho = torch.exp(logp[i] - logp[i].detach())
            surrogate = -torch.minimum(rho * a, rho.clamp(1 - clip, 1 + clip) * a)
            d = ref[i] - logp[i]
            k3 = torch.exp(d) - d - 1
            loss = loss + (token_weights(logp, mu_logp, i, how) * (surrogate + beta * k3)).mean()
        return loss / len(group)
    return per_group


@pytest.mark.parametrize("how", ["token_truncate", "sequence_truncate", "sequence_mask"])
def test_grpo_with_tis_matches_brute_force(setup, how):
    problem, pi, mu = setup
    options = registry.get("grpo").options(is_correction=how, is_cap=CAP)
    exact = registry_expectation(problem, pi, mu, options, 3)
    brute = brute_force_expectation(problem, pi, mu, 3, grpo_tis_group(how, problem.beta, problem.token_logp(problem.ref_logits)))
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(exact, brute))
    assert sum(a.abs().sum() for a in exact) > 1e-3


def test_rloo_with_sequence_tis_matches_brute_force(setup):
    problem, pi, mu = setup
    ref = problem.token_logp(problem.ref_logits)

    def per_group(group, logp, mu_logp, reward):
        shaped = [reward[i] - problem.beta * (logp[i] - ref[i]).sum().detach() for i in group]
        loss = 0
        for k, i in enumerate(group):
            adv = shaped[k] - sum(shaped[j] for j in range(len(group)) if j != k) / (len(group) - 1)
            loss = loss - adv * (token_weights(logp, mu_logp, i, "sequence_truncate") * logp[i]).sum()
        return loss / len(group)

    options = registry.get("rloo").options(is_correction="sequence_truncate", is_cap=CAP)
    exact = registry_expectation(problem, pi, mu, options, 2)
    brute = brute_force_expectation(problem, pi, mu, 2, per_group)
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(exact, brute))


def test_cispo_matches_brute_force(setup):
    problem, pi, mu = setup

    def per_group(group, logp, mu_logp, reward):
        adv = normalised(reward, group)
        loss = 0
        for a, i in zip(adv, group):  # every token keeps its gradient, weighted by min(pi/mu, C)
            loss = loss - a * (token_weights(logp, mu_logp, i, "token_truncate") * logp[i]).sum()
        return loss / (len(group) * problem.length)  # the batch's token count

    exact = registry_expectation(problem, pi, mu, registry.get("cispo").options(cap=CAP), 2)
    brute = brute_force_expectation(problem, pi, mu, 2, per_group)
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(exact, brute))


def test_topr_matches_brute_force_and_is_the_reward_gradient_on_policy(setup):
    problem, pi, mu = setup

    def per_row(group, logp, mu_logp, reward):
        (i,) = group
        advantage = reward[i] - 0.5
        taper = 1.0 if advantage >= 0 else min(1.0, (logp[i] - mu_logp[i]).sum().exp().item())
        return -taper * advantage * logp[i].sum()

    options = registry.get("topr").options()
    exact = registry_expectation(problem, pi, mu, options, 1)
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(exact, brute_force_expectation(problem, pi, mu, 1, per_row)))
    # on its own samples no weight is below 1: plain REINFORCE with a constant baseline, -grad E_pi[r]
    on_policy = registry_expectation(problem, pi, pi, options, 1)
    leaves = [x.detach().clone().requires_grad_(True) for x in pi]
    expected_reward = (problem.seq_logp(leaves).exp() * (problem.reward + 1)).sum()
    truth = torch.autograd.grad(-expected_reward, leaves)
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(on_policy, truth))


def test_rows_without_behaviour_are_skipped():
    """A row of unknown origin adds nothing to TIS's or CISPO's gradient, and to TOPR's only if positive."""
    torch.manual_seed(0)
    logp = torch.randn(4, 3, dtype=torch.float64).clamp(max=0).requires_grad_(True)
    base = dict(ref_logp=logp.detach() - 0.1, old_logp=logp.detach(), mask=torch.ones(4, 3, dtype=torch.float64),
                reward=torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64), q0=torch.zeros(4), beta=0.1,
                group_size=2, behavior_logp=logp.detach() - 0.2)
    known = torch.tensor([True, False, False, True])
    for options in (registry.get("grpo").options(is_correction="token_truncate"), registry.get("cispo").options(),
                    registry.get("topr").options()):
        x = registry.LossInputs(logp=logp, has_behavior=known, **base)
        (grad,) = torch.autograd.grad(registry.objective_loss(options, x)[0], logp)
        unknown_negative, unknown_positive = grad[1], grad[2]
        assert torch.equal(unknown_negative, torch.zeros(3, dtype=torch.float64)), options.algorithm
        # TOPR needs no weight for a positive row; the others skip it whole (GRPO's k3 term too)
        assert (unknown_positive.abs().sum() > 0) == (options.algorithm == "topr"), options.algorithm
        assert grad[0].abs().sum() > 0 and grad[3].abs().sum() > 0


# ---- the toy's verdicts: what each converges to --------------------------------------------------

def test_toy_fixed_points():
    from softrl.toy import METHODS, run_method

    problem = TabularProblem.make(vocab=2, length=4, success_rate=0.25, seed=0)
    kl = {(m, d): run_method(problem, METHODS[m], d, steps=300, lr=0.3)[-1]
          for m, d in [("topr", "off-policy"), ("topr", "on-policy"), ("cispo", "off-policy"),
                       ("grpo-tis-sequence", "on-policy"), ("grpo", "on-policy")]}
    # no KL term: on its own samples TOPR piles onto the solved sequences, far from the regularised pi*;
    # from the reference's samples its positives are SFT on pi0's solutions: pi0 given success, ~ pi*
    assert kl["topr", "off-policy"] < 0.01 and kl["topr", "on-policy"] > 0.5
    assert kl["cispo", "off-policy"] > 0.5
    # on-policy every weight is 1: GRPO with TIS is GRPO
    assert kl["grpo-tis-sequence", "on-policy"] == pytest.approx(kl["grpo", "on-policy"], rel=1e-6)


# ---- refusals ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    (["data.objective.algorithm=cispo", "sampling.temperature=0.7"],
     "data.objective: cispo weighs rows by pi/mu, and online samples have mu's log-probs only at"),
    (["data.objective.algorithm=grpo", "data.objective.is_correction=sequence_mask", "sampling.temperature_range=[0.1, 0.8]"],
     "data.objective: grpo with is_correction=sequence_mask weighs rows by pi/mu"),
    (["data.objectives.online.algorithm=rloo", "data.objectives.online.is_correction=token_truncate",
      "sampling.top_p=0.9"], "data.objectives.online: rloo with is_correction=token_truncate"),
    (["data.objective.algorithm=grpo", "data.objective.is_correction=token"],
     "data.objective.is_correction: Input should be 'none', 'token_truncate'"),
    (["data.objective.algorithm=grpo", "data.objective.is_cap=0"], "data.objective.is_cap: Input should be greater than 0"),
    (["data.objective.algorithm=cispo", "data.objective.is_correction=token_truncate"],
     "unknown key 'data.objective.is_correction': not an option of cispo"),
    # TOPR's negatives need mu: online at another temperature it would be supervised learning on positives
    (["data.objective.algorithm=topr", "sampling.temperature=0.7"], "data.objective: topr weighs rows by pi/mu"),
])
def test_configs_that_cannot_work_are_refused(overrides, message):
    from softrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_config(None, overrides)
    # offline rows are checked when the pool is read: the config alone cannot know them
    assert load_config(None, ["data.objective.algorithm=cispo", "data.mix={offline: 1}",
                              "sampling.temperature=0.7"]).data.objective.cap == 2


def test_learner_step_with_rows_of_known_and_unknown_mu(tiny):
    """Rows without their sampler's log-probs reach the loss as unknown (skipped), whatever their place
    in the batch; the learner slices mu to the batch's width."""
    from test_training import make_rows

    from softrl.config import load_config
    from softrl.models.loading import encode_prompt
    from softrl.models.wrappers import PolicyModel, ReferenceModel
    from softrl.training.batch import make_batch
    from softrl.training.learner import Learner

    rows, fingerprint, task = make_rows(tiny)
    for row in rows[::3]:
        row["behavior_logprobs"] = None  # as if imported
    policy = PolicyModel.load(tiny[0])
    tok = policy.tokenizer
    batch = make_batch(rows, fingerprint, tok.pad_token_id, lambda t: encode_prompt(tok, t),
                       lambda t: tok(t)["input_ids"], {p.id: 0.5 for p in task.prompts()})
    assert batch.has_behavior.tolist() == [i % 3 != 0 for i in range(len(rows))]
    config = load_config(None, ["data.objective.algorithm=cispo", "sampling.samples_per_prompt=3",
                                "data.mix={online: 1}", "optim.warmup_steps=0"])
    metrics = Learner(policy, ReferenceModel.from_policy(policy), config).step(batch)
    assert metrics["cispo/skipped_fraction"] == pytest.approx(sum(i % 3 == 0 for i in range(len(rows))) / len(rows))
    assert math.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
