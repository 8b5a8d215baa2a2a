"""Models: exact log-probs under padding, behaviour log-probs of generation, loading errors."""

import json

import pytest
import torch

pytest.importorskip("transformers")

from softrl.models.generation import HFGenerator, SamplingParams  # noqa: E402
from softrl.models.loading import ModelLoadError, load_causal_lm  # noqa: E402
from softrl.models.logprobs import pad_batch, token_logprobs  # noqa: E402


def _encode(tokenizer, texts):
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_logprobs_equal_unpadded(tiny, side):
    _, model, tok = tiny
    prompts = _encode(tok, ["3 7 25 -> 178\n", "1 2 -> 3\n", "a much longer prompt here -> 9\n"])
    responses = _encode(tok, ["(25*7)+3", "1+2", "x"])
    with torch.no_grad():
        logp, mask, full = token_logprobs(model, pad_batch(prompts, responses, tok.pad_token_id, side), full=True)
        for i, (p, r) in enumerate(zip(prompts, responses)):
            alone, _, alone_full = token_logprobs(model, pad_batch([p], [r], tok.pad_token_id), full=True)
            n = len(r)
            assert mask[i].sum() == n
            assert torch.allclose(logp[i, :n], alone[0, :n], atol=1e-5)
            assert torch.allclose(full[i, :n], alone_full[0, :n], atol=1e-5)
            assert (logp[i, n:] == 0).all()


def test_logprobs_match_a_manual_forward(tiny):
    _, model, tok = tiny
    p, r = _encode(tok, ["12 -> 3\n"])[0], _encode(tok, ["1+2"])[0]
    with torch.no_grad():
        logits = model(torch.tensor([p + r])).logits[0]
        manual = torch.log_softmax(logits[len(p) - 1 : -1], -1).gather(-1, torch.tensor(r)[:, None]).squeeze(-1)
        logp, _, _ = token_logprobs(model, pad_batch([p], [r], tok.pad_token_id))
    assert torch.allclose(logp[0], manual, atol=1e-6)


def test_temperature_top_p_and_stop_strings(tiny):
    _, model, tok = tiny
    gen = HFGenerator(model, tok)
    prompt = _encode(tok, ["9 -> 9\n"])
    ranged = gen.generate(prompt, SamplingParams(n=16, max_new_tokens=6, temperature_range=(0.1, 0.8), seed=1))
    temps = [s.temperature for s in ranged]
    assert all(0.1 <= t <= 0.8 for t in temps) and len(set(temps)) == 16
    # at temperature T the behaviour log-probs are those of softmax(logits / T)
    sample = gen.generate(prompt, SamplingParams(n=1, max_new_tokens=5, temperature=0.5, seed=2))[0]
    batch = pad_batch(prompt, [sample.tokens], tok.pad_token_id)
    with torch.no_grad():
        logits = model(batch.input_ids).logits[0, len(prompt[0]) - 1 : -1] / 0.5
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(sample.tokens)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(sample.logprobs), expected, atol=1e-4)
    # top-p keeps the sampled tokens inside the nucleus: every behaviour log-prob is finite
    nucleus = gen.generate(prompt, SamplingParams(n=8, max_new_tokens=6, top_p=0.5, seed=3))
    assert all(torch.isfinite(torch.tensor(s.logprobs)).all() for s in nucleus)
    stopped = gen.generate(prompt, SamplingParams(n=32, max_new_tokens=40, stop=("a",), seed=4))
    for s in stopped:
        assert s.finish in ("stop", "eos", "length")
        if s.finish == "stop":
            assert s.text.endswith("a") and s.text.count("a") == 1 and len(s.logprobs) == len(s.tokens)
    assert any(s.finish == "stop" for s in stopped)


def test_loading_errors_are_one_line_and_say_what_to_do(tiny, tmp_path):
    directory, _, _ = tiny
    with pytest.raises(ModelLoadError, match="does not exist: run `softrl bootstrap countdown`"):
        load_causal_lm(tmp_path / "nope")
    nopad = tmp_path / "nopad"
    nopad.mkdir()
    for f in directory.iterdir():
        (nopad / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((nopad / "tokenizer_config.json").read_text())
    cfg.pop("pad_token", None)
    (nopad / "tokenizer_config.json").write_text(json.dumps(cfg))
    special = nopad / "special_tokens_map.json"
    if special.exists():
        data = json.loads(special.read_text())
        data.pop("pad_token", None)
        special.write_text(json.dumps(data))
    with pytest.raises(ModelLoadError, match="no pad token: pass pad_token=") as err:
        load_causal_lm(nopad)
    assert "\n" not in str(err.value)
    load_causal_lm(nopad, pad_token="<pad>")  # the way out works
    weird = tmp_path / "weird"
    weird.mkdir()
    (weird / "config.json").write_text(json.dumps({"model_type": "vit", "architectures": ["ViTModel"]}))
    with pytest.raises(ModelLoadError, match="not a causal LM") as err:
        load_causal_lm(weird)
    assert "\n" not in str(err.value)


def test_reference_is_frozen_and_value_model_trains_alone(tiny):
    from softrl.models.wrappers import PolicyModel, ReferenceModel, ValueModel

    _, model, tok = tiny
    policy = PolicyModel(model, tok)
    reference = ReferenceModel.from_policy(policy)
    batch = policy.batch(_encode(tok, ["1 2 -> 3\n", "4 -> 4\n"]), _encode(tok, ["1+2", "4"]))
    ref_logp, mask, _ = reference.logprobs(batch)
    assert not ref_logp.requires_grad and all(not p.requires_grad for p in reference.model.parameters())
    pol_logp, _, _ = policy.logprobs(batch)
    assert torch.allclose(pol_logp.detach(), ref_logp, atol=1e-6)  # a copy of the same weights
    value = ValueModel(model)
    v = value.values(batch)
    assert v.shape == mask.shape and (v == 0).all()  # zero-initialised head
    (v.sum() + 1.0 * value.head.bias.sum()).backward()
    assert value.head.bias.grad is not None
    assert all(p.grad is None for p in model.parameters())  # the policy's weights are not shared
