"""Per-token statistics of a policy along evaluated responses: mean entropy of pi, and the exact
per-token KL(pi || pi0) summed over each response (a sequence KL along the sampled prefixes)."""

from __future__ import annotations

import torch

from softrl.models.logprobs import pad_batch, pad_masks
from softrl.models.logprobs import token_stats as chunked_stats


@torch.no_grad()
def token_stats(model, rows: list, pad_id: int, reference=None, batch_size: int = 64) -> dict:
    """`rows` are trajectories with prompt and response tokens. Returns mean token entropy (nats) and,
    with a reference model, the mean over responses of sum_t KL_t(pi || pi0). An episode's environment
    tokens (`action_mask` False) are not the policy's and count in neither."""
    entropy_sum, tokens, kl_sum = 0.0, 0, 0.0
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        batch = pad_batch([r.prompt_tokens for r in chunk], [r.response_tokens for r in chunk], pad_id)
        stats = chunked_stats(model, batch, entropy=True, reference=reference)  # [b, T] each, chunked
        policy = pad_masks([r.action_mask or [True] * len(r.response_tokens) for r in chunk], stats.mask.shape[1])
        mask = stats.mask * policy.to(stats.mask.device)  # [b, T]
        entropy_sum += (stats.entropy * mask).sum().item()
        tokens += int(mask.sum().item())
        if reference is not None:
            kl_sum += (stats.kl * mask).sum().item()
    out = {"mean_token_entropy": entropy_sum / max(tokens, 1)}
    if reference is not None:
        out["kl_to_reference"] = kl_sum / max(len(rows), 1)
    return out
