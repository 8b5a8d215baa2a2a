"""Every objective of docs/ALGORITHMS.md as a pure function on tensors with masks.

Import the families as modules (`from softrl.algorithms import spo, agro`) or the names below.
"""

from softrl.algorithms.agro import agro_off_policy_loss, agro_on_policy_loss, kl_pg_loss, regulariser_surrogate
from softrl.algorithms.common import leave_one_out_mean, log1mexp, token_kl
from softrl.algorithms.grpo import group_advantages, grpo_loss, k3_kl
from softrl.algorithms.passk import mean_pass_at_k, pass_at_k
from softrl.algorithms.ppo import gae, ppo_advantages, ppo_loss, shaped_rewards
from softrl.algorithms.rloo import rloo_advantages, rloo_loss
from softrl.algorithms.spo import (
    advantage_bce_loss,
    advantages,
    cumulative_q,
    mc_target_loss,
    q0_from_rewards,
    reverse_q_loss,
    spo_loss,
    success_to_prob,
    terminal_q_loss,
)

__all__ = [
    "advantage_bce_loss", "advantages", "agro_off_policy_loss", "agro_on_policy_loss", "cumulative_q",
    "gae", "group_advantages", "grpo_loss", "k3_kl", "kl_pg_loss", "leave_one_out_mean", "log1mexp",
    "mc_target_loss", "mean_pass_at_k", "pass_at_k", "ppo_advantages", "ppo_loss", "q0_from_rewards",
    "regulariser_surrogate", "reverse_q_loss", "rloo_advantages", "rloo_loss", "shaped_rewards",
    "spo_loss", "success_to_prob", "terminal_q_loss", "token_kl",
]
