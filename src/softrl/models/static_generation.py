"""A decode loop of our own on a preallocated transformers `StaticCache`: the engine behind the
"static" generation backend (`softrl.models.generation.StaticCacheGenerator`).

`generate` in transformers pays per token for its Python machinery (logits processors, stopping
criteria, a growing cache that is concatenated each step). Here the KV cache is allocated once for a
(rows, length) shape and reused by later calls of the same shape; each step is one forward of the
`[rows, 1]` next tokens with explicit positions and the full-length attention mask, and, on CUDA, that
forward is compiled (`torch.compile`, CUDA graphs), which a static cache allows.

Prompts are prefilled once each (into an ordinary dynamic cache, all but their last token, as
`HFGenerator` does) and their keys/values are copied into the `n` rows of their samples; the first
decode step feeds the prompts' last tokens. The sampling math (temperature, top-p) comes in as a
function, so this module knows nothing of `SamplingParams` and `generation` can build on it.
transformers 5 has no `cache_position` argument: a static cache layer tracks its own write position
(`cumulative_length`), and the mask offsets come from it.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from softrl.models.kv_cache import cache_arg, cache_name, returned_cache
from softrl.models.logprobs import pad_batch

COMPILE_MODES = {"cuda": "reduce-overhead"}  # CUDA graphs; elsewhere inductor's default
# cache lengths are rounded up to this, so calls of nearby lengths share a cache (and a compiled graph);
# uncompiled, a finer rounding, as every step attends over the whole cache length
LENGTH_BUCKET = {True: 64, False: 8}
# distinct row counts whose caches are kept between calls: on CUDA a full chunk and the last, shorter one
# (their compiled graphs go with them); on the CPU one, so that an evaluation's large cache is not held
# through training (memory allocation is cheap there next to a decode)
KEPT_CACHES = {"cuda": 2}
RECOMPILE_LIMIT = 64
# steps between "all rows finished?" checks: a host sync on an accelerator, free on the CPU
CHECK_EVERY = {"cuda": 8}
# a prefix session matches each prompt only against the kept rows that go on as it does for HEAD tokens
# after the rows' common prefix
HEAD = 16


def _config_dims(config) -> tuple[int, int]:
    """(key/value heads, head dim) of a decoder config."""
    config = config.get_text_config(decoder=True)
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return heads, head_dim


# CUDA-graph decodes of different threads (an evaluation in the learner's, async generation's own) one
# at a time: before torch 2.13 nothing kept one thread's graph capture from overlapping another's
CUDA_GRAPH_DECODES = threading.Lock()


def cuda_graphs_in_this_thread() -> None:
    """Give the calling thread its own CUDA-graph trees state. Before torch 2.13 inductor kept that
    state only in the thread that imported it, and a graph compiled with CUDA graphs that ran in any
    other thread (async generation's) failed a bare `assert` (pytorch#123177). Later versions set it up
    as here on their own, and serialise captures across threads, as `CUDA_GRAPH_DECODES` does."""
    from torch._inductor import cudagraph_trees

    if torch._C._is_key_in_tls("tree_manager_containers"):
        return
    local = cudagraph_trees.local
    local.tree_manager_containers, local.tree_manager_locks = {}, defaultdict(threading.Lock)
    torch._C._stash_obj_in_tls("tree_manager_containers", local.tree_manager_containers)
    torch._C._stash_obj_in_tls("tree_manager_locks", local.tree_manager_locks)


def plain_static(cache) -> bool:
    """Whether every layer of `cache` is a plain static one (not sliding-window, not hybrid): its rows'
    keys and values can be copied between caches column for column."""
    from transformers.cache_utils import StaticLayer

    return all(type(layer) is StaticLayer for layer in cache.layers)


@dataclass
class _Start:
    """Where a decode starts: the cache with each row's context in it but the last token, the attention
    mask over its columns `[rows, length]`, the last tokens and their positions `[rows, 1]`, the column
    the first step writes (`first`), and each row's context with the columns its tokens sit in (None:
    each context's, contiguous, ending at `first`)."""

    cache: object
    mask: Tensor
    token: Tensor
    position: Tensor
    first: int
    contexts: list[list[int]]
    columns: list[list[int]] | None


@dataclass
class _Kept:
    """A prefix session's cache after a decode: `written` columns, each row's tokens in it (in context
    order) and their columns, and the weights' version they were computed with."""

    cache: object
    written: int
    tokens: list[list[int]]
    columns: list[list[int]]
    weights: int


@dataclass
class _Session:
    """A prefix session's kept caches: one per chunk of the last generate call (`previous`), from which
    the chunks of this one continue, and this call's so far (`current`)."""

    previous: list[_Kept]
    current: list[_Kept]

    def next_call(self) -> None:
        self.previous, self.current = self.current, []


def longest_shared_prefixes(contexts: list[list[int]], rows: list[list[int]]) -> list[tuple[int, int]]:
    """For each context, (the first of `rows` sharing the longest prefix with it, that length), over all
    but the context's last token (the first decode step feeds it). All rows begin with a common prefix
    (a chat template's preamble, a shared system prompt) of P tokens; where a context begins with it and
    some row goes on with the context's next HEAD tokens, that row beats every row that does not, so only
    those rows are compared (in an episode, its prompt's own k rows): O(rows x k x length), not
    O(rows^2 x length), integer comparisons in numpy."""
    import numpy as np

    longest = max(len(r) for r in rows)
    table = np.full((len(rows), longest), -1, dtype=np.int64)
    for i, tokens in enumerate(rows):
        table[i, : len(tokens)] = tokens
    shortest = min(len(r) for r in rows)
    common = int(np.cumprod((table[:, :shortest] == table[0, :shortest]).all(axis=0)).sum())
    by_head = defaultdict(list)
    for i, tokens in enumerate(rows):
        by_head[tuple(tokens[common:common + HEAD])].append(i)
    everything = np.arange(len(rows))
    out = []
    for context in contexts:
        width = max(min(longest, len(context) - 1), 0)
        narrows = width >= common + HEAD and list(context[:common]) == rows[0][:common]
        same_head = by_head.get(tuple(context[common:common + HEAD])) if narrows else None
        candidates = np.asarray(same_head) if same_head else everything
        same = np.cumprod(table[candidates, :width] == np.asarray(context[:width], dtype=np.int64), axis=1).sum(axis=1)
        out.append((int(candidates[int(same.argmax())]), int(same.max())))
    return out


class StaticDecoder:
    """Samples continuations of token-id prompts on a reused static KV cache.

    `compile`: "auto" compiles the one-token decode forward when the model is on CUDA, True always
    (on CPU that is inductor C++ code: slow to build, see tests), False never.
    """

    def __init__(self, model, compile: bool | str = "auto"):
        if compile not in ("auto", True, False):
            raise ValueError(f"compile must be 'auto', True or False, got compile={compile!r}")
        self.model = model
        first = next(model.parameters())
        self.device, self.dtype = first.device, first.dtype
        self.compiled = compile is True or (compile == "auto" and self.device.type == "cuda")
        self._caches: dict[int, tuple] = {}  # rows -> (StaticCache, length)
        self._local = threading.local()  # .session: this thread's prefix session (`prefix_session`)
        self._plain: bool | None = None  # whether every cache layer is a plain static one (`prefix_session`)
        self.kept = KEPT_CACHES.get(self.device.type, 1)
        self.cache_name = cache_name()  # read here, not in the compiled graph
        self._step = self._forward
        if self.compiled:
            # one compiled graph per model, dtype and (rows, length bucket): a run has a few models and
            # shapes, more than dynamo's default 8 per function, past which it would run eager
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
            self._step = torch.compile(self._forward, mode=COMPILE_MODES.get(self.device.type), fullgraph=True,
                                       dynamic=False)

    @property
    def cuda_graphs(self) -> bool:
        """Whether the decode step runs as CUDA graphs (compiled, "reduce-overhead", on CUDA)."""
        return self.compiled and self.device.type == "cuda"

    def _forward(self, ids: Tensor, positions: Tensor, mask: Tensor, cache) -> Tensor:
        """Next-token logits `[rows, V]` in fp32 after feeding `ids` `[rows, 1]`."""
        out = self.model(input_ids=ids, position_ids=positions, attention_mask=mask, **{self.cache_name: cache},
                         use_cache=True)
        return out.logits[:, -1].float()

    def cache(self, rows: int, length: int, private: bool = False):
        """(cache, length): a zeroed static cache for `rows` x `length` positions, `length` rounded up to
        LENGTH_BUCKET: the one from an earlier call when its shape is the same, else a new one; `private`:
        always a new one, kept by nobody else (a prefix session's, which outlives the call). (Sliding-
        window layers hold at most their window; `length` is what the attention mask spans.)"""
        from transformers import StaticCache

        bucket = LENGTH_BUCKET[self.compiled]
        length = -(-length // bucket) * bucket
        if not private:
            cache, kept = self._caches.get(rows, (None, 0))
            if cache is not None and kept == length:
                cache.reset()
                return cache, length
            self._caches.pop(rows, None)
            while len(self._caches) >= self.kept:  # drop the oldest before allocating
                self._caches.pop(next(iter(self._caches)))
        cache = StaticCache(config=self.model.config, max_cache_len=length)
        heads, head_dim = _config_dims(self.model.config)
        cache.early_initialization(rows, heads, head_dim, self.dtype, self.device)
        if not private:
            self._caches[rows] = cache, length
        return cache, length

    @contextmanager
    def prefix_session(self):
        """Within it, each decode of this thread continues every prompt from the keys and values that the
        session's previous decode left for its longest shared prefix, and prefills only the rest: the next
        turn of a multi-turn episode prefills the environment's answer, not the whole conversation again.
        Outside a session nothing is kept between calls. Off (each call starts afresh) where the decode step
        is compiled (its graphs are recorded on fixed cache tensors) or a layer is not a plain static one
        (sliding-window, hybrid); kept keys and values of weights that changed since are not used."""
        if self._plain is None:
            self._plain = plain_static(self.cache(1, 1, private=True)[0])
        if self.compiled or not self._plain or getattr(self._local, "session", None) is not None:
            yield
            return
        self._local.session = _Session([], [])
        try:
            yield
        finally:
            self._local.session = None

    def next_call(self) -> None:
        """A new generate call begins (its chunks are decoded one by one): they continue from the chunks of
        the call before, not from each other."""
        session = getattr(self._local, "session", None)
        if session is not None:
            session.next_call()

    def _prefill(self, ids: Tensor, mask: Tensor, positions: Tensor, n: int, cache, full_mask: Tensor) -> None:
        """Run the prompts' tokens but the last into `cache` (rows = prompts x n, prompt-major)."""
        width = ids.shape[1] - 1
        if width < 1:
            return
        shareable = n > 1 and plain_static(cache)
        if not shareable:  # n == 1, or sliding-window / hybrid layers: prefill every row into the cache
            self.model(input_ids=ids[:, :width].repeat_interleave(n, 0), attention_mask=full_mask,
                       position_ids=positions[:, :width].repeat_interleave(n, 0), **cache_arg(cache),
                       use_cache=True, logits_to_keep=1)
            return
        # each prompt once, then its keys/values broadcast into its n rows
        prompts = ids.shape[0]
        dynamic = returned_cache(self.model(input_ids=ids[:, :width], attention_mask=mask[:, :width],
                                            position_ids=positions[:, :width], use_cache=True, logits_to_keep=1))
        for target, source in zip(cache.layers, dynamic.layers):
            for dst, src in ((target.keys, source.keys), (target.values, source.values)):
                dst.view(prompts, n, *dst.shape[1:])[:, :, :, :width].copy_(src[:, None])
            target.cumulative_length.fill_(width)

    @torch.no_grad()
    def decode(self, prompts: list[list[int]], n: int, max_new_tokens: int, process: Callable[[Tensor], Tensor],
               pad_id: int, eos_id: int | None, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """`_decode` in the model's own dtype: under an autocast (evaluating fp32 weights in bf16) the
        keys and values would come out in another dtype than the static cache holds."""
        if self.cuda_graphs:
            cuda_graphs_in_this_thread()
        with CUDA_GRAPH_DECODES if self.cuda_graphs else nullcontext(), torch.autocast(self.device.type, enabled=False):
            return self._decode(prompts, n, max_new_tokens, process, pad_id, eos_id, generator)

    def _decode(self, prompts: list[list[int]], n: int, max_new_tokens: int, process: Callable[[Tensor], Tensor],
               pad_id: int, eos_id: int | None, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """(tokens, behaviour log-probs), both `[len(prompts) * n, steps]` on the model's device, rows
        grouped by prompt. `process` maps fp32 logits `[rows, V]` to the sampling distribution's logits;
        tokens are drawn from its softmax and scored by its log-softmax. A row that produced `eos_id` emits
        `pad_id` after it; `steps` < `max_new_tokens` when every row finished early."""
        session = getattr(self._local, "session", None)
        # read before the decode: the keys and values it leaves are of these weights
        weights = self._weights_version() if session is not None else None
        kept = [k for k in session.previous if k.weights == weights] if session is not None else []
        start = self._resumed_start([p for p in prompts for _ in range(n)], kept, max_new_tokens, pad_id) if kept else None
        if start is None:
            start = self._fresh_start(prompts, n, max_new_tokens, pad_id, private=session is not None)
        tokens, logps = self._sample(start, max_new_tokens, process, pad_id, eos_id, generator)
        if session is not None:
            session.current.append(self._kept_after(start, tokens, eos_id, weights))
        return tokens, logps

    def _fresh_start(self, prompts: list[list[int]], n: int, max_new_tokens: int, pad_id: int,
                     private: bool = False) -> _Start:
        """Every prompt prefilled from its first token (once, shared by its n rows), left-padded."""
        batch = pad_batch(prompts, [[] for _ in prompts], pad_id, side="left")  # generation continues at the right
        ids, mask, positions = (x.to(self.device) for x in (batch.input_ids, batch.attention_mask, batch.position_ids))
        rows, width = len(prompts) * n, ids.shape[1]
        cache, length = self.cache(rows, width + max_new_tokens, private)
        # full-length mask: the prompt's padding, then every later position (the causal mask hides the future)
        full_mask = torch.ones(rows, length, dtype=torch.bool, device=self.device)
        full_mask[:, :width] = mask.repeat_interleave(n, 0).bool()
        self._prefill(ids, mask, positions, n, cache, full_mask)
        return _Start(cache, full_mask, ids[:, -1:].repeat_interleave(n, 0), positions[:, -1:].repeat_interleave(n, 0),
                      width - 1, [p for p in prompts for _ in range(n)], None)

    def _resumed_start(self, contexts: list[list[int]], kept: list[_Kept], max_new_tokens: int,
                       pad_id: int) -> _Start | None:
        """Each row continued from the kept row (of any of `kept`) whose tokens share the longest prefix with
        its context: those keys and values are copied, the rest of the context is prefilled (a segment, each
        row's part right-aligned, its padding masked), as a multi-turn episode's next turn needs only the
        environment's answer prefilled. None (start afresh) where nothing is shared or the holes of masked
        columns would make the cache more than twice the longest context (`longest_shared_prefixes`)."""

        rows_of = [(part, r) for part in kept for r in range(len(part.tokens))]
        matches = longest_shared_prefixes(contexts, [part.tokens[r] for part, r in rows_of])
        source, shared = [rows_of[best] for best, _ in matches], [n for _, n in matches]
        if not any(shared):
            return None
        written = max(part.written for (part, _), s in zip(source, shared) if s)
        segment = max(len(c) - s for c, s in zip(contexts, shared)) - 1  # [rows, segment] prefilled
        if written + segment > 2 * max(len(c) for c in contexts):
            return None
        rows = len(contexts)
        cache, length = self.cache(rows, written + segment + max_new_tokens, private=True)
        for target in cache.layers:
            target.cumulative_length.fill_(written)
        for part in {id(part): part for (part, _), s in zip(source, shared) if s}.values():
            into = [j for j, ((p, _), s) in enumerate(zip(source, shared)) if s and p is part]
            index = torch.tensor([source[j][1] for j in into], device=self.device)
            into = torch.tensor(into, device=self.device)
            for target, old in zip(cache.layers, part.cache.layers):
                for dst, src in ((target.keys, old.keys), (target.values, old.values)):
                    dst[into, :, : part.written] = src[:, :, : part.written].index_select(0, index)
        full_mask = torch.zeros(rows, length, dtype=torch.bool, device=self.device)
        full_mask[:, written + segment:] = True
        ids = torch.full((rows, max(segment, 1)), pad_id, dtype=torch.long)
        positions = torch.zeros((rows, max(segment, 1)), dtype=torch.long)
        columns = []
        for j, (context, s) in enumerate(zip(contexts, shared)):
            rest = context[s:-1]  # prefilled in the segment; context[-1] comes with the first decode step
            first = written + segment - len(rest)
            part, r = source[j]
            reused = part.columns[r][:s]
            full_mask[j, reused] = True
            full_mask[j, first : written + segment] = True
            ids[j, segment - len(rest) : segment] = torch.tensor(rest, dtype=torch.long)
            positions[j, segment - len(rest) : segment] = torch.arange(s, len(context) - 1)
            columns.append(reused + list(range(first, written + segment)) + [written + segment])
        if segment > 0:
            self.model(input_ids=ids.to(self.device), attention_mask=full_mask, position_ids=positions.to(self.device),
                       **cache_arg(cache), use_cache=True, logits_to_keep=1)
        token = torch.tensor([[c[-1]] for c in contexts], device=self.device)
        position = torch.tensor([[len(c) - 1] for c in contexts], device=self.device)
        return _Start(cache, full_mask, token, position, written + segment, contexts, columns)

    def _sample(self, start: _Start, max_new_tokens: int, process: Callable[[Tensor], Tensor], pad_id: int,
                eos_id: int | None, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        """The decode loop from `start`: (tokens, log-probs) `[rows, steps]`."""
        cache, full_mask, token, position = start.cache, start.mask, start.token, start.position
        rows = token.shape[0]
        tokens = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=self.device)
        logps = torch.zeros(rows, max_new_tokens, device=self.device)
        done = torch.zeros(rows, dtype=torch.bool, device=self.device)
        steps, check_every = max_new_tokens, CHECK_EVERY.get(self.device.type, 1)
        for t in range(max_new_tokens):
            if self.cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()
            scores = process(self._step(token, position, full_mask, cache))
            nxt = torch.multinomial(scores.softmax(-1), 1, generator=generator).squeeze(1)
            nxt = nxt.masked_fill(done, pad_id)
            tokens[:, t] = nxt
            logps[:, t] = torch.log_softmax(scores, -1).gather(-1, nxt[:, None]).squeeze(-1)
            if eos_id is not None:
                done |= nxt == eos_id
                if (t + 1) % check_every == 0 and t + 1 < max_new_tokens and bool(done.all()):
                    steps = t + 1
                    break
            token, position = nxt[:, None], position + 1
        return tokens[:, :steps], logps[:, :steps]

    def _kept_after(self, start: _Start, tokens: Tensor, eos_id: int | None, weights: int) -> _Kept:
        """What the cache holds once `start`'s decode drew `tokens`: each row's context, then the drawn
        tokens that were fed back (all but the last step's, and none after the row's EOS)."""
        steps = tokens.shape[1]
        kept_tokens, kept_columns = [], []
        columns_of = start.columns or [list(range(start.first + 1 - len(c), start.first + 1)) for c in start.contexts]
        for context, columns, drawn in zip(start.contexts, columns_of, tokens[:, : max(steps - 1, 0)].tolist()):
            if eos_id is not None and eos_id in drawn:
                drawn = drawn[: drawn.index(eos_id) + 1]
            kept_tokens.append(context + drawn)
            kept_columns.append(columns + list(range(start.first + 1, start.first + 1 + len(drawn))))
        return _Kept(start.cache, start.first + steps, kept_tokens, kept_columns, weights)

    def _weights_version(self) -> int:
        """Grows with every in-place change of the weights (an optimizer step, a `load_state_dict`): kept
        keys and values of older weights are not reused."""
        return sum(p._version for p in self.model.parameters())
