"""Policy, frozen reference and (for PPO) value model around one Hugging Face causal LM."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import Tensor, nn

from softrl.models.loading import load_causal_lm
from softrl.models.logprobs import (PaddedBatch, TokenStats, pad_batch, response_hidden, response_positions, token_logprobs,
                                    token_stats)


class PolicyModel:
    """The trained policy: log-probs with gradients, saving."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer

    @classmethod
    def load(cls, path: str | Path, dtype: str = "float32", lora: dict | None = None) -> "PolicyModel":
        model, tokenizer = load_causal_lm(path, dtype)
        if lora is not None:
            model = attach_lora(model, **lora)
        return cls(model, tokenizer)

    def batch(self, prompts: list[list[int]], responses: list[list[int]]) -> PaddedBatch:
        return pad_batch(prompts, responses, self.tokenizer.pad_token_id, side="right")

    def logprobs(self, batch: PaddedBatch, full: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
        return token_logprobs(self.model, batch, full)

    def stats(self, batch: PaddedBatch, entropy: bool = False, reference: ReferenceModel | None = None) -> TokenStats:
        """Chunked log-probs (and entropy, and token KL to `reference`): no `[B, T, V]` tensor kept."""
        return token_stats(self.model, batch, entropy, None if reference is None else reference.model)

    def checkpoint_activations(self) -> None:
        """Recompute each layer's activations in backward instead of keeping them."""
        checkpoint_activations(self.model)

    def save_final(self, directory: str | Path) -> None:
        """Whole weights and the tokenizer, a folder `AutoModelForCausalLM.from_pretrained` loads. LoRA
        adapters are merged into the weights in place (no copy: LoRA is used where memory is short),
        so call this once training is over; the folder then needs neither PEFT nor the base model."""
        if hasattr(self.model, "merge_and_unload"):
            self.model = self.model.merge_and_unload()
        self.model.save_pretrained(str(directory))
        self.tokenizer.save_pretrained(str(directory))


class ReferenceModel:
    """A frozen copy: no gradients, eval mode, log-probs under no_grad."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model.eval(), tokenizer
        for p in self.model.parameters():
            p.requires_grad_(False)

    @classmethod
    def from_policy(cls, policy: PolicyModel) -> "ReferenceModel":
        return cls(copy.deepcopy(policy.model), policy.tokenizer)

    @torch.no_grad()
    def logprobs(self, batch: PaddedBatch, full: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
        return token_logprobs(self.model, batch, full)

    @torch.no_grad()
    def stats(self, batch: PaddedBatch) -> TokenStats:
        return token_stats(self.model, batch)


class ValueModel(nn.Module):
    """PPO's value model: the reference backbone (a trainable copy) and a scalar head.

    `values(batch)` `[B, T]` is V of the state before each response token (read at the position
    that predicts it), the convention `softrl.algorithms.ppo.gae` expects."""

    def __init__(self, causal_lm):
        super().__init__()
        lm = copy.deepcopy(causal_lm)
        self.backbone = lm.get_decoder() if hasattr(lm, "get_decoder") else lm.base_model
        for p in self.backbone.parameters():
            p.requires_grad_(True)
        self.head = nn.Linear(lm.config.hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def checkpoint_activations(self) -> None:
        checkpoint_activations(self.backbone)

    def values(self, batch: PaddedBatch) -> Tensor:
        batch = batch.on(self.backbone)
        _, mask = response_positions(batch)  # [B, T]
        return self.head(response_hidden(self.backbone, batch).float()).squeeze(-1) * mask


def checkpoint_activations(model) -> None:
    """Hugging Face activation checkpointing, non-reentrant (works with frozen inputs and LoRA)."""
    options = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # its name since transformers 5.20
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)


def attach_lora(model, r: int = 8, alpha: int = 16, dropout: float = 0.0, target_modules: list[str] | None = None):
    """Wrap `model` with PEFT LoRA adapters (optional extra `softrl[peft]`)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        from softrl.config import ConfigError

        raise ConfigError("model.lora needs PEFT: pip install 'softrl[peft]'") from e
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, task_type="CAUSAL_LM",
                        target_modules=target_modules or ["q_proj", "v_proj"])
    return get_peft_model(model, config)
