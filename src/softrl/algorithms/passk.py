"""Unbiased pass@k (Chen et al. 2021) in the numerically stable product form."""

from __future__ import annotations

from collections.abc import Iterable


def pass_at_k(n: int, c: int, k: int) -> float:
    """`1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i)`: n samples, c correct."""
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in 1..n={n}, got k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(correct_counts: Iterable[int], n: int, k: int) -> float:
    """pass@k averaged over prompts, each with `n` samples of which `correct_counts[j]` are correct."""
    values = [pass_at_k(n, c, k) for c in correct_counts]
    if not values:
        raise ValueError("correct_counts is empty")
    return sum(values) / len(values)
