"""SPO (Soft Policy Optimization, Cohen et al. 2025) on your own `{prompt, answer}` records, with a
reward function written the way TRL's GRPOTrainer takes it: batched, the record's other fields as
keyword lists.

    python examples/trl_style_reward.py                     # minutes on 2 CPU cores
    python examples/trl_style_reward.py --records 16 optim.steps=2 q0.k=2   # config key=value overrides

The model is softrl's countdown bootstrap (a tiny reference built on first use, no download); with
a GPU, put a hub id or a model directory in model.path instead.
"""

import argparse
import ast
import operator
import random
import re

import yaml

import softrl

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def arithmetic(expression: str) -> float:
    """The value of + - * / over integers, without eval."""

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError("not arithmetic")

    return value(ast.parse(expression, mode="eval").body)


def reaches_answer(prompts, completions, answer, **kwargs):
    """1 when the completion's last line is an expression over the prompt's numbers (each at most
    once) whose value is the record's `answer`."""
    rewards = []
    for prompt, completion, target in zip(prompts, completions, answer):
        lines = completion.strip().splitlines()
        expression = lines[-1] if lines else ""
        given, used = prompt.split("->")[0].split(), re.findall(r"\d+", expression)
        try:
            ok = arithmetic(expression) == target and all(used.count(n) <= given.count(n) for n in used)
        except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
            ok = False
        rewards.append(float(ok))
    return rewards


def records(n: int, seed: int) -> list[dict]:
    """Four digits and a target two of them make, with one way to make it:
    `{"prompt": "3 5 1 7 -> 8\\n", "answer": 8, "solution": "5+3"}`."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        digits = [rng.randint(1, 9) for _ in range(4)]
        a, b = sorted(rng.sample(digits, 2), reverse=True)
        solution = rng.choice([f"{a}+{b}", f"{a}*{b}"] + ([f"{a}-{b}"] if a > b else []))
        target = int(arithmetic(solution))
        out.append({"prompt": f"{' '.join(map(str, digits))} -> {target}\n", "answer": target, "solution": solution})
    return out


class PrintEvaluations(softrl.Callback):
    def on_eval(self, result):
        print(f"step {result['step']}: pass@1 {result['eval/pass@1']:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200, help="training records (a quarter as many held out)")
    parser.add_argument("overrides", nargs="*", help="config key=value, e.g. optim.steps=10")
    args = parser.parse_args()
    config = {
        "name": "trl-style-reward", "out_dir": "runs", "data.store": "runs/store",
        "model.path": "bootstrap:countdown",
        "sampling": {"prompts_per_step": 8, "samples_per_prompt": 4, "max_new_tokens": 32},
        "q0.k": 8, "optim": {"steps": 100, "lr": 1e-4}, "eval": {"samples": 10},
        **{key: yaml.safe_load(value) for key, _, value in (o.partition("=") for o in args.overrides)},
    }
    run = softrl.train(config, dataset=records(args.records, seed=0), eval_dataset=records(max(args.records // 4, 1), 1),
                       reward=reaches_answer, callbacks=[PrintEvaluations()])
    print(f"pass@1 {run.summary['pass@1_before']:.3f} -> {run.summary['pass@1_after']:.3f}; "
          f"final model: {run.final_model}")
