"""The Learner: one optimisation step of any registered objective from a Batch.

Policy and reference forward passes (plus the value model where an objective needs one), one loss
per data source (its objective's adapter on `LossInputs`) combined by weight and share of the batch, AdamW with linear warm-up, gradient clipping, gradient
accumulation over micro-batches, and metrics. A non-finite loss skips the step; `max_nonfinite` of
them in a row raise `NonFiniteLossError`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable

import torch

from torch import Tensor

import softrl.objectives as registry
from softrl.config import RunConfig
from softrl.models.wrappers import PolicyModel, ReferenceModel, ValueModel
from softrl.objectives import LossInputs, objective_loss
from softrl.train.batch import Batch


def old_logp(logp: Tensor, part: Batch) -> Tensor:
    """pi_old for ratios `[B, T]`: the behaviour log-probs where the sample was drawn at temperature 1
    (stale rollouts get their importance weight), else the current policy (one update per rollout)."""
    current = logp.detach()
    return current.where(~part.has_behavior[:, None], part.behavior_logp[:, : current.shape[1]])


class NonFiniteLossError(RuntimeError):
    """The loss was NaN or inf in too many steps in a row."""


def micro_batches(batch: Batch, parts: int, group_size: Callable[[str], int]) -> list[tuple[str, list[int]]]:
    """(source, row indices) chunks: each source's rows split into about `parts` pieces of whole groups."""
    chunks = []
    by_source: dict[str, list[int]] = defaultdict(list)
    for i, source in enumerate(batch.sources):
        by_source[source].append(i)
    for source, index in by_source.items():
        n = group_size(source)
        groups = [index[g : g + n] for g in range(0, len(index), n)]
        per = max(1, math.ceil(len(groups) / parts))
        chunks += [(source, sum(groups[c : c + per], [])) for c in range(0, len(groups), per)]
    return chunks


class Learner:
    def __init__(self, policy: PolicyModel, reference: ReferenceModel, config: RunConfig,
                 value: ValueModel | None = None):
        self.policy, self.reference, self.value, self.config = policy, reference, value, config
        params = [p for p in policy.model.parameters() if p.requires_grad]
        params += list(value.parameters()) if value is not None else []
        self.params = params
        opt = config.optim
        self.optimizer = torch.optim.AdamW(params, lr=opt.lr, weight_decay=opt.weight_decay)
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
        """One optimizer step on `batch` (skipped when the loss is not finite); returns metrics."""
        self.policy.model.train()
        cfg = self.config
        total_rows = len(batch)
        metrics: dict[str, float] = defaultdict(float)
        finite = True
        for source, index in micro_batches(batch, cfg.optim.grad_accum, self.group_size):
            options = cfg.data.objective_for(source)
            part = batch.subset(index)
            inputs, entropy = self.inputs(part, options, self.group_size(source))
            loss, parts = objective_loss(options, inputs)
            share = len(index) / total_rows
            scaled = options.weight * share * loss
            if not torch.isfinite(scaled):
                finite = False
                break
            scaled.backward()
            metrics["loss"] += scaled.item()
            metrics[f"loss/{source}"] += share * loss.item()
            for key, value in parts.items():
                metrics[key] += share * value
            self._diagnostics(inputs, entropy, part, source, batch.sources.count(source), share, metrics)
        if not finite:
            self.optimizer.zero_grad(set_to_none=True)
            self.nonfinite_in_row += 1
            if self.nonfinite_in_row >= cfg.optim.max_nonfinite:
                raise NonFiniteLossError(f"the loss was not finite in {self.nonfinite_in_row} steps in a row "
                                         f"(optim.max_nonfinite={cfg.optim.max_nonfinite}): lower optim.lr or check the data")
            return {"skipped_nonfinite": 1.0, "nonfinite_in_row": float(self.nonfinite_in_row)}
        self.nonfinite_in_row = 0
        norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.optim.max_grad_norm or float("inf"))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        metrics["grad_norm"] = float(norm)
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        online = batch.policy_version[torch.tensor([s == "online" for s in batch.sources])].double()  # [b]
        if len(online):
            metrics["staleness/mean"] = self.version - 1 - online.mean().item()
            metrics["staleness/max"] = float(self.version - 1 - online.min().item())
        metrics["reward"] = batch.reward.mean().item()
        return dict(metrics)

    @torch.no_grad()
    def _diagnostics(self, x: LossInputs, entropy: Tensor, part: Batch, source: str, source_rows: int,
                     share: float, metrics: dict[str, float]) -> None:
        """KL to the reference (sequence log-ratio: on online rows an estimate of KL(pi || pi0)),
        entropy, importance-weight statistics."""
        mask = x.mask
        log_ratio = ((x.logp - x.ref_logp) * mask).sum(-1)  # [b]
        metrics["kl_ref"] += share * log_ratio.mean().item()
        metrics[f"kl_ref/{source}"] += log_ratio.sum().item() / source_rows
        metrics["entropy"] += share * ((entropy * mask).sum() / mask.sum().clamp_min(1)).item()
        if part.has_behavior.any():
            behavior = part.behavior_logp[:, : mask.shape[1]]
            log_w = ((x.logp - behavior) * mask).sum(-1)[part.has_behavior]  # [b']
            w = log_w.exp()
            metrics["iw/mean"] += share * w.mean().item()
            metrics["iw/max"] = max(metrics["iw/max"], w.max().item())
            metrics["iw/ess_fraction"] += share * (w.sum() ** 2 / (w**2).sum() / len(w)).item()

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
