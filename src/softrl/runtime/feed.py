"""The data feed: which prompts are sampled online next, and what a learner step's batch holds
besides them (the offline and Monte-Carlo sources of the mix, from the store), as a `Batch`."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import softrl.objectives as registry
from softrl.config import ConfigError, RunConfig
from softrl.data import ExperienceStore, GroupSampler, MixtureSampler, Reads, ReplayBuffer, Snapshot, StoreError
from softrl.data.schema import TRAJECTORY_SCHEMA
from softrl.data.unmatched import unmatched_rows
from softrl.data.versions import hold, pinned
from softrl.models.loading import encode_episode, encode_prompt, encode_response, tokenizer_fingerprint
from softrl.tasks.base import Prompt, Task
from softrl.training.batch import (Batch, knows_behavior, make_batch, row_tokens, tokens_usable, too_long_row,
                                   unusable_row)

CHECKED_ROWS = 2_000  # rows of each pool checked before a run starts; the rest are checked when drawn
IN_MEMORY = ("online", "replay")  # the mix's sources that are not read from the store
REPLAY_STREAM = 7_919  # offsets the replay buffer's seed from the prompt sampler's
TEXTS = ("prompt_text", "response_text")  # what a row whose token ids a batch takes is drawn without


def draw_reads(source: str, fingerprint: str) -> Reads:
    """The columns a run's draw of `source` takes: all but the texts, which only rows whose token ids a
    batch cannot take (`tokens_usable`) need, and MC targets, which only the mc source trains on."""
    skipped = set(TEXTS) | ({"mc_targets"} if source != "mc" else set())
    return Reads(tuple(n for n in TRAJECTORY_SCHEMA.names if n not in skipped), TEXTS,
                 lambda row: not tokens_usable(row, fingerprint))


def draws_from_store(config: RunConfig) -> bool:
    """Whether the run's mix draws rows from the store (its snapshot is then held until it ends)."""
    return any(w > 0 for s, w in config.data.mix.items() if s not in IN_MEMORY)


def pinned_snapshot(config: RunConfig, store: ExperienceStore) -> Snapshot | None:
    """The snapshot `data.store_version` names; None where the run reads the newest."""
    if config.data.store_version is None:
        return None
    try:
        return pinned(store, config.data.store_version)
    except StoreError as e:
        raise ConfigError(f"data.store_version: {e}") from None


def drawable(source) -> int:
    """Rows a mixture source can give: a pool's rows, a group sampler's only where a prompt has a group
    (rows but no whole group of any prompt: known solutions, one a prompt)."""
    if isinstance(source, GroupSampler):
        return len(source.pool) if source.prompts else 0
    return len(source)


def copied(pool) -> str:
    """What a pool's log line says of its local copy (`data.pool_copy`), if it has one."""
    local = getattr(pool, "local", None)
    if local is None:
        return ""
    if local.given_up:
        return f" (no local copy: {local.given_up}; each draw asks the store)"
    return f" (their columns copied to local disk, {local.bytes / 2**20:,.0f} MiB)"


class DataFeed:
    """Built from the run's config, store, training task, Q0 (prompt id -> soft value at the run's
    beta) and tokenizer, and the model's number of token ids (`vocab_size`: stored rows' token ids
    are checked against it); its random state is checkpointed (`state_dict`). Every read is at one
    `snapshot` of the store: the one given (a resumed run's), `data.store_version`'s, or the newest;
    `hold_as`: the tag that holds it (`data.versions.hold`) where the mix draws from the store, until the
    run releases it."""

    def __init__(self, config: RunConfig, store: ExperienceStore, task: Task, q0: dict[str, float], tokenizer,
                 log: Callable[[str], None] = print, vocab_size: int | None = None, snapshot: Snapshot | None = None,
                 hold_as: str | None = None, positions: int = 0):
        self.config, self.store, self.task, self.q0, self.log = config, store, task, q0, log
        self.snapshot = snapshot or pinned_snapshot(config, store) or store.snapshot()
        self.reads_store = draws_from_store(config)
        if hold_as and self.reads_store:  # before its pools are built: a compaction meanwhile must keep it
            hold(store, self.snapshot, hold_as)
        self.vocab_size, self.positions = vocab_size, positions
        self.tokenizer, self.fingerprint = tokenizer, tokenizer_fingerprint(tokenizer)
        self.prompts = task.prompts()
        self.prompt_rng = random.Random(config.seed)
        self.partly_checked: set[str] = set()  # sources with rows not checked before the run: checked when drawn
        self.mixture = self._mixture()
        replay = config.data.replay
        self.replay = (ReplayBuffer(replay.size, replay.reuse, config.seed + REPLAY_STREAM)  # not the prompts' draws
                       if config.data.mix.get("replay", 0) > 0 else None)
        # the next step's stored rows, drawn in the background: (online rows they are for, the samplers'
        # random state before the draw, the draw)
        self._prefetched: tuple[int, dict, Future] | None = None
        self._background: ThreadPoolExecutor | None = None
        # the last batch's draw from the store: its own seconds, and those its step waited for it (a
        # prefetched draw that finished during the step before costs none)
        self.draw_seconds: dict[str, float] = {}

    def _mixture(self) -> MixtureSampler | None:
        """The non-online sources of the mix, drawn from the store (rows of the prompts with a Q0)."""
        cfg = self.config.data
        wanted = {s: w for s, w in cfg.mix.items() if s not in IN_MEMORY and w > 0}
        if not wanted:
            return None
        sources = {}
        snapshot = self.snapshot  # every pool from the same versions, whatever others commit meanwhile
        for source in wanted:
            filters = {"task": self.task.name}
            if source == "offline":
                filters.update(source=cfg.offline_sources, passed=True if cfg.offline_passed_only else None)
            elif source == "pts":  # the rollouts `softrl pts` sampled from prefixes, passed or not
                filters["source"] = "pts"
            pool = self.store.pool(snapshot, prompt_ids=list(self.q0), annotated=source == "mc",  # mc: `softrl pts`'s
                                   reads=draw_reads(source, self.fingerprint), copy=cfg.pool_copy, **filters)
            checked = pool.checked_rows(CHECKED_ROWS)
            self._check_behavior(source, checked, len(pool))
            if len(checked) < len(pool):
                self.partly_checked.add(source)
            sources[source] = pool
            if registry.get(cfg.objective_for(source).algorithm).min_group:
                sources[source] = GroupSampler(pool, self.config.sampling.samples_per_prompt, seed=self.config.seed)
            self.log(f"{source} pool: {len(pool)} trajectories{copied(pool)}")
            self._refuse_unusable(source, checked)
            if source == "offline":
                self._say_unmatched(len(pool))
        groupless = [name for name, src in sources.items() if len(getattr(src, "pool", src)) and not drawable(src)]
        online, usable = cfg.mix.get("online", 0) > 0, any(drawable(src) for src in sources.values())
        if groupless and (online or usable):
            self.log(f"warning: {self._no_groups(groupless[0])}; training on the other sources only")
        if not usable:
            where = f"{', '.join(wanted)} in {cfg.store}"
            if groupless and not online:
                raise ConfigError(f"{self._no_groups(groupless[0])}: add responses to it, or choose an objective "
                                  "without groups (spo, topr)")
            if not online:
                raise ConfigError(f"data.mix: no trajectories for {where} and no online share: import data "
                                  "(softrl data import), run softrl q0, or give online a weight")
            if not groupless:
                self.log(f"warning: no trajectories for {where}; training on online samples only")
            return None
        return MixtureSampler(sources, wanted, seed=self.config.seed)

    def _no_groups(self, source: str) -> str:
        """Why a source whose objective learns from groups gives nothing: no prompt has a whole group."""
        cfg, n = self.config.data, self.config.sampling.samples_per_prompt
        key = f"data.objectives.{source}" if source in cfg.objectives else "data.objective"
        algorithm = cfg.objective_for(source).algorithm
        return (f"{key}: {algorithm} learns from groups of sampling.samples_per_prompt = {n} responses to a "
                f"prompt (at least {registry.get(algorithm).min_group}), and no prompt of the {source} pool has {n}")

    def _refuse_unusable(self, source: str, rows: list[dict]) -> None:
        """Refused: a row the model cannot be fed (token ids outside its vocabulary, no prompt, longer than
        its positions)."""
        problem = unusable_row(rows, self.fingerprint, self.vocab_size, lambda t: encode_prompt(self.tokenizer, t))
        if not problem and (long := too_long_row(rows, self.positions, self.row_tokens, self.fingerprint)):
            row = rows[long[0]]
            problem = (f"row {row.get('id')!r} (prompt {row.get('prompt_id')!r}, source {row.get('source')!r}) is "
                       f"{long[1]:,} tokens long, over the model's {self.positions:,} positions")
        if problem:
            raise ConfigError(f"data.store: {source} pool of {self.store.root}: {problem}: this model cannot train "
                              "on it; import the rows into a new store with `softrl data import FILE --model MODEL`, "
                              "which checks them")

    def _say_unmatched(self, pool_size: int) -> None:
        """Stored rows of the offline sources that are not the task's prompts are said (and refused
        when the pool has no row at all)."""
        cfg = self.config.data
        ids, passed = [p.id for p in self.prompts if p.id in self.q0], True if cfg.offline_passed_only else None
        unmatched = unmatched_rows(self.store, cfg.offline_sources, self.task.name, ids, passed, snapshot=self.snapshot)
        everything = unmatched_rows(self.store, cfg.offline_sources, self.task.name, ids, passed, True, self.snapshot) \
            if not pool_size else None  # with the rows of the task's other prompts (another task.size or task.seed)
        if unmatched and not pool_size:  # rows meant for this task and none usable: not a run on nothing
            raise ConfigError(f"data.offline_sources: the offline pool would be empty: {everything}")
        if unmatched or everything:
            self.log(f"warning: offline pool: {unmatched or everything}")

    def _check_behavior(self, source: str, rows: list[dict], pool_size: int) -> None:
        """An objective that weighs rows by pi/mu skips rows without mu's log-probs: said, and refused
        when that is every row of the pool (`rows`: the pool's checked rows)."""
        options = self.config.data.objective_for(source)
        objective = registry.get(options.algorithm)
        if not rows or not objective.behavior(options):
            return
        unknown = sum(not knows_behavior(r) for r in rows)
        of = f" (of {len(rows):,} checked among {pool_size:,})" if len(rows) < pool_size else ""
        if unknown == len(rows) == pool_size and objective.behavior_every_row:  # a sample cannot tell "none"
            other = ", or is_correction=none" if hasattr(options, "is_correction") else ""
            raise ConfigError(f"data.mix: {options.algorithm} weighs {source} rows by pi/mu and none of the {len(rows)} "
                              f"{source} rows has its sampler's log-probs at temperature 1 (human or imported "
                              f"data): use spo, agro-off or topr{other}")
        if unknown:
            self.log(f"{source} pool: {options.algorithm}: the {unknown} rows{of} without their sampler's log-probs "
                     f"are {objective.without_behavior}")

    def next_prompts(self) -> list[Prompt]:
        return self.prompt_rng.sample(self.prompts, min(self.config.sampling.prompts_per_step, len(self.prompts)))

    def extra_rows(self, online_rows: int) -> list[dict]:
        """Rows of the store's sources in proportion to their weight against online's."""
        mix = self.config.data.mix
        if self.mixture is None:
            return []
        online_weight = mix.get("online", 0.0)
        if online_weight > 0:
            count = round(online_rows * sum(w for s, w in mix.items() if s not in IN_MEMORY) / online_weight)
        else:
            count = self.config.sampling.prompts_per_step * self.config.sampling.samples_per_prompt
        rows = self.mixture.sample(count) if count else []
        for source in self.partly_checked:
            self._refuse_unusable(source, [r for r in rows if r["mix_source"] == source])
        return rows

    def online_rows_per_step(self) -> int:
        """The online rows a step brings: its prompts (`next_prompts`) times the samples of each."""
        if not self.config.generates:
            return 0
        return min(self.config.sampling.prompts_per_step, len(self.prompts)) * self.config.sampling.samples_per_prompt

    def prefetch(self, online_rows: int | None = None) -> None:
        """Start drawing the next step's stored rows (`extra_rows`, for `online_rows` online rows, by default
        a step's) in the background: taking them from the store (on an object store, a request per row and
        column) then overlaps the learner step, evaluations and the next generation. The draw is made from
        the random state `batch` would draw from, so batches and checkpoints are the same with or without
        it. `batch` starts the next one itself."""
        if self.mixture is None or self._prefetched is not None:
            return
        online_rows = self.online_rows_per_step() if online_rows is None else online_rows
        if self._background is None:
            self._background = ThreadPoolExecutor(1, thread_name_prefix="softrl-prefetch")
        self._prefetched = (online_rows, self._sampler_state(), self._background.submit(self._timed_draw, online_rows))

    def _timed_draw(self, online_rows: int) -> tuple[list[dict], float]:
        started = time.perf_counter()
        return self.extra_rows(online_rows), time.perf_counter() - started

    def _stored_rows(self, online_rows: int) -> list[dict]:
        """The step's other sources' rows: the prefetched draw where it was for as many online rows (its
        error, if it failed, is this step's), else drawn now from the state before any prefetch. Sets
        `draw_seconds` where the mix draws from the store."""
        started = time.perf_counter()
        if self._prefetched is None:
            rows, took = self._timed_draw(online_rows)
        elif self._prefetched[0] == online_rows:
            rows, took = self._prefetched[2].result()
            self._prefetched = None
        else:
            before = self._prefetched[1]
            self._drop_prefetched()  # its draw is undone
            self._set_sampler_state(before)
            rows, took = self._timed_draw(online_rows)
        if self.mixture is not None:
            self.draw_seconds = {"time/store_draw": took, "time/store_wait": time.perf_counter() - started}
        return rows

    def _drop_prefetched(self) -> None:
        if self._prefetched is not None:
            self._prefetched[2].exception()  # finished, whatever it did
            self._prefetched = None

    def close(self) -> None:
        """Wait for a draw in flight (it reads the store) and stop the background thread."""
        self._drop_prefetched()
        if self._background is not None:
            self._background.shutdown(wait=True)
            self._background = None

    def batch(self, online: list[dict]) -> Batch:
        """A learner step's batch: the online rows and the other sources' share; the next step's share
        starts coming from the store meanwhile (`prefetch`)."""
        rows = online + self._stored_rows(len(online))
        if self.replay is not None:  # drawn before this step's rows join: a row is replayed only in later steps
            mix = self.config.data.mix
            rows += self.replay.draw(round(len(online) * mix["replay"] / mix["online"]))
            self.replay.add(online)
        self.prefetch()
        tok = self.tokenizer
        return make_batch(rows, self.fingerprint, tok.pad_token_id, lambda t: encode_prompt(tok, t),
                          lambda t: encode_response(tok, t), self.q0, lambda p, t: encode_episode(tok, p, t))

    def row_tokens(self, row: dict) -> tuple[list[int], list[int], list[bool]]:
        tok = self.tokenizer
        return row_tokens(row, self.fingerprint, lambda t: encode_prompt(tok, t), lambda t: encode_response(tok, t),
                          lambda p, t: encode_episode(tok, p, t))

    # --- checkpoints: the random state of prompt choice and of every source ---------------------
    def state_dict(self) -> dict:
        """The random state between steps: a prefetched draw not yet used is not counted (a run resumed
        from it draws that step's rows again)."""
        samplers = self._prefetched[1] if self._prefetched is not None else self._sampler_state()
        return {"samplers": samplers, "prompts": self.prompt_rng.getstate(),
                "replay": None if self.replay is None else self.replay.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self._drop_prefetched()  # drawn from the state being replaced
        self.prompt_rng.setstate(state["prompts"])
        self._set_sampler_state(state["samplers"])
        if self.replay is not None and state.get("replay") is not None:
            self.replay.load_state_dict(state["replay"])

    def _sampler_state(self) -> dict:
        if self.mixture is None:
            return {}
        return {"mixture": self.mixture.rng.getstate(),
                **{n: s.rng.getstate() for n, s in self.mixture.sources.items() if hasattr(s, "rng")}}

    def _set_sampler_state(self, samplers: dict) -> None:
        if self.mixture is None:
            return
        self.mixture.rng.setstate(samplers["mixture"])
        for name, src in self.mixture.sources.items():
            if name in samplers and hasattr(src, "rng"):
                src.rng.setstate(samplers[name])
