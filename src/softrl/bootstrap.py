"""The reference-model bootstrap: a tiny character-level Llama trained by supervised fine-tuning on
synthetic countdown (or tinycode) solutions mixed with plausible wrong ones, so that it solves a fraction of
held-out problems in many different ways. No downloads; minutes on 2 CPU cores.

Cached under `$SOFTRL_CACHE/bootstrap/` (default `~/.cache/softrl`), loaded with the ordinary
`from_pretrained`; `softrl.json` in the folder records how it was made and how well it does.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

import torch

from softrl.models.chartok import build_char_tokenizer
from softrl.files import cache_root
from softrl.models.loading import built_once, encode_episode, encode_response, quiet_transformers
from softrl.tasks.base import Prompt

TASKS = ("countdown", "tinycode", "tinycode-loops", "tinycode-feedback", "countdown-tools")  # the tasks with a bootstrap recipe
# tinycode's sequences are ~10x longer: smaller batches, fewer steps; the family is easy to tell
# from the statement, so the share of correct answers sets the success rate
TASK_DEFAULTS = {"tinycode": dict(steps=300, batch_size=16, lr=3e-3, train_problems=1000, eval_problems=40, p_correct=0.8),
                 # composing seen parts into held-out programs takes longer; 200 held-out problems, 10 samples
                 "tinycode-loops": dict(steps=700, batch_size=16, lr=3e-3, train_problems=2000, eval_problems=200,
                                        eval_samples=10, p_correct=0.4),
                 # episodes are about twice as long; a wrong first program is what the feedback is for
                 "tinycode-feedback": dict(steps=700, batch_size=16, lr=3e-3, train_problems=2000, eval_problems=100,
                                           eval_samples=10, p_correct=0.35),
                 # a call, the calculator's value, an answer: about three countdown responses long
                 "countdown-tools": dict(steps=1000, batch_size=32, lr=2e-3, p_correct=0.5)}
# the model's positions: three turns of a program and two feedbacks need more than one turn's 512
POSITIONS = {"tinycode-feedback": 1024}
# the turns of the synthetic episodes a multi-turn task's reference learns from (its runs' task.max_turns)
EPISODE_TURNS = {"tinycode-feedback": 3, "countdown-tools": 3}


@dataclass(frozen=True)
class BootstrapConfig:
    task: str = "countdown"
    seed: int = 0
    steps: int = 1000
    batch_size: int = 64
    lr: float = 2e-3
    p_correct: float = 0.9  # share of SFT responses that are correct
    hidden: int = 192
    layers: int = 4
    heads: int = 4
    mlp: int = 512
    train_problems: int = 6000
    eval_problems: int = 100
    eval_samples: int = 20

    def key(self) -> str:
        """Changes whenever the recipe or the task's problem distribution changes."""
        recipe = {"bootstrap": asdict(self), "task": task_fingerprint(self.task), "version": 1}
        return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:10]


def task_fingerprint(task: str):
    """What defines the task's problems: the countdown config, tinycode's families, or tinycode-loops'
    combinations with their split and programs (and tinycode-feedback's episodes besides)."""
    if task == "tinycode-feedback":
        from softrl.tasks.feedback_code import MAX_SHOWN_CHARS, SHOWN

        # "format": the feedback's wording and the synthetic episodes' recipe (feedback_code.py); one up on a change
        return {"episodes": [SHOWN, MAX_SHOWN_CHARS, POSITIONS[task], EPISODE_TURNS[task]], "format": 1,
                "problems": task_fingerprint("tinycode-loops")}
    if task == "countdown-tools":  # "format": the synthetic episodes' recipe (tools.py); one up on a change
        return {"episodes": [EPISODE_TURNS[task], POSITIONS.get(task, 512)], "format": 1,
                "problems": task_fingerprint("countdown")}
    if task == "tinycode-loops":
        from softrl.tasks.loopcode import MUTATIONS, REDUCERS, combination_name, combinations, programs, split_of

        return [[combination_name(*c), split_of(combination_name(*c)), c[0].phrase, c[1].phrase, REDUCERS[c[2]],
                 list(c[0].constants), list(c[1].constants), *programs(c[0].code, c[1].code, c[2])]
                for c in combinations()] + [list(MUTATIONS)]
    if task == "tinycode":
        from softrl.tasks.tinycode import FAMILIES

        return [[f.name, f.statement, *f.solutions] for f in FAMILIES]
    from softrl.tasks.countdown import CountdownConfig

    return asdict(CountdownConfig())


def make_task(task: str, size: int, seed: int, **options):
    from softrl.tasks.registry import load_task

    return load_task(task, size=size, seed=seed, **options)


def bootstrap_dir(config: BootstrapConfig) -> Path:
    return cache_root() / "bootstrap" / f"{config.task}-s{config.seed}-{config.key()}"


def short_expressions(numbers: list[int]) -> dict[str, Fraction]:
    """Every expression with one or two operations over distinct positions of `numbers`."""
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
           "/": lambda a, b: a / b if b else None}
    out: dict[str, Fraction] = {}
    idx = range(len(numbers))
    for i in idx:
        for j in idx:
            if i == j:
                continue
            a, b = Fraction(numbers[i]), Fraction(numbers[j])
            for o1, f1 in ops.items():
                ab = f1(a, b)
                if ab is None:
                    continue
                out.setdefault(f"{numbers[i]}{o1}{numbers[j]}", ab)
                for k in idx:
                    if k in (i, j):
                        continue
                    c = Fraction(numbers[k])
                    for o2, f2 in ops.items():
                        left, right = f2(ab, c), f2(c, ab)
                        if left is not None:
                            out.setdefault(f"({numbers[i]}{o1}{numbers[j]}){o2}{numbers[k]}", left)
                        if right is not None:
                            out.setdefault(f"{numbers[k]}{o2}({numbers[i]}{o1}{numbers[j]})", right)
    return out


def sft_examples(config: BootstrapConfig) -> list[tuple[Prompt, list[str], list[str]]]:
    """(prompt, correct responses, plausible wrong responses) for the training problems (their own seed)."""
    if config.task in ("tinycode-loops", "tinycode-feedback"):  # the seen combinations only: the task's prompts are the others
        from softrl.tasks.loopcode import plausible_wrong

        task = make_task(config.task, config.train_problems, 1_000_000 + config.seed, split="seen")
        return [(p, p.meta["solutions"], plausible_wrong(p)) for p in task.prompts()]
    task = make_task(config.task, config.train_problems, 1_000_000 + config.seed)
    if config.task == "tinycode":
        from softrl.tasks.tinycode import wrong_programs

        return [(p, p.meta["solutions"], wrong_programs(p.meta["solutions"], p.meta["tests"]))
                for p in task.prompts()]
    examples = []
    for prompt in task.prompts():
        exprs = short_expressions(prompt.meta["numbers"])
        target = prompt.meta["target"]
        right = [e for e, v in exprs.items() if v == target]
        # wrong ones are one-operation near misses: few of them, so their entropy does not drown
        # the signal of which expressions are right
        wrong = [e for e, v in exprs.items() if v != target and v.denominator == 1 and v > 0 and "(" not in e]
        if right and wrong:
            examples.append((prompt, right, wrong))
    return examples


def training_row(tokenizer, example: tuple[Prompt, list[str], list[str]], config: BootstrapConfig,
                 rng: random.Random) -> tuple[list[int], list[int]]:
    """(token ids, labels: -100 where there is no loss) of one supervised row: the prompt and one
    response, right with probability `p_correct`, the loss on the response and its EOS; for a multi-turn
    task a synthetic episode, the loss on the policy's turns only, never on the environment's."""
    prompt, right, wrong = example
    if config.task in EPISODE_TURNS:
        from softrl.data.schema import new_turn
        from softrl.tasks import feedback_code, tools

        synthetic_episode = {"tinycode-feedback": feedback_code, "countdown-tools": tools}[config.task].synthetic_episode
        turns = [new_turn(t["role"], t["content"], **{k: json.dumps(v) if k == "tool_calls" else v
                                                      for k, v in t.items() if k not in ("role", "content")})
                 for t in synthetic_episode(prompt, right, wrong, rng, EPISODE_TURNS[config.task], config.p_correct)]
        p, r, policy = encode_episode(tokenizer, prompt.text, turns)
        return p + r, [-100] * len(p) + [t if mine else -100 for t, mine in zip(r, policy)]
    response = rng.choice(right if rng.random() < config.p_correct else wrong)
    p, r = tokenizer(prompt.text, add_special_tokens=False)["input_ids"], encode_response(tokenizer, response)
    return p + r, [-100] * len(p) + r


def make_model(config: BootstrapConfig, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(config.seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=config.hidden, intermediate_size=config.mlp,
        num_hidden_layers=config.layers, num_attention_heads=config.heads, num_key_value_heads=config.heads,
        max_position_embeddings=POSITIONS.get(config.task, 512), tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    ))


def train_sft(model, tokenizer, examples, config: BootstrapConfig, progress: Callable[[int, float], None] | None = None):
    """AdamW with warm-up and cosine decay; the loss covers the response and its EOS only."""
    rng = random.Random(config.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, config.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warmup, 0.1 + 0.9 * 0.5 * (
        1 + math.cos(math.pi * min(s, config.steps) / config.steps))))
    model.train()
    for step in range(config.steps):
        rows, labels = [], []
        for example in rng.sample(examples, config.batch_size):
            ids, labelled = training_row(tokenizer, example, config, rng)
            rows.append(ids)
            labels.append(labelled)
        width = max(map(len, rows))
        ids = torch.tensor([x + [tokenizer.pad_token_id] * (width - len(x)) for x in rows])
        lab = torch.tensor([y + [-100] * (width - len(y)) for y in labels])
        mask = (torch.arange(width)[None] < torch.tensor([len(x) for x in rows])[:, None]).long()
        loss = model(input_ids=ids, attention_mask=mask, labels=lab).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if progress is not None:
            progress(step, loss.item())
    model.eval()


def evaluate(model, tokenizer, config: BootstrapConfig, temperature: float = 1.0, top_p: float = 1.0) -> dict:
    """Held-out problems (their own seed): per-sample success, pass@1, pass@10, distinct correct answers;
    for a multi-turn task, of episodes of its synthetic data's turns, and of their first turns besides."""
    from softrl.eval.protocol import evaluate as run_protocol
    from softrl.rollout import EpisodeLimits, RolloutSpec

    task = make_task(config.task, config.eval_problems, 2_000_000 + config.seed)  # tinycode-loops: held out
    spec = RolloutSpec.for_model(task, model, tokenizer, task.max_new_tokens, source="eval")
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    return run_protocol(spec, task.prompts(), encode, config.eval_samples, temperature, top_p, config.seed,
                        env=task.make_environment(), limits=EpisodeLimits(max_turns=EPISODE_TURNS.get(config.task, 1)))


def bootstrap(task: str = "countdown", seed: int = 0, force: bool = False,
              progress: Callable[[str, int, int, float], None] | None = None, **overrides) -> Path:
    """Build (or find in the cache) the reference model for `task`; returns its directory."""
    if task not in TASKS:
        raise ValueError(f"no bootstrap for task {task!r}; available: {', '.join(TASKS)}")
    config = BootstrapConfig(task=task, seed=seed, **{**TASK_DEFAULTS.get(task, {}), **overrides})

    def build(work: Path) -> None:
        quiet_transformers()
        tokenizer = build_char_tokenizer(work)
        examples = sft_examples(config)
        model = make_model(config, tokenizer)
        started = time.time()
        train_sft(model, tokenizer, examples, config,
                  None if progress is None else lambda s, loss: progress("train", s + 1, config.steps, loss))
        train_s = time.time() - started
        if progress is not None:
            progress("evaluate", 0, 1, 0.0)
        metrics = evaluate(model, tokenizer, config)
        model.save_pretrained(work)
        card = {"kind": "softrl-bootstrap", "config": asdict(config),
                "parameters": sum(p.numel() for p in model.parameters()), "train_examples": len(examples),
                "train_seconds": round(train_s, 1), "threads": torch.get_num_threads(), "heldout": metrics}
        (work / "softrl.json").write_text(json.dumps(card, indent=2))

    return built_once(bootstrap_dir(config), build, force)
