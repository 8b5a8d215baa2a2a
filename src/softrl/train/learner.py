"""The Learner: one optimisation step of any registered objective from a Batch.

Policy and reference forward passes (plus the value model where an objective needs one), one loss
per data source (its objective's adapter on `LossInputs`) combined by weight and share of the batch, AdamW with linear warm-up, gradient clipping, gradient
accumulation over micro-batches, and metrics. A non-finite loss skips the step; `max_nonfinite` of
them in a row raise `NonFiniteLossError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from torch import Tensor

import softrl.objectives as registry
from softrl.config import RunConfig
from softrl.models.device import CPU, Placement
from softrl.models.wrappers import PolicyModel, ReferenceModel, ValueModel
from softrl.objectives import LossInputs, objective_loss
from softrl.train.batch import Batch
from softrl.train.data_parallel import groups_by_source, my_rows, sum_gradients, sum_metrics


def old_logp(logp: Tensor, part: Batch) -> Tensor:
    """pi_old for ratios `[B, T]`: the behaviour log-probs where the sample was drawn at temperature 1
    (stale rollouts get their importance weight), else the current policy (one update per rollout)."""
    current = logp.detach()
    return current.where(~part.has_behavior[:, None], part.behavior_logp[:, : current.shape[1]])


def _add(metrics: dict[str, Tensor], key: str, value: Tensor) -> None:
    """Accumulate a metric as a detached tensor (read once, at the end of the step)."""
    value = value.detach().float()
    metrics[key] = metrics[key] + value if key in metrics else value


class NonFiniteLossError(RuntimeError):
    """The loss was NaN or inf in too many steps in a row."""


def micro_batches(batch: Batch, parts: int, group_size: Callable[[str], int],
                  max_tokens: int = 0) -> list[tuple[str, list[int]]]:
    """(source, row indices) chunks of whole groups: each source's groups split into about `parts`
    pieces, or, with `max_tokens`, packed by length into pieces of at most `max_tokens` padded tokens
    (rows x the longest row; a group longer than that on its own is a piece of its own)."""
    chunks = []
    lengths = (batch.padded.response_start + batch.padded.response_len).tolist()  # [B] prompt + response
    for source, groups in groups_by_source(batch.sources, group_size).items():
        if not max_tokens:
            per = max(1, math.ceil(len(groups) / parts))
            chunks += [(source, sum(groups[c : c + per], [])) for c in range(0, len(groups), per)]
            continue
        piece: list[int] = []
        width = 0
        for group in sorted(groups, key=lambda g: -max(lengths[i] for i in g)):  # longest first: little padding
            longest = max(lengths[i] for i in group)
            if piece and (len(piece) + len(group)) * max(width, longest) > max_tokens:
                chunks.append((source, piece))
                piece, width = [], 0
            piece, width = piece + group, max(width, longest)
        chunks.append((source, piece))
    return chunks


class Learner:
    def __init__(self, policy: PolicyModel, reference: ReferenceModel, config: RunConfig,
                 value: ValueModel | None = None, placement: Placement = CPU, rank: int = 0, world: int = 1):
        self.policy, self.reference, self.value, self.config = policy, reference, value, config
        self.placement = placement
        self.rank, self.world = rank, world  # this learner's place in a data-parallel group (train.data_parallel)
        params = [p for p in policy.model.parameters() if p.requires_grad]
        params += list(value.parameters()) if value is not None else []
        self.params = params
        opt = config.optim
        self.optimizer = placement.optimizer(params, opt.lr, opt.weight_decay)
        warmup = max(1, opt.warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: min(1.0, (s + 1) / warmup))
        self.version = 0  # optimizer steps taken: the policy version of what it generates next
        self.nonfinite_in_row = 0

    def group_size(self, source: str) -> int:
        """Rows per group: online rows come in prompts' groups whatever the objective."""
        n = self.config.sampling.samples_per_prompt
        return n if source == "online" else registry.get(self.config.data.objective_for(source).algorithm).group_size(n)

    def inputs(self, part: Batch, options: registry.Options, group_size: int) -> tuple[LossInputs, Tensor]:
        """The objective's inputs for `part`, and the policy's token entropy `[B, T]` (diagnostics).
        Log-probs, entropy and token KL are computed chunk by chunk (`models.logprobs.token_stats`)."""
        objective = registry.get(options.algorithm)
        if objective.distributions(options):  # the token KL: one pass of the reference gives its log-probs too
            policy = self.policy.stats(part.padded, entropy=True, reference=self.reference)
            ref_logp = policy.ref_logp
        else:
            policy = self.policy.stats(part.padded, entropy=True)
            ref_logp = self.reference.stats(part.padded).logp
        values = self.value.values(part.padded) if self.value is not None else None
        old = old_logp(policy.logp, part) if objective.behavior_logp else policy.logp.detach()
        return LossInputs(
            policy.logp, ref_logp, old, policy.mask, part.reward, part.q0, self.config.beta, group_size,
            token_kl=policy.kl, values=values, old_values=None if values is None else values.detach(),
            mc_positions=part.mc_positions, mc_success=part.mc_success, mc_mask=part.mc_mask), policy.entropy

    def step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on `batch` (skipped when the loss is not finite); returns metrics.
        Metrics stay detached tensors on the device until the step's end: one read per step, no
        synchronisation per micro-batch."""
        self.policy.model.train()
        if self.value is not None:  # a copy of the (eval-mode) reference: train it as such (checkpointing)
            self.value.train()
        cfg = self.config
        total_rows = len(batch)
        metrics: dict[str, Tensor] = {}
        clock = self.placement.clock()
        rows = my_rows(batch.sources, self.rank, self.world, self.group_size) if self.world > 1 else list(range(total_rows))
        mine = batch.subset(rows) if rows else None  # a rank may get no group of a small batch
        pieces = micro_batches(mine, cfg.optim.grad_accum, self.group_size, cfg.optim.micro_batch_tokens) if mine else []
        for source, index in pieces:
            options = cfg.data.objective_for(source)
            host = mine.subset(index)
            with clock.phase("forward"), self.placement.autocast():
                part = host.apply(self.placement.to_device)
                inputs, entropy = self.inputs(part, options, self.group_size(source))
                loss, parts = objective_loss(options, inputs)
            share = len(index) / total_rows
            scaled = options.weight * share * loss
            with clock.phase("backward"):
                scaled.backward()
            _add(metrics, "loss", scaled)
            _add(metrics, f"loss/{source}", share * loss)
            for key, value in parts.items():
                _add(metrics, key, share * value)
            self._diagnostics(inputs, entropy, part, bool(host.has_behavior.any()), source,
                              batch.sources.count(source), share, metrics)
        if self.world > 1:  # the group's sums: every rank then takes the same decision and update
            metrics = sum_metrics(metrics)
        if not torch.isfinite(metrics["loss"]):  # the step's one synchronisation before the update
            self.optimizer.zero_grad(set_to_none=True)
            self.nonfinite_in_row += 1
            if self.nonfinite_in_row >= cfg.optim.max_nonfinite:
                raise NonFiniteLossError(f"the loss was not finite in {self.nonfinite_in_row} steps in a row "
                                         f"(optim.max_nonfinite={cfg.optim.max_nonfinite}): lower optim.lr or check the data")
            return {"skipped_nonfinite": 1.0, "nonfinite_in_row": float(self.nonfinite_in_row)}
        self.nonfinite_in_row = 0
        with clock.phase("optimizer"):
            if self.world > 1:
                sum_gradients(self.params)
            metrics["grad_norm"] = torch.nn.utils.clip_grad_norm_(self.params, cfg.optim.max_grad_norm or float("inf"))
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        device = self.placement.device  # one copy to the host for all of them
        out = dict(zip(metrics, torch.stack([v.detach().double().to(device) for v in metrics.values()]).cpu().tolist()))
        out.update({f"time/{name}": seconds for name, seconds in clock.seconds().items()})
        out["lr"] = self.scheduler.get_last_lr()[0]
        online = batch.policy_version[torch.tensor([s == "online" for s in batch.sources])].double()  # [b]
        if len(online):
            out["staleness/mean"] = self.version - 1 - online.mean().item()
            out["staleness/max"] = float(self.version - 1 - online.min().item())
        out["reward"] = batch.reward.mean().item()
        return out

    @torch.no_grad()
    def _diagnostics(self, x: LossInputs, entropy: Tensor, part: Batch, weighted: bool, source: str,
                     source_rows: int, share: float, metrics: dict[str, Tensor]) -> None:
        """KL to the reference (sequence log-ratio: on online rows an estimate of KL(pi || pi0)),
        entropy, importance-weight statistics."""
        mask = x.mask
        log_ratio = ((x.logp - x.ref_logp) * mask).sum(-1)  # [b]
        _add(metrics, "kl_ref", share * log_ratio.mean())
        _add(metrics, f"kl_ref/{source}", log_ratio.sum() / source_rows)
        _add(metrics, "entropy", share * (entropy * mask).sum() / mask.sum().clamp_min(1))
        if weighted:  # some rows have behaviour log-probs (read on the host: no synchronisation)
            has = part.has_behavior.float()  # [b]
            behavior = part.behavior_logp[:, : mask.shape[1]]
            log_w = ((x.logp - behavior) * mask).sum(-1)  # [b]
            w = log_w.exp() * has
            rows = has.sum().clamp_min(1)
            _add(metrics, "iw/mean", share * w.sum() / rows)
            metrics["iw/max"] = torch.maximum(metrics.get("iw/max", w.new_zeros(())), w.max())
            _add(metrics, "iw/ess_fraction", share * (w.sum() ** 2 / (w**2).sum().clamp_min(1e-30) / rows))

    # --- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "version": self.version, "nonfinite_in_row": self.nonfinite_in_row,
                "value": self.value.state_dict() if self.value is not None else None}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version, self.nonfinite_in_row = state["version"], state["nonfinite_in_row"]
        if self.value is not None and state["value"] is not None:
            self.value.load_state_dict(state["value"])
