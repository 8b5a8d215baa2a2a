"""A Batch: trajectory rows (from any source) as the tensors a loss needs.

Rows whose tokens were made by another tokenizer (or text-only rows, e.g. imports) are re-tokenised
from their text, an episode from its turns. Rewards are the task's own; SPO's losses shift them (see
`objectives`). Only the policy's tokens are trained on: `action_mask` is 0 on an episode's environment
tokens (tool results, feedback), which stay in the context.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from softrl.models.logprobs import PaddedBatch, pad_batch, pad_masks


@dataclass
class Batch:
    rows: list[dict]
    padded: PaddedBatch  # prompt + response, right padding
    reward: Tensor  # [B], the task's reward
    q0: Tensor  # [B] float64, the soft value beta * log mean exp(r / beta) of the row's prompt under pi0
    behavior_logp: Tensor  # [B, T], 0 where unknown
    has_behavior: Tensor  # [B] bool: sampled at temperature 1 with known log-probs (importance weights)
    mc_positions: Tensor  # [B, M] prefix lengths with MC targets
    mc_success: Tensor  # [B, M] success rate of the rollouts from that prefix
    mc_mask: Tensor  # [B, M]
    policy_version: Tensor  # [B]
    sources: list[str]  # the mix source of each row (online | offline | mc)
    pad_id: int
    action_mask: Tensor  # [B, T] 1 on the policy's response tokens, 0 on the environment's (and padding)

    def __len__(self) -> int:
        return len(self.rows)

    def apply(self, move: Callable[[Tensor], Tensor]) -> Batch:
        """The batch with `move` applied to each tensor (e.g. `Placement.to_device`)."""
        return Batch(self.rows, self.padded.apply(move), move(self.reward), move(self.q0), move(self.behavior_logp),
                     move(self.has_behavior), move(self.mc_positions), move(self.mc_success), move(self.mc_mask),
                     move(self.policy_version), self.sources, self.pad_id, move(self.action_mask))

    def subset(self, index: list[int]) -> Batch:
        """The rows `index`, padding recomputed (so a micro-batch is no wider than it must be); all rows
        in order are the batch itself."""
        if index == list(range(len(self))):
            return self
        ix = torch.tensor(index, dtype=torch.long)
        width = int(self.padded.response_len[ix].max())
        start, lengths = self.padded.response_start[ix], self.padded.response_len[ix]
        prompts = [self.padded.input_ids[i, : start[j]].tolist() for j, i in enumerate(index)]
        responses = [self.padded.input_ids[i, start[j] : start[j] + lengths[j]].tolist() for j, i in enumerate(index)]
        return Batch([self.rows[i] for i in index], pad_batch(prompts, responses, self.pad_id, share=True),
                     self.reward[ix], self.q0[ix],
                     self.behavior_logp[ix, :width], self.has_behavior[ix], self.mc_positions[ix],
                     self.mc_success[ix], self.mc_mask[ix], self.policy_version[ix],
                     [self.sources[i] for i in index], self.pad_id, self.action_mask[ix, :width])


def knows_behavior(row: dict, response_length: int | None = None) -> bool:
    """Whether the row carries its sampler's log-probs, one per response token, at temperature 1 and
    top-p 1 (only then are they the log-probs of the distribution it was drawn from)."""
    lp, decoding = row.get("behavior_logprobs"), row.get("decoding") or {}
    return bool(lp) and (response_length is None or len(lp) == response_length) \
        and decoding.get("temperature") == 1.0 and decoding.get("top_p") == 1.0


def own_tokens(row: dict, fingerprint: str) -> bool:
    """Whether a batch takes the row's token ids as they are (made by this tokenizer), not its text's."""
    return row.get("tokenizer") == fingerprint and bool(row.get("response_tokens"))


def tokens_usable(row: dict, fingerprint: str) -> bool:
    """Whether a batch feeds the row's own token ids (`row_tokens`), so that it needs none of its texts:
    this tokenizer's, and an episode's only with the mask that says which ids are the policy's."""
    return own_tokens(row, fingerprint) and (not row.get("turns") or bool(row.get("action_mask")))


def unusable_row(rows: list[dict], fingerprint: str, vocab_size: int | None, encode_prompt: Callable[[str], list[int]]
                 ) -> str | None:
    """What the first of `rows` a model cannot be fed has wrong, in words naming the row (None when
    all can): token ids it would take outside `vocab_size`, or no prompt token at all."""
    empty_prompt = None  # whether a row without prompt text makes a prompt of no tokens (no chat template)
    for row in rows:
        what = f"row {row.get('id')!r} (prompt {row.get('prompt_id')!r}, source {row.get('source')!r})"
        if own_tokens(row, fingerprint):
            if not row.get("prompt_tokens"):
                return f"{what} has response_tokens but no prompt_tokens"
            for name in ("prompt_tokens", "response_tokens"):
                low, high = min(row[name]), max(row[name])
                if low < 0 or (vocab_size is not None and high >= vocab_size):
                    limit = f"0 to {vocab_size - 1}" if vocab_size is not None else "0 or more"
                    return (f"{what} holds token id {low if low < 0 else high} in {name}, outside the model's "
                            f"vocabulary (ids {limit})")
        elif not row.get("prompt_text"):
            if empty_prompt is None:
                empty_prompt = not encode_prompt("")
            if empty_prompt:
                return f"{what} has no prompt text and no prompt tokens"
    return None


EpisodeEncoder = Callable[[str, list[dict]], tuple[list[int], list[int], list[bool]]]
# room a chat template may add around a row's text, in tokens (a system prompt, role markers)
TEMPLATE_TOKENS = 512


def row_tokens(row: dict, fingerprint: str, encode_prompt: Callable[[str], list[int]],
               encode_response: Callable[[str], list[int]], encode_episode: EpisodeEncoder | None = None
               ) -> tuple[list[int], list[int], list[bool]]:
    """(prompt ids, response ids, which response ids are the policy's) of a row as a batch feeds it: its
    own ids where this tokenizer made them (an episode's only with the mask that says which are the
    policy's), else its text's, an episode's from its turns."""
    if tokens_usable(row, fingerprint):
        response = list(row["response_tokens"])
        return list(row["prompt_tokens"]), response, list(row.get("action_mask") or [True] * len(response))
    if row.get("turns"):
        if encode_episode is None:
            raise ValueError(f"row {row.get('id')!r} is an episode and this batch has no episode encoder")
        return encode_episode(row["prompt_text"], row["turns"])
    response = encode_response(row["response_text"])
    return encode_prompt(row["prompt_text"]), response, [True] * len(response)


def too_long_row(rows: list[dict], positions: int, tokens: Callable[[dict], tuple[list[int], list[int], list[bool]]],
                 fingerprint: str) -> tuple[int, int] | None:
    """(index, tokens) of the first of `rows` longer than a model of `positions` positions (prompt and
    response); None when all fit or `positions` is unknown (0). `tokens`: `row_tokens` with the run's
    encoders. Text is tokenised only where it could be that long: a UTF-8 character is at most 4 bytes,
    and byte-level tokenizers make at most one token of a byte."""
    if not positions:
        return None
    for i, row in enumerate(rows):
        if own_tokens(row, fingerprint):
            length = len(row.get("prompt_tokens") or []) + len(row["response_tokens"])
        else:
            chars = len(row.get("prompt_text") or "") + len(row.get("response_text") or "") + len(str(row.get("turns") or ""))
            if 4 * chars + TEMPLATE_TOKENS * (1 + len(row.get("turns") or [])) <= positions:
                continue
            prompt, response, _ = tokens(row)
            length = len(prompt) + len(response)
        if length > positions:
            return i, length
    return None


def make_batch(rows: list[dict], fingerprint: str, pad_id: int, encode_prompt: Callable[[str], list[int]],
               encode_response: Callable[[str], list[int]], q0: dict[str, float],
               encode_episode: EpisodeEncoder | None = None) -> Batch:
    """Tensors for `rows` (each with a `mix_source` tag, else counted as online). `fingerprint`: the
    tokenizer's, whose token ids rows may keep; `q0`: the soft value of every prompt at the run's beta;
    `encode_episode(prompt_text, turns)`: an episode's (prompt ids, response ids, policy mask)
    (`models.loading.encode_episode`), for episodes of another tokenizer or of text only."""
    if not rows:
        raise ValueError("a batch needs at least one trajectory")
    prompts, responses, masks = [], [], []
    for row in rows:
        prompt, response, mask = row_tokens(row, fingerprint, encode_prompt, encode_response, encode_episode)
        prompts.append(prompt)
        responses.append(response)
        masks.append(mask)
    padded = pad_batch(prompts, responses, pad_id, side="right", share=True)
    width = padded.max_response
    action_mask = pad_masks(masks, width)
    missing = sorted({r["prompt_id"] for r in rows} - set(q0))
    if missing:
        raise ValueError(f"no Q0 for prompt {missing[0]!r}: run `softrl q0` on its task first")
    behavior = torch.zeros(len(rows), width)
    has_behavior = torch.zeros(len(rows), dtype=torch.bool)
    for i, row in enumerate(rows):
        if knows_behavior(row, len(responses[i])):
            lp = row["behavior_logprobs"]
            behavior[i, : len(lp)] = torch.tensor(lp)
            has_behavior[i] = True
    m = max([len(r.get("mc_targets") or []) for r in rows] + [1])
    positions, success, mc_mask = torch.zeros(len(rows), m, dtype=torch.long), torch.ones(len(rows), m), torch.zeros(len(rows), m)
    for i, row in enumerate(rows):
        for j, target in enumerate(row.get("mc_targets") or []):
            if target["t"] <= len(responses[i]):
                positions[i, j], mc_mask[i, j] = target["t"], 1.0
                success[i, j] = target["success"]
    return Batch(
        rows, padded,
        reward=torch.tensor([float(r["reward"]) for r in rows]),
        q0=torch.tensor([q0[r["prompt_id"]] for r in rows], dtype=torch.float64),
        behavior_logp=behavior, has_behavior=has_behavior, mc_positions=positions, mc_success=success,
        mc_mask=mc_mask, policy_version=torch.tensor([int(r.get("policy_version", -1)) for r in rows]),
        sources=[r.get("mix_source", "online") for r in rows], pad_id=pad_id, action_mask=action_mask,
    )
