"""SPO (Soft Policy Optimization, Cohen et al. 2025) on online samples plus completions you already
have: half of every batch is the policy's own samples, half is drawn from your offline completions
(and the reference's passed samples softrl keeps from estimating Q0). SPO learns correctly from
both; GRPO and PPO could use only the first half. The reward here is the per-sample form.

    python examples/online_plus_offline.py
    python examples/online_plus_offline.py --records 16 optim.steps=2 q0.k=2   # config key=value overrides
"""

import argparse

import yaml

import softrl
from trl_style_reward import reaches_answer, records


def solved(prompt, completion, answer):
    """The per-sample form: one prompt, one completion, the record's fields by name."""
    return reaches_answer([prompt], [completion], [answer])[0]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200, help="training records (a quarter as many held out)")
    parser.add_argument("overrides", nargs="*", help="config key=value, e.g. optim.steps=10")
    args = parser.parse_args()
    dataset = records(args.records, seed=0)
    # what you already have: e.g. solutions people wrote, or another model's graded samples;
    # the reward says which are right (SPO's offline pool keeps the passed ones: data.offline_passed_only)
    offline = [{"prompt": r["prompt"], "completion": r["solution"], "reward": 1.0} for r in dataset[: len(dataset) // 2]]
    offline += [{"prompt": r["prompt"], "completion": "1+1", "reward": float(r["answer"] == 2)} for r in dataset[:4]]
    config = {
        "name": "online-plus-offline", "out_dir": "runs", "data.store": "runs/store",
        "model.path": "bootstrap:countdown",
        "data": {"mix": {"online": 0.5, "offline": 0.5}, "objective": {"algorithm": "spo", "loss": "bce"}},
        "sampling": {"prompts_per_step": 8, "samples_per_prompt": 4, "max_new_tokens": 32},
        "q0.k": 8, "optim": {"steps": 100, "lr": 1e-4}, "eval": {"samples": 10},
        **{key: yaml.safe_load(value) for key, _, value in (o.partition("=") for o in args.overrides)},
    }
    run = softrl.train(config, dataset=dataset, eval_dataset=records(max(args.records // 4, 1), seed=1),
                       reward=solved, offline=offline)
    drawn = [m for m in run.metrics if "batch_rows" in m]
    print(f"pass@1 {run.summary['pass@1_before']:.3f} -> {run.summary['pass@1_after']:.3f} after "
          f"{run.summary['steps']} steps ({sum(m['batch_rows'] for m in drawn)} rows trained on, "
          f"{run.summary['samples']} of them sampled online); final model: {run.final_model}")
