"""The Learner: one optimisation step of any registered objective from a Batch.

Policy and reference forward passes (plus the value model where an objective needs one), one loss
per data source (its objective's adapter on `LossInputs`) combined by weight and share of the batch, AdamW with linear warm-up, gradient clipping, gradient
accumulation over micro-batches, and metrics. A non-finite loss skips the step; `max_nonfinite` of
them in a row raise `NonFiniteLossError`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch

from torch import Tensor

import softrl.objectives as registry
from softrl.algorithms import spo
from softrl.config import RunConfig
from softrl.models.device import CPU, Placement
from softrl.models.wrappers import PolicyModel, ReferenceModel, ValueModel
from softrl.objectives import LossInputs, objective_loss
from softrl.training.batch import Batch
from softrl.training.data_parallel import (Shards, groups_by_source, my_rows, same_as_rank_0, same_layout, sum_metrics,
                                       whole)
from softrl.training.moving_reference import MovingReference


def _add(metrics: dict[str, Tensor], key: str, value: Tensor) -> None:
    """Accumulate a metric as a detached tensor (read once, at the end of the step)."""
    value = value.detach().float()
    metrics[key] = metrics[key] + value if key in metrics else value


class NonFiniteLossError(RuntimeError):
    """The loss was NaN or inf in too many steps in a row."""


def micro_batches(batch: Batch, parts: int, group_size: Callable[[str], int], max_tokens: int = 0,
                  rows: list[int] | None = None) -> list[tuple[str, list[int]]]:
    """(source, row indices) chunks of whole groups of `rows` (all by default): each source's groups
    split into about `parts` pieces, or, with `max_tokens`, packed by length into pieces of at most
    `max_tokens` padded tokens (rows x the longest row; a group longer than that on its own is a piece
    of its own)."""
    rows = list(range(len(batch))) if rows is None else rows
    chunks = []
    every = (batch.padded.response_start + batch.padded.response_len).tolist()  # [B] prompt + response
    lengths = [every[i] for i in rows]
    for source, groups in groups_by_source([batch.sources[i] for i in rows], group_size).items():
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
    return [(source, [rows[i] for i in piece]) for source, piece in chunks]


def group_q0(groups: list, reward: Tensor, usable: Tensor, beta: float) -> Tensor:
    """`[B]`: each usable row's Q0 of its own sampler, `beta log mean exp(r / beta)` over the usable rows of
    its group (`groups[i]`: a key, the same for the samples one policy drew for one prompt; `reward` `[B]`
    on the unit scale); 0 where a row is not usable. Low by Jensen, the more so in small groups
    (`spo.q0_from_samples`)."""
    out = torch.zeros(len(groups), dtype=torch.float64)
    members: dict = {}
    for i, (key, ok) in enumerate(zip(groups, usable.tolist())):
        if ok:
            members.setdefault(key, []).append(i)
    for rows in members.values():
        r = reward[rows].double().cpu()
        out[rows] = spo.q0_from_samples(r, torch.zeros_like(r), beta)
    return out


class Learner:
    def __init__(self, policy: PolicyModel, reference: ReferenceModel, config: RunConfig,
                 value: ValueModel | None = None, placement: Placement = CPU, rank: int = 0, world: int = 1):
        self.policy, self.reference, self.value, self.config = policy, reference, value, config
        self.placement = placement
        self.rank, self.world = rank, world  # this learner's place in a data-parallel group (training.data_parallel)
        self.trained, self.shards = policy, None  # the policy the steps train
        if world > 1:  # FSDP2 shards of the trained models; rank 0 keeps `policy` whole, refreshed every step
            same_as_rank_0([policy.model, reference.model, value])
            self.trained = PolicyModel(copy.deepcopy(policy.model) if rank == 0 else policy.model, policy.tokenizer)
            self.shards = Shards(self.trained.model, value, placement.device, world)
        params = [p for p in self.trained.model.parameters() if p.requires_grad]
        params += list(value.parameters()) if value is not None else []
        self.params = params
        opt = config.optim
        self.optimizer = placement.optimizer(params, opt.lr, opt.weight_decay)
        warmup = max(1, opt.warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: min(1.0, (s + 1) / warmup))
        self.version = 0  # optimizer steps taken: the policy version of what it generates next
        self.nonfinite_in_row = 0
        moves = getattr(config.data.objective, "reference_update", None)
        self.moving = (MovingReference(reference, placement, config.beta, every=moves.every, ema=moves.ema)
                       if moves and not moves.behavior else None)
        self.behavior_reference = bool(moves and moves.behavior)  # each online row's own sampler
        self.q0_counts: dict[str, float] = {}  # this step's rows by the Q0 they had (a moving reference's)

    def group_size(self, source: str) -> int:
        """Rows per group: online rows come in prompts' groups whatever the objective."""
        n = self.config.sampling.samples_per_prompt
        return n if source == "online" else registry.get(self.config.data.objective_for(source).algorithm).group_size(n)

    def inputs(self, part: Batch, options: registry.Options, group_size: int) -> tuple[LossInputs, Tensor]:
        """The objective's inputs for `part`, and the policy's token entropy `[B, T]` (diagnostics).
        Log-probs, entropy and token KL are computed chunk by chunk (`models.logprobs.token_stats`)."""
        objective = registry.get(options.algorithm)
        # a source whose own objective (data.objectives) leaves the reference where it started regresses
        # against the starting model, with the store's Q0 of it: exact for it, where a moving reference has
        # only an estimate from this run's samples of the rows' prompts, if any
        moves = getattr(options, "reference_update", None) is not None
        moving = self.moving if moves else None
        reference = self.reference if moving is None else moving.model
        if objective.distributions(options):  # the token KL: one pass of the reference gives its log-probs too
            policy = self.trained.stats(part.padded, entropy=True, reference=reference)
            ref_logp = policy.ref_logp
        else:
            policy = self.trained.stats(part.padded, entropy=True)
            ref_logp = reference.stats(part.padded).logp
        values = self.value.values(part.padded) if self.value is not None else None
        # one update per batch: PPO's pi_old is the policy now; a row's own sampler mu is behavior_logp
        # only the policy's tokens are trained on: an episode's environment tokens are context, not actions
        mask = policy.mask * part.action_mask[:, : policy.mask.shape[1]].to(policy.mask.dtype)
        behavior_logp = part.behavior_logp[:, : policy.logp.shape[1]]
        q0 = part.q0
        behavior_reference = self.behavior_reference and moves
        if self.moving is not None and not moves:
            self.q0_counts["q0/start_rows"] = self.q0_counts.get("q0/start_rows", 0.0) + len(part.rows)
        if moving is not None or behavior_reference:
            # only this run's own samples are unfiltered draws of their sampler
            own = part.has_behavior & torch.tensor([s == "online" for s in part.sources], device=ref_logp.device)  # [B]
        if moving is not None:
            log_w = ((ref_logp - behavior_logp) * mask).sum(-1)  # [B] log ref(y) / mu(y)
            q0 = moving.q0([r["prompt_id"] for r in part.rows], part.q0, part.reward, log_w, own, self.q0_counts)
        if behavior_reference:  # an online row's sampler mu and its group's Q0 of mu; pi0's for the others
            ref_logp = torch.where(own[:, None], behavior_logp, ref_logp)  # [B, T]
            groups = [(r["prompt_id"], r.get("policy_version")) for r in part.rows]
            q0 = torch.where(own.to(q0.device), group_q0(groups, part.reward, own, self.config.beta).to(q0), q0)
            self.q0_counts["q0/group_rows"] = self.q0_counts.get("q0/group_rows", 0.0) + float(own.sum())
        return LossInputs(
            policy.logp, ref_logp, policy.logp.detach(), mask, self.rewards(part.reward, objective), q0,
            self.config.beta,
            group_size, token_kl=policy.kl, values=values, old_values=None if values is None else values.detach(),
            mc_positions=part.mc_positions, mc_success=part.mc_success, mc_mask=part.mc_mask,
            behavior_logp=behavior_logp, has_behavior=part.has_behavior), policy.entropy

    def rewards(self, unit: Tensor, objective: registry.Objective) -> Tensor:
        """The rows' rewards (kept on [0, 1] in batches and the store) on the scale `objective` asks."""
        declared = self.config.task.reward_range
        if objective.rewards == "unit" or declared is None:
            return unit
        low, high = declared
        return low + (high - low) * unit

    def step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on `batch` (skipped when the loss is not finite); returns metrics.
        Metrics stay detached tensors on the device until the step's end: one read per step, no
        synchronisation per micro-batch."""
        self.trained.model.train()
        if self.value is not None:  # a copy of the (eval-mode) reference: train it as such (checkpointing)
            self.value.train()
        cfg = self.config
        total_rows = len(batch)
        metrics: dict[str, Tensor] = {}
        self.q0_counts = {}
        clock = self.placement.clock()
        pieces = self.pieces(batch)
        hosts = [batch.subset(index) for _, index, _ in pieces]
        if self.shards is not None:
            hosts = same_layout(hosts, self.placement.device)
        for (source, index, weight), host in zip(pieces, hosts):
            options = cfg.data.objective_for(source)
            with clock.phase("forward"), self.placement.autocast():
                part = host.apply(self.placement.to_device)
                if self.shards is None:
                    inputs, entropy = self.inputs(part, options, self.group_size(source))
                else:
                    inputs, entropy = self.shards(self.inputs, part, options, self.group_size(source))
                loss, parts = objective_loss(options, inputs)
            share = weight * len(index) / total_rows
            scaled = options.weight * share * loss
            with clock.phase("backward"):
                scaled.backward()
            if not weight:
                continue
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
            metrics["grad_norm"] = whole(torch.nn.utils.clip_grad_norm_(self.params, cfg.optim.max_grad_norm or float("inf")))
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.shards is not None:
                self.shards.publish(self.policy.model if self.rank == 0 else None)
        self.version += 1
        if self.moving is not None:
            self.moving.after_step(self.version, self.trained.model)
            rows = max(1.0, self.q0_counts.get("q0/online_rows", 0.0) + self.q0_counts.get("q0/stored_rows", 0.0))
            metrics.update({k: torch.tensor(v / rows if k == "q0/samples_per_row" else v)
                            for k, v in self.q0_counts.items()})
            metrics["reference/version"] = torch.tensor(float(self.moving.version))
        if self.behavior_reference:
            metrics["q0/group_rows"] = torch.tensor(self.q0_counts.get("q0/group_rows", 0.0))
        device = self.placement.device  # one copy to the host for all of them
        out = dict(zip(metrics, torch.stack([v.detach().double().to(device) for v in metrics.values()]).cpu().tolist()))
        out.update({f"time/{name}": seconds for name, seconds in clock.seconds().items()})
        out["lr"] = self.scheduler.get_last_lr()[0]
        online = batch.policy_version[torch.tensor([s == "online" for s in batch.sources])].double()  # [b]
        if len(online):
            out["staleness/mean"] = self.version - 1 - online.mean().item()
            out["staleness/max"] = float(self.version - 1 - online.min().item())
            out["staleness/min"] = float(self.version - 1 - online.max().item())
        out["reward"] = batch.reward.mean().item()
        return out

    def pieces(self, batch: Batch) -> list[tuple[str, list[int], float]]:
        """(source, row indices, weight) of this rank's micro-batches. In a group each rank runs as many
        as the rank with the most (the shards' collectives pair up rank by rank): one short of them
        repeats a piece at weight 0. Every rank plans every rank's share, so no message is needed."""
        cfg = self.config
        plans = [micro_batches(batch, cfg.optim.grad_accum, self.group_size, cfg.optim.micro_batch_tokens,
                               my_rows(batch.sources, rank, self.world, self.group_size)) for rank in range(self.world)]
        mine = [(source, index, 1.0) for source, index in plans[self.rank]]
        if len(mine) < max(map(len, plans)):
            source, index, _ = mine[-1] if mine else (*next(plan[0] for plan in plans if plan), 0.0)
            mine += [(source, index, 0.0)] * (max(map(len, plans)) - len(mine))
        return mine

    @torch.no_grad()
    def _diagnostics(self, x: LossInputs, entropy: Tensor, part: Batch, weighted: bool, source: str,
                     source_rows: int, share: float, metrics: dict[str, Tensor]) -> None:
        """KL to the reference (sequence log-ratio: on online rows an estimate of KL(pi || pi0)),
        entropy, importance-weight statistics over the rows with mu's log-probs: mean and largest
        sequence weight pi/mu, their effective sample size as a fraction of the rows, and
        KL(mu || pi) estimated on mu's own samples as the mean of log mu(y) - log pi(y)."""
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
            _add(metrics, "iw/kl_behavior", share * (-log_w * has).sum() / rows)

    # --- checkpoints ----------------------------------------------------------------------------
    # In a group, every rank calls these together; the whole state is rank 0's (the other ranks' is
    # None), in one process's format, so a checkpoint resumes with any number of learners.
    def state_dict(self) -> dict:
        value = None
        if self.value is not None:
            value = self.value.state_dict() if self.shards is None else self.shards.value_state()
        optimizer = self.optimizer.state_dict() if self.shards is None else self.shards.optimizer_state(self.optimizer)
        return {"optimizer": optimizer, "scheduler": self.scheduler.state_dict(),
                "version": self.version, "nonfinite_in_row": self.nonfinite_in_row, "value": value,
                "moving_reference": None if self.moving is None else self.moving.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """`state`, and in a group the weights of rank 0's `policy` (restored by then), on every rank."""
        if self.shards is not None:
            self.shards.load(self.policy.model if self.rank == 0 else None, state.get("value"))
            self.shards.load_optimizer_state(self.optimizer, state.get("optimizer"))
        else:
            self.optimizer.load_state_dict(state["optimizer"])
            if self.value is not None and state["value"] is not None:
                self.value.load_state_dict(state["value"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version, self.nonfinite_in_row = state["version"], state["nonfinite_in_row"]
        if self.moving is not None and state.get("moving_reference"):
            self.moving.load_state_dict(state["moving_reference"])
