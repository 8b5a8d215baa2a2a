"""Chunked log-probs (`models.logprobs.token_stats`): the same numbers and gradients as the full
`[B, T, V]` log-softmax, and none of that tensor kept for the backward pass."""

import copy

import pytest
import torch

pytest.importorskip("transformers")

from softrl.algorithms.common import token_kl  # noqa: E402
from softrl.models.logprobs import pad_batch, token_logprobs, token_stats  # noqa: E402


def llama(vocab: int, hidden: int = 32, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=64, pad_token_id=0))


@pytest.mark.parametrize("side", ["right", "left"])
def test_chunked_equals_full_log_softmax_values_and_gradients(side):
    model = llama(97)
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch = pad_batch([[1, 2, 3], [4, 5], [6]], [[6, 7, 8, 9, 10], [11, 12], [13, 14, 15]], 0, side)
    logp, mask, dist = token_logprobs(model, batch, full=True)
    ref_logp, _, ref_dist = token_logprobs(reference, batch, full=True)
    kl = token_kl(dist, ref_dist) * mask
    entropy = -(dist.exp() * dist).sum(-1) * mask
    grads = torch.autograd.grad(logp.sum() + kl.sum(), list(model.parameters()))
    for chunk_elements in (2**24, 3 * 97 * 2, 1):  # one chunk, chunks of 2 positions, one position each
        s = token_stats(model, batch, entropy=True, reference=reference, chunk_elements=chunk_elements)
        assert torch.equal(s.mask, mask)
        assert torch.allclose(s.logp, logp, atol=1e-5) and torch.allclose(s.entropy * mask, entropy, atol=1e-5)
        assert torch.allclose(s.kl * mask, kl, atol=1e-5) and torch.allclose(s.ref_logp, ref_logp, atol=1e-5)
        chunked = torch.autograd.grad(s.logp.sum() + (s.kl * s.mask).sum(), list(model.parameters()))
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(chunked, grads))


def saved_bytes(fn, params=()) -> int:
    """Bytes of the tensors autograd keeps for the backward pass of `fn()` beyond the `params` (which
    exist anyway); a tensor saved twice counts once."""
    seen, weights = {}, {p.data_ptr() for p in params}

    def pack(t):
        if t.data_ptr() not in weights:
            seen[(t.data_ptr(), t.numel(), t.dtype)] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def test_a_150k_vocabulary_keeps_no_full_distribution_for_backward():
    V, B = 150_000, 4
    model = llama(V, hidden=16)
    batch = pad_batch([[1, 2]] * B, [list(range(3, 35))] * B, 0)  # T = 32 response tokens
    full = B * 32 * V * 4  # one fp32 [B, T, V] tensor: 77 MB
    params = list(model.parameters())
    old = saved_bytes(lambda: token_logprobs(model, batch, full=True)[0].sum(), params)
    new = saved_bytes(lambda: token_stats(model, batch, entropy=True).logp.sum(), params)
    assert old > full  # the full path keeps [B, L, V] logits and the log-softmax
    assert new < full / 20  # hidden states and the head's input only: chunks are recomputed


@pytest.mark.parametrize("bias", [False, True])
def test_chosen_logp_equals_autograd_of_log_softmax(bias):
    """`models.chosen_logp`: values, entropy and gradients (hidden, weight, bias) of the fused path."""
    from softrl.models.chosen_logp import chosen_logp

    torch.manual_seed(0)
    hidden = torch.randn(6, 8, dtype=torch.double, requires_grad=True)
    weight = torch.randn(13, 8, dtype=torch.double, requires_grad=True)
    b = torch.randn(13, dtype=torch.double, requires_grad=True) if bias else None
    targets = torch.randint(0, 13, (6,))
    logp, ent = chosen_logp(hidden, weight, b, targets, entropy=True)
    dist = torch.log_softmax(torch.nn.functional.linear(hidden, weight, b), -1)
    assert torch.allclose(logp, dist.gather(-1, targets[:, None]).squeeze(-1))
    assert torch.allclose(ent, -(dist.exp() * dist).sum(-1)) and not ent.requires_grad
    inputs = (hidden, weight) + ((b,) if bias else ())
    assert torch.autograd.gradcheck(lambda h, w, *rest: chosen_logp(h, w, rest[0] if rest else None, targets)[0], inputs)


def test_token_stats_without_reference_matches_full_values_and_gradients():
    """The policy's own path (no reference: `chosen_logp`) against the full log-softmax, in 1 to many chunks."""
    model = llama(97)
    batch = pad_batch([[1, 2, 3], [4, 5], [6]], [[6, 7, 8, 9, 10], [11, 12], [13, 14, 15]], 0, "left")
    logp, mask, dist = token_logprobs(model, batch, full=True)
    entropy = -(dist.exp() * dist).sum(-1) * mask
    grads = torch.autograd.grad(logp.sum(), list(model.parameters()))
    for chunk_elements in (2**24, 2 * 97, 1):
        s = token_stats(model, batch, entropy=True, chunk_elements=chunk_elements)
        assert torch.allclose(s.logp, logp, atol=1e-5) and torch.allclose(s.entropy * mask, entropy, atol=1e-5)
        chunked = torch.autograd.grad(s.logp.sum(), list(model.parameters()))
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(chunked, grads))
