"""Evaluation: pass@k and diversity of a policy on held-out prompts."""

from softrl.eval.protocol import evaluate, summarize

__all__ = ["evaluate", "summarize"]
