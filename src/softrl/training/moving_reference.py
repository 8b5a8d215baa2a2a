"""The learner's reference when it moves (`data.objective.reference_update`, issue 51).

SPO's regulariser anchors the policy to pi0; the paper's section 7 names the next step, "update the
reference model ... would require online estimation of Q_0". Every `every` learner steps the reference
becomes a snapshot of the policy (a frozen copy of its own: the evaluation's KL stays against pi0). Each
version k >= 1 needs its own Q0(x) = beta log E_ref[exp(r / beta)], which the store's Monte-Carlo
estimate (of pi0) is not. It is estimated from the samples the run draws anyway: every online row of
prompt x since the last move adds `w exp(r / beta)` to x's sum, w = ref(y) / mu(y) the importance weight
from the row's sampler mu to the current reference (the learner already holds both log-probs), and

    Q0_hat(x) = beta log (sum_i w_i exp(r_i / beta) / sum_i w_i)     (pooled over steps)

self-normalised: the plain mean `(1/n) sum_i w_i exp(r_i / beta)` (`spo.q0_from_samples`) is unbiased
inside the log but leaves the rewards' range whenever one pass carries a weight above n, as it does when
mu lags the moved reference; this one stays within the rewards seen, at a bias of order 1/n. Pooling all
of a version's samples of x, not only the row's own group, shrinks the bias (`tabular.moving.q0_bias`:
about 1/n). A row whose prompt has no sample under this version yet keeps the store's estimate; each
step's metrics count which rows had which. A row whose weight is not finite adds nothing.

With `ema: tau` the reference moves a little after every step, `ref <- tau ref + (1 - tau) pi` weight by
weight (each tensor once, tied ones too; the average itself is kept in the trained dtype where the reference
is stored in a lower one, as bf16 on a GPU would round a step of 1 - tau away), so each step is a new
version, and a version's own samples would be one batch. Its sums are kept across steps instead, each step
multiplying the old terms (and their count) by tau: the estimate forgets samples at the rate the reference
forgets the policies they were weighed against, pooling about 1 / (1 - tau) steps. Their weights
were taken against the reference of their own step, so the pooled estimate lags the reference it serves by
about as much as the reference lags the policy (a bias the snapshot's estimate does not have).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
from torch import Tensor

from softrl.models.device import Placement
from softrl.models.wrappers import ReferenceModel


class MovingReference:
    def __init__(self, start: ReferenceModel, placement: Placement, beta: float, every: int | None = None,
                 ema: float | None = None):
        if (every is None) == (ema is None):
            raise ValueError("MovingReference: give one of every (snapshots) or ema (a moving average)")
        self.model = ReferenceModel(copy.deepcopy(start.model), start.tokenizer)
        placement.place(self.model.model, frozen=True)
        self.every, self.ema, self.beta, self.version = every, ema, beta, 0
        # the moving average in the trained dtype, where the stored copy's would lose its steps (None: the
        # stored copy is the average)
        self.average: dict[str, Tensor] | None = None
        if ema is not None and placement.frozen != placement.weights:
            self.average = {name: p.detach().to(placement.weights).clone()
                            for name, p in start.model.named_parameters()}
        # prompt id -> (log sum_i w_i exp(r_i / beta), log sum_i w_i, n) of this version's samples (with ema:
        # of all steps' samples, each step's terms and n scaled by ema once more, so n is an effective count)
        self.sums: dict[str, tuple[float, float, float]] = {}

    def after_step(self, step: int, policy_model) -> bool:
        """After learner step `step`: move to a snapshot of `policy_model` when one is due, or (ema) a step of
        the moving average towards it."""
        if self.ema is not None:
            self._average_towards(policy_model)
            return True
        if step % self.every:
            return False
        with torch.no_grad():
            self.model.model.load_state_dict(policy_model.state_dict())
        self.version += 1
        self.sums = {}
        return True

    def _average_towards(self, policy_model) -> None:
        # named_parameters lists a tied tensor once (a state_dict lists it under each name: averaged twice)
        policy = dict(policy_model.named_parameters())
        with torch.no_grad():
            for name, stored in self.model.model.named_parameters():
                mean = stored if self.average is None else self.average[name]
                mean.lerp_(policy[name].detach().to(device=mean.device, dtype=mean.dtype), 1 - self.ema)
                if mean is not stored:
                    stored.copy_(mean)
            buffers = dict(policy_model.named_buffers())
            for name, stored in self.model.model.named_buffers():  # not trained: the policy's own
                stored.copy_(buffers[name])
        self.version += 1
        forget = math.log(self.ema)
        self.sums = {pid: (total + forget, mass + forget, n * self.ema) for pid, (total, mass, n) in self.sums.items()}

    def q0(self, prompt_ids: list[str], stored: Tensor, reward: Tensor, log_w: Tensor, sampled: Tensor,
           counts: dict[str, float]) -> Tensor:
        """Each row's Q0 under the current reference `[B]`: pi0's stored estimate at version 0; after a
        move, its prompt's estimate from this version's samples so far, these rows' included (`sampled`
        `[B]` bool: rows drawn by a known sampler, whose importance weight log is `log_w` `[B]`;
        `reward` `[B]` on the unit scale), else the stored one. `counts` gets the rows of each kind."""
        if self.version == 0:
            counts["q0/stored_rows"] = counts.get("q0/stored_rows", 0.0) + len(prompt_ids)
            return stored
        weights = log_w.double().tolist()
        terms = (log_w.double() + reward.double() / self.beta).tolist()
        for pid, weight, term, known in zip(prompt_ids, weights, terms, sampled.tolist()):
            if known and math.isfinite(term):
                total, mass, n = self.sums.get(pid, (-math.inf, -math.inf, 0))
                self.sums[pid] = (float(np.logaddexp(total, term)), float(np.logaddexp(mass, weight)), n + 1)
        out = stored.clone()
        for i, pid in enumerate(prompt_ids):
            total, mass, n = self.sums.get(pid, (-math.inf, -math.inf, 0))
            if n:
                out[i] = self.beta * (total - mass)
            kind = "q0/online_rows" if n else "q0/stored_rows"
            counts[kind] = counts.get(kind, 0.0) + 1
            counts["q0/samples_per_row"] = counts.get("q0/samples_per_row", 0.0) + n
        return out

    def state_dict(self) -> dict:
        return {"version": self.version, "sums": dict(self.sums),
                "weights": self.model.model.state_dict() if self.version else None,
                "average": self.average if self.version else None}

    def load_state_dict(self, state: dict) -> None:
        self.version, self.sums = state["version"], {k: tuple(v) for k, v in state["sums"].items()}
        if state["weights"] is not None:
            self.model.model.load_state_dict(state["weights"])
        if state.get("average") is not None and self.average is not None:
            for name, mean in self.average.items():
                mean.copy_(state["average"][name])
