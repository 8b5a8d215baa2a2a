"""The final model's card (README.md beside its weights, as the Hugging Face hub shows it): what it
was trained from, how, on what, and how it scored."""

from __future__ import annotations

from pathlib import Path

import yaml

import softrl
import softrl.objectives as registry
from softrl.config import RunConfig


def write_model_card(directory: Path, config: RunConfig, base_model: str, task: str, summary: dict,
                     held_out: bool) -> Path:
    """`held_out`: whether the evaluation prompts were others than the training prompts."""
    settings = config.model_dump(mode="json")
    objectives = {source: config.data.objective_for(source) for source in config.data.mix}
    algorithms = sorted({o.algorithm for o in objectives.values()})
    header = {"library_name": "transformers", "tags": ["softrl", "reinforcement-learning", *algorithms]}
    if not Path(base_model).exists():  # a hub id: the hub links the card to it
        header["base_model"] = base_model

    def score(key: str) -> str:
        value = summary.get(key)
        return "n/a" if value is None else f"{value:.3f}"

    lines = [
        "---", yaml.safe_dump(header, sort_keys=False).strip(), "---", "",
        f"# {config.name}", "",
        f"Trained with softrl {softrl.__version__} from `{base_model}` on the task "
        f"`{task}`: {summary['steps']} learner steps, {summary['samples']} online samples, "
        f"{summary['seconds']:.0f} s of training.", "",
        "| data source | share of a batch | objective |", "|---|---|---|",
        *[f"| {source} | {config.data.mix[source]:g} | {registry.get(o.algorithm).summary} |"
          for source, o in objectives.items()],
        "", f"KL-regularisation beta {config.beta:.4g}, learning rate {config.optim.lr:g}, "
        f"{config.sampling.samples_per_prompt} samples per prompt, seed {config.seed}.", "",
        "## Evaluation", "",
        f"{'Held-out prompts' if held_out else 'The training prompts (no held-out set was given)'}, "
        f"{config.eval.samples} samples each at temperature {config.eval.temperature:g}, "
        f"top-p {config.eval.top_p:g}:", "",
        "| | pass@1 | pass@10 |", "|---|---|---|",
        f"| before training | {score('pass@1_before')} | {score('pass@10_before')} |",
        f"| after training | {score('pass@1_after')} | {score('pass@10_after')} |", "",
        "## Use", "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
        f'model = AutoModelForCausalLM.from_pretrained("{directory}")',
        f'tokenizer = AutoTokenizer.from_pretrained("{directory}")', "```", "",
        "## The run's configuration", "", "```yaml",
        yaml.safe_dump({**settings, "task": {**settings["task"], "name": task}}, sort_keys=False).strip(), "```", "",
    ]
    path = directory / "README.md"
    path.write_text("\n".join(lines))
    return path
