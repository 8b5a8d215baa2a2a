"""The cumulative Q-parameterisation: Bellman and path consistency for every theta, the Q0 formula,
the theorem `Q_T = r for all y <=> pi = pi*`, and the clipped straight-through BCE."""

import math

import pytest
import torch

from softrl.algorithms import spo
from softrl.tabular import SPO_BETA, TabularProblem

BETA = 0.3


def _perturbed(problem: TabularProblem, scale: float = 1.0, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [x + scale * torch.randn(x.shape, generator=g, dtype=x.dtype) for x in problem.ref_logits]


def _all_q(problem: TabularProblem, logits, q0: float) -> torch.Tensor:
    logp, ref = problem.token_logp(logits), problem.token_logp(problem.ref_logits)
    adv = spo.advantages(logp, ref, torch.ones_like(logp), problem.beta)
    return spo.cumulative_q(torch.full((problem.num_sequences,), q0, dtype=logp.dtype), adv)  # [N, L+1]


def _by_prefix(problem: TabularProblem, q: torch.Tensor, t: int) -> torch.Tensor:
    """Q_t as a table over prefixes of length t; asserts every sequence with that prefix agrees."""
    index = problem.prefix_indices[t] if t < problem.length else torch.arange(problem.num_sequences)
    table = torch.zeros(problem.vocab**t, dtype=q.dtype).index_put_((index,), q[:, t])
    assert torch.allclose(table[index], q[:, t], atol=1e-12), "Q_t must depend on the prefix only"
    return table


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bellman_consistency_on_tabular_problem(seed):
    problem = TabularProblem.make(vocab=3, length=4, beta=BETA, seed=seed)
    logits = _perturbed(problem, seed=seed)
    q = _all_q(problem, logits, q0=-0.37)  # any Q0 and any theta
    for t in range(problem.length):
        q_t, q_next = _by_prefix(problem, q, t), _by_prefix(problem, q, t + 1).view(-1, problem.vocab)
        ref = torch.log_softmax(problem.ref_logits[t], -1)  # [V**t, V]
        backup = BETA * torch.logsumexp(ref + q_next / BETA, -1)
        assert torch.allclose(backup, q_t, atol=1e-5, rtol=0)
        assert (backup - q_t).abs().max() < 1e-12  # in float64 it holds to rounding


def test_path_consistency_on_tabular_problem():
    problem = TabularProblem.make(vocab=3, length=5, beta=BETA)
    logits = _perturbed(problem)
    logp, ref = problem.token_logp(logits), problem.token_logp(problem.ref_logits)
    adv = spo.advantages(logp, ref, torch.ones_like(logp), BETA)
    q = _all_q(problem, logits, q0=0.0)
    for t1 in range(1, problem.length + 1):
        for t2 in range(t1, problem.length + 1):
            assert torch.allclose(adv[:, t1 - 1 : t2].sum(-1), q[:, t2] - q[:, t1 - 1], atol=1e-5)


def test_q_terminal_equals_reward_iff_optimal():
    problem = TabularProblem.make(vocab=3, length=4, beta=BETA)
    q_star = _all_q(problem, problem.optimal_logits(), q0=problem.v_star)
    assert torch.allclose(q_star[:, -1], problem.reward, atol=1e-5)
    assert problem.kl_to_optimal(problem.optimal_logits()) < 1e-10
    for scale in (0.01, 0.3):
        off = _all_q(problem, [x + scale * torch.randn_like(x) for x in problem.optimal_logits()], problem.v_star)
        assert (off[:, -1] - problem.reward).abs().max() > 1e-3
    # the exact soft Q of pi* is the cumulative Q at every prefix, not only at the end
    for t, level in enumerate(problem.optimal_q()):
        assert torch.allclose(_by_prefix(problem, q_star, t), level, atol=1e-8)


def test_q0_from_rewards_binary_form_and_no_success():
    beta = SPO_BETA
    rewards = torch.tensor([[0.0] * 3 + [-1.0] * 7, [-1.0] * 10], dtype=torch.float64)
    q0 = spo.q0_from_rewards(rewards, beta)
    s0 = 0.3
    assert math.exp(q0[0].item() / beta) == pytest.approx(s0 + (1 - s0) * math.exp(-1 / beta), rel=1e-12)
    assert q0[1].item() == pytest.approx(-1.0, abs=1e-12)
    assert spo.success_to_prob(torch.tensor([s0], dtype=torch.float64), beta).item() == pytest.approx(
        math.exp(q0[0].item() / beta), rel=1e-12
    )


def test_bellman_consistency_on_random_transformer():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=13, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )
    policy = transformers.LlamaForCausalLM(config).double().eval()
    torch.manual_seed(1)
    reference = transformers.LlamaForCausalLM(config).double().eval()
    beta, prompt_len = 0.25, 4
    sequence = torch.randint(0, 13, (1, prompt_len + 6))

    def token_logp(model, ids):  # log-probs of the response tokens (after the prompt): [B, T]
        with torch.no_grad():
            logits = model(ids).logits[:, :-1]
        return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)[:, prompt_len - 1 :]

    def q_of(ids, q0=-0.42):
        lp, ref = token_logp(policy, ids), token_logp(reference, ids)
        adv = spo.advantages(lp, ref, torch.ones_like(lp), beta)
        return spo.cumulative_q(torch.full((ids.shape[0],), q0, dtype=lp.dtype), adv)

    for t in range(0, 6):  # response prefixes of length t
        prefix = sequence[:, : prompt_len + t]
        q_t = q_of(prefix)[0, -1]
        children = torch.cat([prefix.repeat(13, 1), torch.arange(13)[:, None]], dim=1)  # all next tokens
        q_next = q_of(children)[:, -1]  # [V]: Q_{t+1}(prefix + a) from fresh forward passes
        with torch.no_grad():
            ref_next = torch.log_softmax(reference(prefix).logits[0, -1], -1)  # pi0(. | prefix)
        backup = beta * torch.logsumexp(ref_next + q_next / beta, 0)
        assert abs(backup.item() - q_t.item()) < 1e-5
        # path consistency along the sampled response
        adv = torch.diff(q_of(sequence)[0])
        assert torch.allclose(adv[t:].sum(), q_of(sequence)[0, -1] - q_of(sequence)[0, t], atol=1e-5)


def test_clipped_bce_straight_through():
    eps = 1e-2
    y = torch.tensor([-0.5, -eps / 2, 0.3], dtype=torch.float64, requires_grad=True)
    p = torch.tensor([0.2, 0.2, 0.2], dtype=torch.float64)
    loss = spo.log_prob_bce(y, p, eps)
    loss.sum().backward()
    # forward: clipped values in the log1mexp term; straight-through: the gradient is that at y_c
    y_c = torch.tensor([-0.5, -eps, -eps], dtype=torch.float64)
    expected = p * torch.relu(-y.detach()) - (1 - p) * torch.log(1 - torch.exp(y_c))
    assert torch.allclose(loss.detach(), expected)
    grad_c = -p * (y.detach() < 0) + (1 - p) * torch.exp(y_c) / (1 - torch.exp(y_c))
    assert torch.allclose(y.grad, grad_c)
    # no incentive above log 1 for a sure success (p = 1): zero gradient for y > 0
    y1 = torch.tensor([0.4], requires_grad=True)
    spo.log_prob_bce(y1, torch.ones(1)).backward()
    assert y1.grad.item() == 0.0


def test_bce_minimum_is_at_target_probability():
    p = torch.tensor(0.3, dtype=torch.float64)
    ys = torch.linspace(-5, -1e-3, 20001, dtype=torch.float64)
    best = ys[spo.log_prob_bce(ys, p.expand_as(ys)).argmin()]
    assert best.exp().item() == pytest.approx(0.3, abs=1e-3)
