"""How the tinycode-loops reference's held-out pass@k moves along one SFT run (docs/MODELS.md).

    python benchmarks/loops_recipe.py STEPS P_CORRECT CHECKPOINTS
    python benchmarks/loops_recipe.py 1500 0.8 500,1000,1500

Trains the bootstrap recipe with STEPS steps (its cosine schedule spans them) and P_CORRECT correct
answers, and at each checkpoint prints pass@1 and pass@10 (10 samples, T 0.4, top-p 0.95) on 100
held-out problems and 50 problems of the seen combinations. Nothing is saved.
"""

import json
import sys
import tempfile
import time
from pathlib import Path

from softrl import bootstrap as b
from softrl.eval.protocol import evaluate
from softrl.models.chartok import build_char_tokenizer
from softrl.models.loading import quiet_transformers
from softrl.rollout import RolloutSpec


def main(steps: int, p_correct: float, checkpoints: list[int]) -> None:
    quiet_transformers()
    config = b.BootstrapConfig(task="tinycode-loops", **{**b.TASK_DEFAULTS["tinycode-loops"], "steps": steps,
                                                         "p_correct": p_correct})
    tokenizer = build_char_tokenizer(Path(tempfile.mkdtemp()))
    started = time.time()
    model = b.make_model(config, tokenizer)
    splits = {"heldout": b.make_task("tinycode-loops", 100, 2_000_000),
              "seen": b.make_task("tinycode-loops", 50, 2_000_000, split="seen")}
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731

    def progress(step: int, loss: float) -> None:
        if step % 100 == 0:
            print(f"step {step} loss {loss:.3f} {time.time() - started:.0f}s", flush=True)
        if step + 1 in checkpoints:
            model.eval()
            out = {"step": step + 1}
            for name, task in splits.items():
                spec = RolloutSpec.for_model(task, model, tokenizer, task.max_new_tokens, source="eval")
                m = evaluate(spec, task.prompts(), encode, 10, 0.4, 0.95, 0)
                out[name] = {"pass@1": round(m["pass@1"], 3), "pass@10": round(m["pass@10"], 3)}
            print(json.dumps(out), flush=True)
            model.train()

    b.train_sft(model, tokenizer, b.sft_examples(config), config, progress)


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")])
