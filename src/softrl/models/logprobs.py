"""Per-token log-probabilities of given responses, exact under padding (left or right)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class PaddedBatch:
    """Prompt + response token ids packed into one padded batch."""

    input_ids: Tensor  # [B, L]
    attention_mask: Tensor  # [B, L]
    position_ids: Tensor  # [B, L]: 0.. along the real tokens, whatever the padding side
    response_start: Tensor  # [B]: index in the row of the first response token
    response_len: Tensor  # [B]
    max_response: int


def pad_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int, side: str = "right") -> PaddedBatch:
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got side={side!r}")
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    rows = [list(p) + list(r) for p, r in zip(prompts, responses)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    starts = []
    for i, row in enumerate(rows):
        offset = width - len(row) if side == "left" else 0
        ids[i, offset : offset + len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, offset : offset + len(row)] = 1
        starts.append(offset + len(prompts[i]))
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    lengths = torch.tensor([len(r) for r in responses])
    return PaddedBatch(ids, mask, positions, torch.tensor(starts), lengths, int(lengths.max().item()) if rows else 0)


def response_positions(batch: PaddedBatch) -> tuple[Tensor, Tensor]:
    """(index `[B, T]` of the position whose output predicts each response token, mask `[B, T]`)."""
    steps = torch.arange(batch.max_response)
    index = (batch.response_start[:, None] - 1 + steps[None, :]).clamp(max=batch.input_ids.shape[1] - 1)
    return index, (steps[None, :] < batch.response_len[:, None]).float()


def token_logprobs(model, batch: PaddedBatch, full: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
    """(logp `[B, T]`, mask `[B, T]`, full log-distributions `[B, T, V]` or None) of the response tokens.

    Row b's response occupies positions `response_start[b] ...`; the logit predicting token j sits at j - 1.
    Gradients flow when the model is in training mode and grad is enabled.
    """
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   position_ids=batch.position_ids).logits.float()  # [B, L, V]
    index, mask = response_positions(batch)  # [B, T] each
    picked = logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1]))  # [B, T, V]
    log_dist = torch.log_softmax(picked, -1)
    targets = batch.input_ids.gather(1, (index + 1).clamp(max=logits.shape[1] - 1))  # [B, T]
    logp = log_dist.gather(-1, targets[..., None]).squeeze(-1) * mask
    return logp, mask, (log_dist if full else None)
