"""`softrl bench study code` and `softrl bench study feedback`: the SPO paper's central comparison on code with
headroom, held-out combinations the reference rarely solves, in one turn (tinycode-loops) and in episodes
with the shown tests' feedback between turns (tinycode-feedback, issue 50).

Arms, each generating the same samples per learner step (`prompts x samples_per_prompt`; a half arm's
batch is twice that, its other half from the store; an arm from logged data generates nothing):
- code: spo-online; spo-half (the other half: the reference's passed samples); spo-human (the other half:
  the problems' known, human-written solutions); ppo and grpo, online; cispo-half: of the off-policy
  baselines (GRPO with TIS, CISPO, TOPR) the one with the best pass@1 at lag 1 in `bench frontier`, on
  spo-half's data.
- feedback: spo-online, spo-half, ppo, grpo and grpo-tis-half (GRPO with TIS, its other half the
  reference's episodes passed or not, since GRPO needs whole groups; online alone, in the sync runtime,
  its weights are 1); then spo, agro-off, topr and kl-pg offline from logged traces of another agent
  (`logged_traces`: its conversations, rewards and no log-probs, imported as `softrl data import` reads a
  chat file); last, spo-one-turn and ppo-one-turn: the same problems answered in one turn, no feedback,
  trained and evaluated so, for ONE_TURN_STEPS times the steps: the single-turn result at equal generated
  tokens (their pool's Q0 is from the reference's single answers).

Each arm's learning rate is tuned on a tuning seed (the best final pass@1 over `lrs`, extended by up to
`extend` points of the 1-3-10 ladder past an edge where the best lies) and reported on seeds 0..N-1. The
study's pool (a store with the training prompts' Q0 from the reference's samples, and the other sources'
rows) is made once; every run trains on its own copy of it (`softrl_bench.frontier.run`: several at once
with `jobs`), and its outcome with every evaluation is kept as one JSON line in `kept`
(`bench.frontier_runs`), so a study resumes on any machine from that file. Arms are listed cheapest first
(no generation, then online), so that a study cut short has whole arms.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from softrl_bench import reference
from softrl_bench.frontier_runs import outcome
from softrl_bench.learning import base_overrides, best_lr, final, judged, grown_lrs, settings_of, slug, with_base
from softrl.config import ConfigError, RunConfig, TaskConfig, config_from

TUNE_SEED = 100
SPO = {"algorithm": "spo"}
HALF = {"online": 0.5, "offline": 0.5}
OFFLINE = {"offline": 1.0}


@dataclass(frozen=True)
class Arm:
    objective: dict
    mix: dict
    sources: tuple[str, ...] = ("reference",)  # where the offline part comes from
    passed_only: bool = True  # of those rows, only the passed ones (the half arms); logged data: all, graded
    max_turns: int | None = None  # episodes of at most this many policy turns (None: the task's); its own pool
    steps_factor: float = 1.0  # its learner steps, times the study's: equal generated tokens at fewer turns


PAPER_MARGIN = 0.03  # the paper's claim: SPO's pass@10 at least PPO's + 0.03


def distinct_per_solved(curve_: list[dict]) -> float:
    return curve_[-1]["distinct_correct_per_solved"]


def distinct_per_problem(curve_: list[dict]) -> float:
    """Distinct correct programs per held-out problem at the end (the issue's diversity): the count per
    solved problem times the share solved, which with 10 samples a problem is pass@10. Per solved problem
    alone would rate an arm lower for newly solving a hard problem once."""
    return curve_[-1]["distinct_correct_per_solved"] * curve_[-1]["pass@10"]


DIVERSITY = {"distinct per problem": distinct_per_problem, "distinct per solved": distinct_per_solved}


def diversity(runs: dict[str, dict[int, list[dict]]]) -> dict[str, dict[str, list[float]]]:
    """arm -> each `DIVERSITY` measure -> its final value per seed."""
    return {arm: {m: [f(c) for c in by_seed.values()] for m, f in DIVERSITY.items()} for arm, by_seed in runs.items()}


def human_rows(task, s: "Settings") -> list:
    """The known solutions of the training prompts as source "human", each checked against its tests."""
    from softrl.data.io import task_solutions

    human = task_solutions(task, "human")
    wrong = [r for r in human if not r.passed]
    if wrong:
        raise ValueError(f"{task.name}: a known solution of prompt {wrong[0].prompt_id} fails its own tests")
    return human


LOGGED_PER_PROMPT = 4  # a group of samples_per_prompt: what AGRO and KL-PG compare
LOGGED_ATTEMPTS = 50  # episodes drawn at most for a prompt's distinct ones
LOGGED_P_CORRECT = 0.35  # the bootstrap's own share of right programs: the same agent's style, on these prompts


def logged_traces(task, out: Path, seed: int = 0) -> Path:
    """Another agent's logs of the training prompts as a chat file (`messages` and `reward`, no log-probs):
    an agent that knows each problem's solutions writes a right program with probability
    LOGGED_P_CORRECT, else a plausible wrong one, reads the shown tests' feedback and revises
    (`feedback_code.synthetic_episode`, the bootstrap's recipe, on prompts the bootstrap never saw),
    LOGGED_PER_PROMPT distinct episodes a prompt (drawn again where one repeats). Each episode's reward
    is its last program graded on every test, by the task."""
    from softrl.bootstrap import EPISODE_TURNS
    from softrl.data.chat import prompt_messages
    from softrl.tasks.feedback_code import synthetic_episode
    from softrl.tasks.loopcode import plausible_wrong

    rng = random.Random(seed)
    episodes = []
    for p in task.prompts():
        distinct: dict[str, list[dict]] = {}  # a repeat would be one stored row, leaving the prompt short of a group
        for _ in range(LOGGED_ATTEMPTS):
            turns = synthetic_episode(p, p.meta["solutions"], plausible_wrong(p), rng, EPISODE_TURNS[task.name],
                                      LOGGED_P_CORRECT)
            distinct.setdefault(json.dumps(turns), turns)
            if len(distinct) == LOGGED_PER_PROMPT:
                break
        episodes += [(p, turns) for turns in distinct.values()]
    grades = task.grade_many([(p, turns[-1]["content"]) for p, turns in episodes])
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        for (p, turns), g in zip(episodes, grades):
            f.write(json.dumps({"messages": prompt_messages(p.text) + turns, "reward": g.reward, "passed": g.passed,
                                "prompt_id": p.id, "task": task.name}) + "\n")
    return out


def logged_rows(task, s: "Settings") -> list:
    """`logged_traces` read back as `softrl data import --source logged` reads a chat file."""
    from softrl.data.io import read_trajectories, task_prompt_ids

    return read_trajectories(logged_traces(task, s.where / "logged-traces.jsonl"), "logged", task.name,
                             task_prompt_ids(task))


@dataclass(frozen=True)
class Study:
    name: str
    task: str
    arms: dict[str, Arm]
    claims: list  # (claim, a, b, compared, key, expected, margin)
    other_rows: Callable  # (task, Settings) -> the pool's rows beside the reference's
    defaults: dict = field(default_factory=dict)  # Settings' values where the study's differ
    pool_recipe: dict = field(default_factory=dict)  # what else the pool's rows depend on (`prepare_pool` compares it)


CODE = Study("code", "tinycode-loops", {
    "spo-online": Arm(SPO, {"online": 1.0}),
    "spo-half": Arm(SPO, HALF),
    "spo-human": Arm(SPO, HALF, ("human",)),
    "ppo": Arm({"algorithm": "ppo"}, {"online": 1.0}),
    "grpo": Arm({"algorithm": "grpo"}, {"online": 1.0}),
    "cispo-half": Arm({"algorithm": "cispo"}, HALF),
}, [
    ("SPO's pass@10 beats PPO's by 0.03 (online)", "spo-online", "ppo", "final pass@10", "pass@10", "higher",
     PAPER_MARGIN),
    ("SPO's pass@10 beats PPO's by 0.03 (half-online)", "spo-half", "ppo", "final pass@10", "pass@10", "higher",
     PAPER_MARGIN),
    ("SPO's pass@10 beats GRPO's", "spo-online", "grpo", "final pass@10", "pass@10", "higher", 0.0),
    ("SPO's pass@1 is below PPO's (the paper's trade)", "spo-online", "ppo", "final pass@1", "pass@1",
     "lower|within 2 SE", 0.0),
    ("learning from the known solutions raises pass@1 at the same generation budget", "spo-human", "spo-online",
     "final pass@1", "pass@1", "higher", 0.0),
    ("the known solutions beat the reference's own passed samples as offline data", "spo-human", "spo-half",
     "final pass@1", "pass@1", "higher", 0.0),
    ("SPO keeps more distinct correct programs than PPO", "spo-online", "ppo", "distinct per problem",
     "distinct per problem", "higher", 0.0),
    ("SPO keeps more distinct correct programs than PPO", "spo-online", "ppo", "distinct per solved",
     "distinct per solved", "higher", 0.0),
    ("half-online SPO matches the best off-policy baseline on the same data (pass@1)", "spo-half", "cispo-half",
     "final pass@1", "pass@1", "higher|within 2 SE", 0.0),
    ("half-online SPO matches the best off-policy baseline on the same data (pass@10)", "spo-half", "cispo-half",
     "final pass@10", "pass@10", "higher|within 2 SE", 0.0),
], human_rows)

LOGGED = ("logged",)
# an episode's policy tokens over a single answer's: PPO at 3e-5, seed 0, generated 251,241 policy tokens in 800
# episodes (314 each), 2.77 turns an episode at its last evaluation (311.6 tokens): about 112 tokens a turn.
# A one-turn run's measured `tokens` say how close this comes.
ONE_TURN_STEPS = 2.8
FEEDBACK = Study("feedback", "tinycode-feedback", {
    "spo-logged": Arm(SPO, OFFLINE, LOGGED, passed_only=False),
    "agro-logged": Arm({"algorithm": "agro-off"}, OFFLINE, LOGGED, passed_only=False),
    "topr-logged": Arm({"algorithm": "topr"}, OFFLINE, LOGGED, passed_only=False),
    "kl-pg-logged": Arm({"algorithm": "kl-pg"}, OFFLINE, LOGGED, passed_only=False),
    "spo-online": Arm(SPO, {"online": 1.0}),
    "spo-half": Arm(SPO, HALF),
    # GRPO learns from groups of samples_per_prompt responses to a prompt, and the reference's passed episodes
    # give almost none (its offline half was empty, 2026-11-29): this arm's offline half is all of them, graded
    "grpo-tis-half": Arm({"algorithm": "grpo", "is_correction": "token_truncate"}, HALF, passed_only=False),
    "grpo": Arm({"algorithm": "grpo"}, {"online": 1.0}),
    "ppo": Arm({"algorithm": "ppo"}, {"online": 1.0}),
    # after the arms above, so that the study's report seeds come first
    "spo-one-turn": Arm(SPO, {"online": 1.0}, max_turns=1, steps_factor=ONE_TURN_STEPS),
    "ppo-one-turn": Arm({"algorithm": "ppo"}, {"online": 1.0}, max_turns=1, steps_factor=ONE_TURN_STEPS),
}, [
    ("SPO's pass@10 beats PPO's (online, episodes)", "spo-online", "ppo", "final pass@10", "pass@10", "higher", 0.0),
    ("SPO's pass@10 beats GRPO's (online, episodes)", "spo-online", "grpo", "final pass@10", "pass@10", "higher", 0.0),
    ("half-online SPO matches GRPO with TIS on the reference's episodes (pass@1)", "spo-half", "grpo-tis-half",
     "final pass@1", "pass@1", "higher|within 2 SE", 0.0),
    ("logged traces without log-probs raise pass@1 over online SPO", "spo-logged", "spo-online", "final pass@1",
     "pass@1", "higher", 0.0),
    ("SPO learns from logged traces as well as AGRO", "spo-logged", "agro-logged", "final pass@1", "pass@1",
     "higher|within 2 SE", 0.0),
    ("SPO learns from logged traces as well as TOPR (no log-probs: its positives alone)", "spo-logged", "topr-logged",
     "final pass@1", "pass@1", "higher|within 2 SE", 0.0),
    ("SPO learns from logged traces as well as KL-PG", "spo-logged", "kl-pg-logged", "final pass@1", "pass@1",
     "higher|within 2 SE", 0.0),
    ("SPO keeps more distinct correct programs than PPO", "spo-online", "ppo", "distinct per problem",
     "distinct per problem", "higher", 0.0),
    # each arm as it trained and is used: with feedback at evaluation (its last turn) against one answer. The
    # reference alone gains there (0.056 against 0.022), so the first-turn claims compare what training did
    ("episodes with feedback beat one turn at equal generated tokens, each evaluated as it trained (SPO)",
     "spo-online", "spo-one-turn", "final pass@1", "pass@1", "higher", 0.0),
    ("episodes with feedback beat one turn at equal generated tokens, each evaluated as it trained (PPO)",
     "ppo", "ppo-one-turn", "final pass@1", "pass@1", "higher", 0.0),
    ("training in episodes makes the first answer as good as training on single answers (SPO)", "spo-online",
     "spo-one-turn", "final first-turn pass@1", "first_turn_pass@1", "higher|within 2 SE", 0.0),
    ("training in episodes makes the first answer as good as training on single answers (PPO)", "ppo",
     "ppo-one-turn", "final first-turn pass@1", "first_turn_pass@1", "higher|within 2 SE", 0.0),
], logged_rows, {"steps": 50, "task_size": 200, "eval_size": 50},
    {"logged": {"per_prompt": LOGGED_PER_PROMPT, "p_correct": LOGGED_P_CORRECT, "distinct": True}})

STUDIES = {s.name: s for s in (CODE, FEEDBACK)}


@dataclass(frozen=True)
class Settings:
    root: Path
    study: Study = CODE
    steps: int = 100
    prompts: int = 4
    samples_per_prompt: int = 4
    lrs: tuple[float, ...] = (3e-5, 1e-4, 3e-4)  # online SPO collapsed at 3e-4 already (pass@1 0.02)
    extend: int = 1  # ladder points each arm's grid may grow past the edge its best lies on
    seeds: int = 4
    eval_size: int = 100
    eval_every: int = 50
    eval_samples: int = 10  # so pass@10 is the share of problems solved (`distinct_per_problem`)
    task_size: int = 300
    extra: dict | None = None
    kept: Path | None = None  # the finished runs' outcomes, one JSON line each

    @property
    def task(self) -> str:
        return self.study.task

    @property
    def where(self) -> Path:
        return self.root / slug(self.task)

    @property
    def pool(self) -> Path:
        return self.where / "pool"

    def pool_of(self, config: RunConfig) -> Path:
        """The pool a run copies: its Q0 is of episodes as long as the run's (`Arm.max_turns`)."""
        turns = config.task.max_turns
        return self.pool if turns == TASK_TURNS else self.where / f"pool-{turns}-turns"


# what the pool's rows depend on: a pool made with other values is refused, not silently reused
POOL_KEYS = ("model.path", "model.weights", "task.name", "task.size", "task.seed", "task.options", "q0.k", "beta",
             "seed")
TASK_TURNS = TaskConfig.model_fields["max_turns"].default  # an arm's episodes unless it says otherwise
QUICK = dict(steps=1, lrs=(1e-4, 1e-3), extend=0, seeds=2, eval_size=2, eval_every=1, eval_samples=10, task_size=6)


def reference_dir(s: Settings) -> Path:
    """The bootstrap reference's folder, named by its recipe's key (installed or built by `install_reference`): a
    run names it rather than "bootstrap", so outcomes kept from another recipe's reference are refused."""
    return reference.reference_dir(s.task)


def kept_reference(s: Settings) -> Path | None:
    """Where the reference that the kept outcomes were made with is kept, beside them."""
    return s.kept.parent / f"study-{s.study.name}-reference" if s.kept is not None else None


def install_reference(s: Settings) -> Path:
    """The runs' reference in the cache (`reference_dir`), the one kept beside the kept outcomes
    (`softrl_bench.reference.install`)."""
    return reference.install(s.task, kept_reference(s), s.kept)


def run_config(s: Settings, arm: str, lr: float, seed: int) -> RunConfig:
    """One run, RUNS/TASK/STUDY/ARM-lrLR-sSEED, on its own copy of the pool beside it."""
    a = s.study.arms[arm]
    overrides = base_overrides(s.task, seed, max(1, round(s.steps * a.steps_factor)), lr, s.prompts,
                               s.samples_per_prompt, s.eval_size, s.eval_every, s.eval_samples, s.extra)
    overrides.update({
        "model.path": str(reference_dir(s)),
        "name": (name := f"{arm}-lr{lr:g}-s{seed}"), "out_dir": str(s.where / s.study.name),
        "data.store": str(s.where / f"{s.study.name}-stores" / name),
        "task.size": s.task_size, "data.mix": a.mix, "data.objective": a.objective,
        "data.offline_sources": list(a.sources), "data.offline_passed_only": a.passed_only,
        # on this task's long samples (200 new tokens, prompts of 130-180) the static cache measured 1.2-1.65x
        # (16 rows) to 3.8-4.0x (250 rows, the evaluation's) hf's speed: docs/MODELS.md
        "sampling.backend": "static",
    })
    merged = with_base(overrides, s.extra)
    if a.max_turns is not None:  # over a --base file's too: the arm is what it says
        merged = {**merged, "task.max_turns": a.max_turns}
    return config_from(merged)


def arm_grid(s: Settings, arm: str) -> tuple[list[float], dict[float, float] | None]:
    """An arm's tuning grid as far as its finished runs decide it (`grown_lrs`), and their final pass@1 by lr
    once all finished."""
    def score(lr: float) -> float | None:
        c = curve(s, run_config(s, arm, lr, TUNE_SEED))
        return c[-1]["pass@1"] if c else None
    return grown_lrs(s.lrs, s.extend, score)


def tuning_plan(s: Settings, arms: list[str]) -> list[RunConfig]:
    """The tuning runs every arm's grid needs so far; finished ones included (to be skipped). Rerun it after
    they finish: an arm whose best lies on an edge gets one more point there."""
    return [run_config(s, arm, lr, TUNE_SEED) for arm in arms for lr in arm_grid(s, arm)[0]]


def tune(s: Settings, arms: list[str], run) -> dict[str, dict]:
    """Every arm's tuning runs, in rounds (`run(configs)` trains a round's runs still to train): a round
    grows each grid whose best lies on an edge by one point, one way only (`grown_lrs`), so `1 + extend`
    rounds settle every grid. Returns `tuned_lrs`."""
    for _ in range(1 + s.extend):
        run(tuning_plan(s, arms))
    return tuned_lrs(s, arms)


def curve(s: Settings, config: RunConfig) -> list[dict] | None:
    """A finished run's evaluations (from its folder or the kept outcomes); None before it finished."""
    found = outcome(s.kept, config)
    return found["evals"] if found else None


def tuned_lrs(s: Settings, arms: list[str]) -> dict[str, dict]:
    """arm -> {lr: the best final pass@1 on the tuning seed (the lower lr on a tie), grid: lr -> pass@1}, for
    the arms whose grid is finished."""
    out = {}
    for arm in arms:
        _, grid = arm_grid(s, arm)
        if grid is not None and (best := best_lr(grid)) is not None:  # as `grown_lrs` chooses
            out[arm] = {"lr": best, "grid": grid}
    return out


def report_plan(s: Settings, chosen: dict[str, dict]) -> list[RunConfig]:
    """The report seeds at each arm's tuned learning rate, seeds outermost (a killed study has whole seeds)."""
    return [run_config(s, arm, c["lr"], seed) for seed in range(s.seeds) for arm, c in chosen.items()]


def collect(s: Settings, chosen: dict[str, dict]) -> dict[str, dict[int, list[dict]]]:
    """arm -> seed -> its curve, for the finished report runs."""
    out: dict[str, dict[int, list[dict]]] = {}
    for arm, c in chosen.items():
        for seed in range(s.seeds):
            found = curve(s, run_config(s, arm, c["lr"], seed))
            if found:
                out.setdefault(arm, {})[seed] = found
    return out


def check_claims(s: Settings, runs: dict[str, dict[int, list[dict]]]) -> list[dict]:
    return [judged(runs, text, "SPO", a, b, compared, DIVERSITY.get(key) or final(key), expected, margin)
            for text, a, b, compared, key, expected, margin in s.study.claims]


def prepare_pool(s: Settings, progress=None, turns: int = TASK_TURNS) -> dict:
    """The store that every run with episodes of `turns` policy turns at most copies (`Settings.pool_of`),
    once (a marker `pool.json` when whole): the training prompts with Q0 from
    the reference's samples, and the study's other rows (the known solutions as source "human", or
    another agent's logged traces as source "logged"), `progress(done, prompts)` while the reference
    samples. Returns rows per source. The reference is installed first (`install_reference`: the CLI does
    it before anything else)."""
    from softrl.assemble import RunParts, load_tasks
    from softrl.data import ExperienceStore

    first = run_config(s, "spo-online", s.lrs[0], TUNE_SEED)
    first = first.model_copy(update={"task": first.task.model_copy(update={"max_turns": turns})})
    where = s.pool_of(first)
    shorter = {} if turns == TASK_TURNS else {"task.max_turns": turns}  # the study's first pools did not say
    made_with = {**{k: v for k, v in settings_of(first).items() if k in POOL_KEYS}, **s.study.pool_recipe, **shorter}
    marker = where / "pool.json"
    if marker.is_file():
        made = json.loads(marker.read_text())
        found = made.get("settings", {})
        # a marker that does not name the weights predates them: another build's rows may be in it
        differs = next((k for k in (*POOL_KEYS, *s.study.pool_recipe, *shorter)
                        if found.get(k) != made_with.get(k)), None)
        if differs:
            raise ConfigError(f"{where}: the pool was made with {differs}={found.get(differs)!r}, this study asks "
                              f"{made_with.get(differs)!r}: use another --runs directory, or delete the pool")
        return made["rows"]
    shutil.rmtree(where, ignore_errors=True)  # one half made when killed
    config = first.model_copy(update={"data": first.data.model_copy(update={"store": str(where)})})
    RunParts(config).q0(progress=progress)
    other = s.study.other_rows(load_tasks(config)[0], s)
    store = ExperienceStore(where)
    store.append(other)
    counts = {source: store.trajectories(source=source, columns=["id"]).num_rows  # as stored: repeats are one row
              for source in ["reference", *sorted({r.source for r in other})]}
    marker.write_text(json.dumps({"rows": counts, "settings": made_with}))
    return counts


def reference_card(config: RunConfig) -> dict:
    """How the runs' reference was made and how it does on held-out problems (its `softrl.json`), or {}."""
    from softrl.assemble import resolve_model

    card = Path(resolve_model(config)) / "softrl.json"
    return json.loads(card.read_text()) if card.is_file() else {}


def settings(study_: Study, runs: Path, quick: bool, seeds: int | None, steps: int | None, eval_size: int | None,
             eval_every: int | None, kept: Path, base: Path | None) -> Settings:
    """A study's Settings from the command line's options (None: the study's default; `quick`: a smoke
    test's), its reference installed where the runs will look for it."""
    from softrl.config import read_settings

    extra = read_settings(base) if base is not None else None
    given = {k: v for k, v in (("seeds", seeds), ("steps", steps), ("eval_size", eval_size),
                               ("eval_every", eval_every)) if v is not None}
    s = Settings(runs, study_, **{**study_.defaults, **(QUICK if quick else {}), **given}, extra=extra,
                 kept=kept)
    if run_config(s, "spo-online", s.lrs[0], TUNE_SEED).model.path == str(reference_dir(s)):
        install_reference(s)  # before any kept outcome is read: they name its weights
    return s


def study(s: Settings, jobs: int, report: Path, update, say, train: bool = True) -> tuple[str, Path]:
    """SPO against the baselines on the study's task: every arm's learning rate tuned, then the report seeds
    (`train` False: none, the report of what is finished so far); the report written under `report` as
    study-NAME.{md,json,png}. Returns its table and the plot's path."""
    from softrl_bench.frontier import run_stage
    from softrl_bench.learning import aggregate
    from softrl_bench.report import code_markdown, plot_learning, write_report

    def pool(update, configs: list[RunConfig]) -> dict:
        """Every pool the stage's runs copy (one per length of episodes), their rows per source, by pool."""
        counts = {}
        for turns in sorted({c.task.max_turns for c in configs}, reverse=True):
            where = f"pool of {turns}-turn episodes"
            for source, n in prepare_pool(s, lambda done, total: update(
                    done, total=total, description=f"{where}: Q0 of the training prompts from the reference's samples"),
                    turns).items():
                counts[f"{source} ({where})"] = n
        return counts

    arms = list(s.study.arms)
    if train:
        chosen = tune(s, arms, lambda plan: run_stage(s, plan, jobs, update, "tuning", pool, say))
        run_stage(s, report_plan(s, chosen), jobs, update, "report seeds", pool, say)
    chosen = tuned_lrs(s, arms)
    by_arm = collect(s, chosen)
    agg, claims, spread = aggregate(by_arm), check_claims(s, by_arm), diversity(by_arm)
    first = run_config(s, "spo-online", s.lrs[0], TUNE_SEED)
    table = code_markdown(agg, claims, s.seeds, chosen, reference_card(first), spread)
    stem = f"study-{s.study.name}"
    write_report(report, stem, table, {"study": f"{s.study.name}: {s.task}", "settings": {
        k: v for k, v in vars(s).items() if k not in ("root", "study")}, "tuned": chosen, "curves": agg,
        "claims": claims, "diversity": spread, "runs": by_arm})
    png = plot_learning(agg, report / f"{stem}.png",
                        f"{s.study.name} ({s.task}, held-out combinations): {s.steps} steps x "
                        f"{s.prompts * s.samples_per_prompt} generated, tuned lr, {s.seeds} seed(s)")
    return table, png
