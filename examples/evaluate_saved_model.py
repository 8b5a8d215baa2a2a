"""Evaluate a saved model, and its reference, on held-out records with the SPO paper's protocol:
pass@1 and pass@10 (unbiased) from 20 samples per prompt at temperature 0.4, top-p 0.95.

    python examples/evaluate_saved_model.py runs/trl-style-reward/final
    python examples/evaluate_saved_model.py runs/trl-style-reward/final --records 8 --samples 2
"""

import argparse

import softrl
from trl_style_reward import reaches_answer, records

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("model", help="a model folder (a run's final/), a hub id, or bootstrap:countdown")
    parser.add_argument("--reference", default="bootstrap:countdown", help="the model it was trained from")
    parser.add_argument("--records", type=int, default=50, help="held-out records")
    parser.add_argument("--samples", type=int, default=20, help="samples per prompt")
    args = parser.parse_args()
    held_out = records(args.records, seed=1)
    for name in (args.reference, args.model):
        result = softrl.evaluate(name, dataset=held_out, reward=reaches_answer, samples=args.samples,
                                 max_new_tokens=32)
        pass10 = "n/a (fewer than 10 samples)" if result["pass@10"] is None else f"{result['pass@10']:.3f}"
        print(f"{name}: pass@1 {result['pass@1']:.3f}, pass@10 {pass10}, "
              f"{result['distinct_correct_per_solved'] or 0:.2f} distinct correct answers per solved prompt")
