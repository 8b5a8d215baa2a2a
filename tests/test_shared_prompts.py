"""Rows that share a prompt (a group's samples) run it once in the learner's forward pass: the same
log-probs, entropy, token KL and gradients as the plain padded batch, to 1e-5."""

import copy

import pytest
import torch

pytest.importorskip("transformers")

from softrl.models.logprobs import pad_batch, token_logprobs, token_stats  # noqa: E402


def groups(n_prompts=3, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for i in range(n_prompts):
        prompt = torch.randint(4, 90, (5 + 3 * i,), generator=g).tolist()
        for j in range(n):
            prompts.append(prompt)
            responses.append(torch.randint(4, 90, (1 + (7 * i + 3 * j) % 9,), generator=g).tolist())
    return prompts, responses


def test_sharing_is_chosen_only_where_it_saves_work(tiny):
    pad = tiny[2].pad_token_id
    prompts, responses = groups()
    assert pad_batch(prompts, responses, pad, share=True).shared is not None
    assert pad_batch(prompts, responses, pad).shared is None  # only where asked (the learner's batches)
    distinct = [[5 + i, 6, 7] for i in range(len(prompts))]
    assert pad_batch(distinct, responses, pad, share=True).shared is None  # nothing shared: nothing saved


@pytest.mark.parametrize("with_reference", [False, True])
def test_shared_prompts_give_the_same_stats_and_gradients(tiny, with_reference):
    _, model, tok = tiny
    prompts, responses = groups()
    plain, shared = pad_batch(prompts, responses, tok.pad_token_id), pad_batch(prompts, responses, tok.pad_token_id,
                                                                                share=True)
    assert shared.shared.prompt_ids.shape[0] == 3 and torch.equal(plain.input_ids, shared.input_ids)
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.01 * torch.randn_like(p))
    results = []
    for batch in (plain, shared):
        policy = copy.deepcopy(model).train()
        stats = token_stats(policy, batch, entropy=True, reference=reference if with_reference else None)
        loss = stats.logp.sum() + ((stats.kl * stats.mask).sum() if with_reference else 0)  # KL past the end: unused
        loss.backward()
        results.append((stats, [p.grad.clone() for p in policy.parameters()]))
    (a, grads_a), (b, grads_b) = results
    assert torch.equal(a.mask, b.mask)
    for x, y in [(a.logp, b.logp), (a.entropy, b.entropy)] + ([(a.kl, b.kl), (a.ref_logp, b.ref_logp)] if with_reference else []):
        assert torch.allclose(x * a.mask, y * a.mask, atol=1e-5)
    for x, y in zip(grads_a, grads_b):
        assert torch.allclose(x, y, atol=1e-5, rtol=1e-5), ((x - y).abs().max(), x.abs().max())
    with torch.no_grad():  # and both equal the full log-softmax of each row alone, unpadded
        for i in (0, 5, 11):
            alone, _, _ = token_logprobs(model, pad_batch([prompts[i]], [responses[i]], tok.pad_token_id))
            assert torch.allclose(b.logp[i, : len(responses[i])], alone[0], atol=1e-5)
