"""A benchmark's bootstrap reference, kept beside its kept outcomes.

A bootstrap's training is deterministic on one machine but not across machines: the same recipe gave
countdown references of held-out pass@1 0.246 (this machine's AVX-512 kernels) and 0.226
(`ATEN_CPU_CAPABILITY=avx2`, same machine), and tinycode-loops references of 0.086 and 0.044 on two
machines. A benchmark that runs in chunks over several machines therefore keeps the reference its
outcomes were made with in a folder beside them (to be committed with them), and every machine installs
that one into the cache instead of building its own.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

from softrl.config import ConfigError


def reference_dir(task: str) -> Path:
    """The cache folder of `task`'s bootstrap reference, named by its recipe's key (built or not)."""
    from softrl.assemble import model_folder

    return Path(model_folder("bootstrap", task))


def install(task: str, kept: Path | None, outcomes: Path | None = None) -> Path:
    """`task`'s bootstrap reference in the cache, the one kept in `kept`: installed from there, or, when
    nothing is kept yet, built (or found in the cache) and copied there. Refuses a kept reference of
    another recipe than today's, a different model already in the cache (one line naming both), and kept
    `outcomes` (a file with lines) with no reference beside them: a new build would not be theirs."""
    from softrl_bench.learning import weights_digest
    from softrl.bootstrap import TASK_DEFAULTS, BootstrapConfig, bootstrap
    from softrl.models.loading import built_once

    final = reference_dir(task)
    if kept is None:
        return bootstrap(task)
    if not (kept / "softrl.json").is_file():
        if outcomes is not None and outcomes.is_file() and outcomes.read_text().strip():
            raise ConfigError(f"{outcomes} holds outcomes but the reference they were made with is not beside them "
                              f"({kept}): restore that folder, or give another --kept file to start over")
        bootstrap(task)
        built_once(kept, lambda work: shutil.copytree(final, work))
        return final
    recipe = json.loads((kept / "softrl.json").read_text()).get("config")
    if recipe != asdict(BootstrapConfig(task=task, **TASK_DEFAULTS.get(task, {}))):
        raise ConfigError(f"{kept}: the kept reference was built by another recipe than {task}'s today "
                          f"({final.name}): give another --kept file to start over")
    built_once(final, lambda work: shutil.copytree(kept, work))
    if weights_digest(final) != weights_digest(kept):
        raise ConfigError(f"{final}: this machine's {task} reference is not the one the kept outcomes were made with "
                          f"({kept}; bootstrap training differs across machines): delete {final} to install the kept "
                          "one (runs made with it are then refused), or give another --kept file to start over")
    return final
