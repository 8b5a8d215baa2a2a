"""Per-token log-probabilities of given responses, exact under padding (left or right)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from softrl.models.chosen_logp import chosen_logp
from softrl.models.kv_cache import cache_arg, returned_cache


@dataclass
class SharedPrompts:
    """The same rows laid out so that rows with one prompt (a group's samples) share its forward pass:
    each distinct prompt once, left-padded, then every row's response tokens but the last, continuing
    from its prompt's keys and values. The hidden state predicting a response's first token is its
    prompt's last; the others come from the response pass."""

    prompt_ids: Tensor  # [G, P] distinct prompts, left-padded
    prompt_mask: Tensor  # [G, P]
    prompt_positions: Tensor  # [G, P]
    row_prompt: Tensor  # [B]: the distinct prompt of each row
    response_ids: Tensor  # [B, T - 1]: response tokens but the last, right-padded
    response_positions: Tensor  # [B, T - 1]
    mask: Tensor  # [B, P + T - 1]: the row's prompt (its padding masked), then its response tokens

    def apply(self, move) -> SharedPrompts:
        return SharedPrompts(*(move(getattr(self, f.name)) for f in fields(self)))


# share prompts only when that saves at least this share of the tokens a forward pass runs
SHARING_SAVES = 0.2


def share_prompts(prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> SharedPrompts | None:
    """`SharedPrompts` for the rows, or None when sharing would save less than SHARING_SAVES of the tokens."""
    distinct: dict[tuple[int, ...], int] = {}
    row_prompt = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    width, steps = max(len(p) for p in distinct), max(len(r) for r in responses) - 1
    if len(distinct) * width + len(prompts) * steps > (1 - SHARING_SAVES) * len(prompts) * (width + steps + 1):
        return None
    unique = pad_batch(list(map(list, distinct)), [[] for _ in distinct], pad_id, side="left")
    response_ids = torch.full((len(prompts), steps), pad_id, dtype=torch.long)
    response_mask = torch.zeros((len(prompts), steps), dtype=torch.long)
    for i, r in enumerate(responses):
        response_ids[i, : len(r) - 1] = torch.tensor(r[:-1], dtype=torch.long)
        response_mask[i, : len(r) - 1] = 1
    lengths = torch.tensor([len(p) for p in prompts])
    rows = torch.tensor(row_prompt)
    return SharedPrompts(unique.input_ids, unique.attention_mask, unique.position_ids, rows, response_ids,
                         lengths[:, None] + torch.arange(steps)[None, :],
                         torch.cat([unique.attention_mask[rows], response_mask], 1))


@dataclass
class PaddedBatch:
    """Prompt + response token ids packed into one padded batch."""

    input_ids: Tensor  # [B, L]
    attention_mask: Tensor  # [B, L]
    position_ids: Tensor  # [B, L]: 0.. along the real tokens, whatever the padding side
    response_start: Tensor  # [B]: index in the row of the first response token
    response_len: Tensor  # [B]
    max_response: int
    shared: SharedPrompts | None = None  # the rows with their prompts shared, where that saves work

    def apply(self, move) -> PaddedBatch:
        """The batch with `move` applied to each tensor (e.g. `Placement.to_device`)."""
        return PaddedBatch(move(self.input_ids), move(self.attention_mask), move(self.position_ids),
                           move(self.response_start), move(self.response_len), self.max_response,
                           None if self.shared is None else self.shared.apply(move))

    def on(self, model) -> PaddedBatch:
        """The batch on `model`'s device (itself when it is there already)."""
        device = next(model.parameters()).device
        return self if self.input_ids.device == device else self.apply(lambda t: t.to(device))


def pad_masks(masks: list[list[bool]], width: int) -> Tensor:
    """`[B, width]` float, each row's mask from the left (cut at `width`), 0 after it: which response
    tokens are the policy's (an episode's `action_mask`), padding never."""
    out = torch.zeros(len(masks), width)
    for i, mask in enumerate(masks):
        mask = mask[:width]
        out[i, : len(mask)] = torch.tensor(mask, dtype=torch.float32)
    return out


def pad_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int, side: str = "right",
              share: bool = False) -> PaddedBatch:
    """`share`: also lay the rows out with their prompts shared (`SharedPrompts`), where that saves work."""
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
    shared = share_prompts(prompts, responses, pad_id) if share and rows and min(map(len, responses)) > 0 else None
    return PaddedBatch(ids, mask, positions, torch.tensor(starts), lengths, int(lengths.max().item()) if rows else 0,
                       shared)


def response_positions(batch: PaddedBatch) -> tuple[Tensor, Tensor]:
    """(index `[B, T]` of the position whose output predicts each response token, mask `[B, T]`)."""
    steps = torch.arange(batch.max_response, device=batch.input_ids.device)
    index = (batch.response_start[:, None] - 1 + steps[None, :]).clamp(max=batch.input_ids.shape[1] - 1)
    return index, (steps[None, :] < batch.response_len[:, None]).float()


def token_logprobs(model, batch: PaddedBatch, full: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
    """(logp `[B, T]`, mask `[B, T]`, full log-distributions `[B, T, V]` or None) of the response tokens.

    Row b's response occupies positions `response_start[b] ...`; the logit predicting token j sits at j - 1.
    Gradients flow when the model is in training mode and grad is enabled.
    """
    batch = batch.on(model)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   position_ids=batch.position_ids, use_cache=False).logits.float()  # [B, L, V]
    index, mask = response_positions(batch)  # [B, T] each
    picked = logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1]))  # [B, T, V]
    log_dist = torch.log_softmax(picked, -1)
    logp = log_dist.gather(-1, response_targets(batch)[..., None]).squeeze(-1) * mask
    return logp, mask, (log_dist if full else None)


@dataclass
class TokenStats:
    """Per response token `[B, T]`: what a learner step needs, without a `[B, T, V]` tensor kept."""

    logp: Tensor  # log pi(y_t | y_<t), with gradients when the model has them
    mask: Tensor
    entropy: Tensor | None = None  # H(pi(. | y_<t)), detached (a diagnostic)
    kl: Tensor | None = None  # exact KL(pi || pi0)(. | y_<t) against the reference, with gradients
    ref_logp: Tensor | None = None  # log pi0(y_t | y_<t) of the reference, when one was given


# positions of the [B, c, V] fp32 logits one chunk holds: about 64 MiB at a time (32 MiB chunks
# measured no lower peak on SmolLM2-135M's learner step: 3,392 vs 3,323 MiB, within the noise)
CHUNK_ELEMENTS = 2**24


def body_and_head(model):
    """(decoder that returns hidden states, output layer) of a causal LM whose logits are just
    `head(hidden)`; None when the model post-processes its logits (soft-capping, a logit scale)."""
    config = getattr(model, "config", None)
    if any(getattr(config, key, None) not in (None, 1.0) for key in ("final_logit_softcapping", "logit_scale")):
        return None
    get_decoder, get_head = getattr(model, "get_decoder", None), getattr(model, "get_output_embeddings", None)
    if get_decoder is None or get_head is None or get_head() is None:
        return None
    return get_decoder(), get_head()


def response_hidden(decoder, batch: PaddedBatch) -> Tensor:
    """Hidden states at the positions that predict each response token: `[B, T, H]`. With
    `batch.shared`, each distinct prompt runs once and its rows continue from its keys and values
    (not under activation checkpointing, which transformers runs without a cache)."""
    checkpointing = getattr(decoder, "is_activation_checkpointing" if hasattr(decoder, "is_activation_checkpointing")
                            else "is_gradient_checkpointing", False)
    if batch.shared is not None and not (checkpointing and decoder.training):
        hidden = _shared_prompt_hidden(decoder, batch.shared)
        if hidden is not None:
            return hidden
    hidden = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                     position_ids=batch.position_ids, use_cache=False).last_hidden_state  # [B, L, H]
    index, _ = response_positions(batch)
    return hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))


def _shared_prompt_hidden(decoder, shared: SharedPrompts) -> Tensor | None:
    """`response_hidden` from a `SharedPrompts` layout: `[B, T, H]`, T = 1 + the response pass's width;
    None when the model kept no cache of the prompts (the caller then runs the padded batch)."""
    out = decoder(input_ids=shared.prompt_ids, attention_mask=shared.prompt_mask,
                  position_ids=shared.prompt_positions, use_cache=True)
    first = out.last_hidden_state[shared.row_prompt, -1:]  # [B, 1, H]: predicts each response's first token
    if shared.response_ids.shape[1] == 0:
        return first
    cache = returned_cache(out)
    if cache is None or cache.get_seq_length() != shared.prompt_ids.shape[1]:
        return None
    cache.batch_select_indices(shared.row_prompt)  # [G, ...] -> [B, ...], differentiable
    rest = decoder(input_ids=shared.response_ids, attention_mask=shared.mask, position_ids=shared.response_positions,
                   **cache_arg(cache), use_cache=True).last_hidden_state  # [B, T - 1, H]
    return torch.cat([first, rest], 1)


def response_targets(batch: PaddedBatch) -> Tensor:
    """The response tokens `[B, T]` (a padding id past each response's end)."""
    index, _ = response_positions(batch)
    return batch.input_ids.gather(1, (index + 1).clamp(max=batch.input_ids.shape[1] - 1))


def _from_distributions(log_dist: Tensor, targets: Tensor, ref_log_dist: Tensor | None, entropy: bool):
    """(logp, entropy, KL, reference logp) `[B, T]` from log-distributions `[B, T, V]`."""
    logp = log_dist.gather(-1, targets[..., None]).squeeze(-1)
    probs = log_dist.exp() if entropy or ref_log_dist is not None else None
    ent = -(probs * log_dist).sum(-1).detach() if entropy else None
    if ref_log_dist is None:
        return logp, ent, None, None
    kl = (probs * (log_dist - ref_log_dist)).sum(-1)
    return logp, ent, kl, ref_log_dist.gather(-1, targets[..., None]).squeeze(-1)


def _chunk(head, hidden: Tensor, targets: Tensor, ref_head, ref_hidden: Tensor | None, entropy: bool):
    """`_from_distributions` of one chunk of positions: its `[B, c, V]` tensors die with it."""
    log_dist = torch.log_softmax(head(hidden).float(), -1)  # [B, c, V]
    ref_log_dist = None if ref_hidden is None else torch.log_softmax(ref_head(ref_hidden).float(), -1)
    return _from_distributions(log_dist, targets, ref_log_dist, entropy)


def token_stats(model, batch: PaddedBatch, entropy: bool = False, reference=None,
                chunk_elements: int = CHUNK_ELEMENTS) -> TokenStats:
    """Log-probs of the response tokens (and the entropy, and the exact KL to `reference`), computed
    chunk by chunk along the sequence: the full fp32 `[B, T, V]` log-distribution is never held, not
    even for the backward pass (each chunk is recomputed from its hidden states, `[B, c, H]`).
    Models whose logits are not `head(hidden)` fall back to `token_logprobs`."""
    batch = batch.on(model)
    split, ref_split = body_and_head(model), body_and_head(reference) if reference is not None else None
    _, mask = response_positions(batch)
    if split is None or (reference is not None and ref_split is None):
        _, _, log_dist = token_logprobs(model, batch, full=True)
        ref_dist = None
        if reference is not None:
            with torch.no_grad():
                ref_dist = token_logprobs(reference, batch, full=True)[2]
        logp, ent, kl, ref_logp = _from_distributions(log_dist, response_targets(batch), ref_dist, entropy)
        return TokenStats(logp * mask, mask, ent, kl, None if ref_logp is None else ref_logp * mask)
    decoder, head = split
    hidden = response_hidden(decoder, batch)  # [B, T, H]
    if reference is None and type(head) is torch.nn.Linear:
        return _chosen_stats(hidden, head, response_targets(batch), mask, entropy, chunk_elements)
    ref_hidden = None
    if reference is not None:
        with torch.no_grad():
            ref_hidden = response_hidden(ref_split[0], batch)
    targets = response_targets(batch)
    B, T = targets.shape
    width = max(1, chunk_elements // max(1, B * head.weight.shape[0]))
    recompute = torch.is_grad_enabled() and hidden.requires_grad
    parts = []
    for t in range(0, T, width):
        args = (head, hidden[:, t : t + width], targets[:, t : t + width], ref_split[1] if ref_split else None,
                None if ref_hidden is None else ref_hidden[:, t : t + width], entropy)
        parts.append(checkpoint(_chunk, *args, use_reentrant=False) if recompute else _chunk(*args))
    def joined(i: int) -> Tensor:
        return torch.cat([p[i] for p in parts], 1) if parts else torch.zeros(B, 0, device=targets.device)

    has_ref = reference is not None
    return TokenStats(joined(0) * mask, mask, joined(1) if entropy else None, joined(2) * mask if has_ref else None,
                      joined(3) * mask if has_ref else None)


def _chosen_stats(hidden: Tensor, head: torch.nn.Linear, targets: Tensor, mask: Tensor, entropy: bool,
                  chunk_elements: int) -> TokenStats:
    """`token_stats` without a reference, through `chosen_logp`: all positions flattened to `[B * T, H]`
    (one plain matrix product per chunk), `chunk_elements // V` positions at a time."""
    B, T, H = hidden.shape
    flat, flat_targets = hidden.reshape(B * T, H), targets.reshape(B * T)
    rows = max(1, chunk_elements // head.weight.shape[0])
    parts = [chosen_logp(flat[i : i + rows], head.weight, head.bias, flat_targets[i : i + rows], entropy) for i in range(0, B * T, rows)]
    empty = mask.new_zeros(0)
    logp = torch.cat([p[0] for p in parts]) if parts else empty
    ent = (torch.cat([p[1] for p in parts]) if parts else empty).view(B, T) if entropy else None
    return TokenStats(logp.view(B, T) * mask, mask, ent)
