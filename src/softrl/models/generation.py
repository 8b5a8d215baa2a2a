"""Sampling with behaviour log-probabilities, on `transformers.generate` with a KV cache.

Many samples of one prompt share the prompt's forward pass: the prompt is run once (prefill),
its KV cache is repeated `n` times, and `generate` continues from it. Temperature (one value, or
one drawn per sample from a range as the SPO paper does) and top-p are applied by one logits
processor, so the scores `generate` returns are exactly the sampling distribution and the
behaviour log-probs are read from them. A backend implements `Generator.generate`;
`make_generator` picks one by name: "hf" (`HFGenerator`) or "static" (`StaticCacheGenerator`, a thin
layer over `static_generation.StaticDecoder`: its own decode loop on a preallocated KV cache).
Both share the sampling distribution (`temperature_top_p`), the per-sample temperatures
(`draw_temperatures`), the chunking (`prompt_chunks`) and how a sample ends (`finish_sample`), so
they differ only in speed; for one seed they draw the same samples (fp32, up to rounding).
"""

from __future__ import annotations

import random
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import torch
from torch import Tensor

from softrl.models.kv_cache import cache_arg, returned_cache
from softrl.models.logprobs import pad_batch


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    max_new_tokens: int = 64
    temperature: float = 1.0
    temperature_range: tuple[float, float] | None = None  # per sample ~ U(lo, hi), e.g. (0.1, 0.8)
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False  # fixed work (benchmarks): EOS is never drawn, every sample is max_new_tokens long

    def __post_init__(self) -> None:
        if self.n < 1 or self.max_new_tokens < 1:
            raise ValueError(f"n and max_new_tokens must be >= 1, got n={self.n}, max_new_tokens={self.max_new_tokens}")
        if self.temperature <= 0 and self.temperature_range is None:
            raise ValueError(f"temperature must be > 0, got temperature={self.temperature}")
        if self.temperature_range is not None and not 0 < self.temperature_range[0] <= self.temperature_range[1]:
            raise ValueError(f"temperature_range must be 0 < lo <= hi, got {self.temperature_range}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got top_p={self.top_p}")


@dataclass
class Sample:
    prompt_index: int
    tokens: list[int]  # response tokens, through EOS or the stop string
    text: str
    logprobs: list[float]  # behaviour log-prob of each token under the sampling distribution
    temperature: float
    finish: str  # eos | stop | length
    meta: dict = field(default_factory=dict)


class Generator(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Sample]:
        """`params.n` samples for each prompt (token ids), grouped by prompt in order."""


def temperature_top_p(scores: Tensor, temperatures: Tensor, top_p: float, banned: int | None = None) -> Tensor:
    """The sampling distribution's logits: scores / T_row, then nucleus filtering at top_p (filtered
    tokens get -inf; the token that crosses top_p is kept). `scores` `[rows, V]`, `temperatures` `[>= rows]`;
    a `banned` token (EOS, for fixed-length samples) gets -inf first."""
    scores = scores / temperatures[: scores.shape[0], None].to(scores.dtype)
    if banned is not None:
        scores[:, banned] = float("-inf")
    if top_p >= 1.0:
        return scores
    sorted_scores, order = scores.sort(-1, descending=True)
    cumulative = sorted_scores.softmax(-1).cumsum(-1)
    drop_sorted = cumulative - sorted_scores.softmax(-1) >= top_p  # keep the token that crosses top_p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, float("-inf"))


class _TemperatureTopP:
    """`temperature_top_p` as a transformers logits processor."""

    def __init__(self, temperatures: Tensor, top_p: float, banned: int | None = None):
        self.temperatures, self.top_p, self.banned = temperatures, top_p, banned

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        return temperature_top_p(scores, self.temperatures, self.top_p, self.banned)


def banned_token(tokenizer, params: SamplingParams) -> int | None:
    """The token no sample may draw: EOS when the params ask for fixed-length samples."""
    return tokenizer.eos_token_id if params.ignore_eos else None


def draw_temperatures(rng: random.Random, params: SamplingParams, rows: int) -> list[float]:
    """One temperature per row: `params.temperature`, or U(lo, hi) draws from `rng` in row order."""
    if params.temperature_range is not None:
        return [rng.uniform(*params.temperature_range) for _ in range(rows)]
    return [params.temperature] * rows


def prompt_chunks(prompts: list[list[int]], params: SamplingParams, max_batch: int):
    """(offset, prompts) chunks of at most `max_batch` rows (`n` rows a prompt, at least one prompt)."""
    if prompts and min(len(p) for p in prompts) < 1:
        raise ValueError("every prompt needs at least one token")
    per_chunk = max(1, max_batch // params.n)
    for start in range(0, len(prompts), per_chunk):
        yield start, prompts[start : start + per_chunk]


def finish_sample(tokenizer, prompt_index: int, tokens: list[int], logprobs: list[float], temperature: float,
                  params: SamplingParams) -> Sample:
    """The sample as it ends: through the first EOS, or through the first token whose text completes a
    stop string (text cut there), else all `tokens` ("length")."""
    eos = tokenizer.eos_token_id
    finish, end = "length", len(tokens)
    if eos is not None and eos in tokens:
        finish, end = "eos", tokens.index(eos) + 1
    text = tokenizer.decode(tokens[:end], skip_special_tokens=True)
    for stop in params.stop:
        at = text.find(stop)
        if at >= 0:  # cut at the first token whose text completes the stop string
            cut = at + len(stop)
            for k in range(1, end + 1):
                if len(tokenizer.decode(tokens[:k], skip_special_tokens=True)) >= cut:
                    finish, end = "stop", k
                    break
            text = tokenizer.decode(tokens[:end], skip_special_tokens=True)
    return Sample(prompt_index, tokens[:end], text, logprobs[:end], temperature, finish)


class HFGenerator:
    """`transformers.generate` backend. `max_batch` bounds the rows decoded at once."""

    def __init__(self, model, tokenizer, max_batch: int = 256):
        self.model, self.tokenizer, self.max_batch = model, tokenizer, max_batch

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Sample]:
        rng = random.Random(params.seed)
        if params.seed is not None:
            torch.manual_seed(params.seed)
        samples: list[Sample] = []
        for start, chunk in prompt_chunks(prompts, params, self.max_batch):
            samples += self._generate_chunk(chunk, start, params, rng)
        return samples

    def _generate_chunk(self, prompts: list[list[int]], offset: int, params: SamplingParams,
                        rng: random.Random) -> list[Sample]:
        from transformers import LogitsProcessorList

        pad = self.tokenizer.pad_token_id
        rows = len(prompts) * params.n
        # left padding: generation continues at the right edge
        batch = pad_batch(prompts, [[] for _ in prompts], pad, side="left")
        device = next(self.model.parameters()).device
        ids, mask, positions = (x.to(device) for x in (batch.input_ids, batch.attention_mask, batch.position_ids))
        width = ids.shape[1]
        # prefill all but the last prompt token once, then share the cache across the n samples
        cache = None
        if width > 1:
            cache = returned_cache(self.model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1],
                                              position_ids=positions[:, :-1], use_cache=True))
            cache.batch_repeat_interleave(params.n)
        ids, mask = ids.repeat_interleave(params.n, 0), mask.repeat_interleave(params.n, 0)
        temps = draw_temperatures(rng, params, rows)
        processor = _TemperatureTopP(torch.tensor(temps, device=device), params.top_p, banned_token(self.tokenizer, params))
        out = self.model.generate(
            input_ids=ids, attention_mask=mask, **cache_arg(cache), do_sample=True, temperature=1.0, top_p=1.0,
            top_k=0, max_new_tokens=params.max_new_tokens, logits_processor=LogitsProcessorList([processor]),
            output_scores=True, return_dict_in_generate=True, pad_token_id=pad,
            eos_token_id=self.tokenizer.eos_token_id,
        )
        new = out.sequences[:, width:]  # [rows, steps]
        logp = torch.log_softmax(torch.stack(out.scores, 1).float(), -1).gather(-1, new[..., None]).squeeze(-1)
        return [finish_sample(self.tokenizer, offset + r // params.n, new[r].tolist(), logp[r].tolist(), temps[r],
                              params) for r in range(rows)]


class StaticCacheGenerator:
    """Own decode loop on a preallocated, reused KV cache (`static_generation.StaticDecoder`): no
    per-token `generate` machinery, and on CUDA a compiled one-token forward. Same samples contract,
    temperatures and sampling distribution as `HFGenerator`. `compile`: "auto" (on CUDA), True, False."""

    def __init__(self, model, tokenizer, max_batch: int = 256, compile: bool | str = "auto"):
        from softrl.models.static_generation import StaticDecoder

        self.model, self.tokenizer, self.max_batch = model, tokenizer, max_batch
        self.decoder = StaticDecoder(model, compile=compile)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Sample]:
        rng = random.Random(params.seed)
        device = self.decoder.device
        generator = None if params.seed is None else torch.Generator(device).manual_seed(params.seed)
        samples: list[Sample] = []
        self.decoder.next_call()
        for offset, chunk in prompt_chunks(prompts, params, self.max_batch):
            rows = len(chunk) * params.n
            temps = draw_temperatures(rng, params, rows)
            temperatures = torch.tensor(temps, device=device)
            process = partial(temperature_top_p, temperatures=temperatures, top_p=params.top_p,
                              banned=banned_token(self.tokenizer, params))
            tokens, logp = self.decoder.decode(chunk, params.n, params.max_new_tokens, process,
                                               self.tokenizer.pad_token_id, self.tokenizer.eos_token_id, generator)
            tokens, logp = tokens.tolist(), logp.tolist()
            samples += [finish_sample(self.tokenizer, offset + r // params.n, tokens[r], logp[r], temps[r], params)
                        for r in range(rows)]
        return samples

    def prefix_session(self):
        """`StaticDecoder.prefix_session`: successive calls in it prefill only what their prompts add to the
        previous call's prompts and samples (each chunk of `max_batch` rows continues from any of them)."""
        return self.decoder.prefix_session()


def prefix_session(generator):
    """A context in which `generator`'s successive calls reuse the keys and values of what their prompts
    share with the previous call's prompts and samples (the turns of multi-turn episodes): the backend's
    `prefix_session`, or nothing where it has none (each call prefills its prompts whole)."""
    session = getattr(generator, "prefix_session", None)
    return session() if session is not None else nullcontext()


BACKENDS = ("hf", "static", "auto")


def make_generator(model, tokenizer, backend: str = "hf", max_batch: int = 256) -> Generator:
    """A `Generator` by name: "hf" (`HFGenerator`, transformers `generate`), "static"
    (`StaticCacheGenerator`: own decode loop on a preallocated KV cache, compiled on CUDA) or "auto":
    "static" wherever the model's class supports a static cache (transformers' `_can_compile_fullgraph`,
    and not a stateful model), else "hf". The two draw the same samples for a seed
    (tests/test_generation_backends.py); on the CPU static measured 0.99-1.11x hf's speed on short
    answers and 1.2-1.65x (16 rows) to 3.8-4.0x (250 rows) on tinycode's 200-token programs, where hf's
    growing cache is concatenated every step (benchmarks/generation_backends.py, docs/MODELS.md)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown generation backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if backend == "auto":
        # a stateful (recurrent or hybrid) model's cache is not a plain static one
        static = getattr(model, "_can_compile_fullgraph", False) and not getattr(model, "_is_stateful", False)
        backend = "static" if static else "hf"
    # a "vllm" backend plugs in here: a class with the same `generate(prompts, params) -> list[Sample]`
    # that applies `temperature_top_p` and returns its log-probs, added to BACKENDS
    if backend == "static":
        return StaticCacheGenerator(model, tokenizer, max_batch=max_batch)
    return HFGenerator(model, tokenizer, max_batch=max_batch)
