"""Generation backends ("hf": transformers `generate`; "static": own decode loop on a reused static KV
cache): the same contract, exact behaviour log-probs, the same samples for the same seed."""

import copy
import threading

import pytest
import torch

pytest.importorskip("transformers")

from softrl.models.generation import (  # noqa: E402
    HFGenerator, SamplingParams, StaticCacheGenerator, make_generator, temperature_top_p,
)
from softrl.models.logprobs import pad_batch, token_logprobs  # noqa: E402
from softrl.models.static_generation import StaticDecoder, cuda_graphs_in_this_thread  # noqa: E402

BACKENDS = ["hf", "static"]


def _encode(tokenizer, texts):
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def _generator(backend, model, tok, **kwargs):
    return HFGenerator(model, tok, **kwargs) if backend == "hf" else StaticCacheGenerator(model, tok, compile=False,
                                                                                          **kwargs)


def _fresh_logits(model, prompt, tokens):
    """fp32 logits `[len(tokens), V]` predicting each of `tokens` after `prompt`: one unpadded forward."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    return logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]


def _assert_behaviour_logprobs(model, prompts, samples, top_p=1.0, atol=1e-4):
    """Each sample's log-probs are log_softmax(temperature_top_p(logits)) at its tokens, from a fresh
    unpadded forward at its own temperature."""
    for s in samples:
        assert len(s.logprobs) == len(s.tokens) >= 1
        logits = _fresh_logits(model, prompts[s.prompt_index], s.tokens)
        processed = temperature_top_p(logits, torch.full((len(s.tokens),), s.temperature), top_p)
        expected = torch.log_softmax(processed, -1).gather(-1, torch.tensor(s.tokens)[:, None]).squeeze(-1)
        assert torch.isfinite(expected).all()
        assert torch.allclose(torch.tensor(s.logprobs), expected, atol=atol), (s.logprobs, expected.tolist())


def _eos_biased(model, tok, bias):
    """A copy of `model` whose output layer adds `bias` to the EOS logit."""
    biased = copy.deepcopy(model)
    head = biased.lm_head
    linear = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        linear.weight.copy_(head.weight)
        linear.bias.zero_()
        linear.bias[tok.eos_token_id] = bias
    biased.lm_head = linear
    return biased


@pytest.mark.parametrize("backend", BACKENDS)
def test_behaviour_logprobs_match_a_fresh_forward(tiny, backend):
    _, model, tok = tiny
    prompts = _encode(tok, ["3 7 25 -> 178\n", "1 2 -> 3\n"])
    samples = _generator(backend, model, tok).generate(prompts, SamplingParams(n=4, max_new_tokens=12, seed=0))
    assert len(samples) == 8 and [s.prompt_index for s in samples] == [0] * 4 + [1] * 4  # grouped, prompt order
    batch = pad_batch([prompts[s.prompt_index] for s in samples], [s.tokens for s in samples], tok.pad_token_id)
    with torch.no_grad():
        fresh, mask, _ = token_logprobs(model, batch)
    for i, s in enumerate(samples):
        assert len(s.logprobs) == len(s.tokens) == int(mask[i].sum())
        assert torch.allclose(torch.tensor(s.logprobs), fresh[i, : len(s.tokens)], atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature,top_p", [(0.5, 1.0), (1.3, 1.0), (1.0, 0.5), (0.7, 0.9)])
def test_temperature_and_top_p_logprobs_are_the_sampling_distribution(tiny, backend, temperature, top_p):
    _, model, tok = tiny
    prompts = _encode(tok, ["9 -> 9\n", "12 -> 3\n"])
    params = SamplingParams(n=3, max_new_tokens=8, temperature=temperature, top_p=top_p, seed=2)
    samples = _generator(backend, model, tok).generate(prompts, params)
    assert all(s.temperature == temperature for s in samples)
    _assert_behaviour_logprobs(model, prompts, samples, top_p)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ranged_temperatures_are_drawn_recorded_and_used(tiny, backend):
    _, model, tok = tiny
    prompts = _encode(tok, ["9 -> 9\n", "4 4 -> 8\n"])
    params = SamplingParams(n=8, max_new_tokens=6, temperature_range=(0.1, 0.8), top_p=0.95, seed=1)
    samples = _generator(backend, model, tok, max_batch=8).generate(prompts, params)  # two chunks
    temps = [s.temperature for s in samples]
    assert all(0.1 <= t <= 0.8 for t in temps) and len(set(temps)) == 16
    _assert_behaviour_logprobs(model, prompts, samples, top_p=0.95)


def test_static_draws_the_samples_hf_draws(tiny):
    """Same seed, same temperatures (drawn in the same order across chunks), same tokens, same log-probs."""
    _, model, tok = tiny
    prompts = _encode(tok, ["3 7 25 -> 178\n", "1 2 -> 3\n", "x", "a much longer prompt here -> 9\n"])
    params = SamplingParams(n=3, max_new_tokens=16, temperature_range=(0.3, 1.2), top_p=0.9, stop=("+",), seed=5)
    hf = HFGenerator(model, tok, max_batch=6).generate(prompts, params)
    static = StaticCacheGenerator(model, tok, max_batch=6, compile=False).generate(prompts, params)
    assert [(s.prompt_index, s.tokens, s.text, s.finish, s.temperature) for s in static] == \
        [(s.prompt_index, s.tokens, s.text, s.finish, s.temperature) for s in hf]
    for a, b in zip(hf, static):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_left_padded_prompts_of_different_lengths_match_unpadded_forwards(tiny, backend):
    _, model, tok = tiny
    prompts = _encode(tok, ["x", "1 2 -> 3\n", "a much longer prompt, with many more characters -> 9\n"])
    for n in (1, 3):  # n == 1 prefills every row into the static cache; n > 1 shares each prompt's prefill
        samples = _generator(backend, model, tok).generate(prompts, SamplingParams(n=n, max_new_tokens=10, seed=n))
        assert [s.prompt_index for s in samples] == [i for i in range(3) for _ in range(n)]
        _assert_behaviour_logprobs(model, prompts, samples)


@pytest.mark.parametrize("backend", BACKENDS)
def test_eos_ends_a_sample(tiny, backend):
    _, model, tok = tiny
    biased = _eos_biased(model, tok, bias=3.0)
    prompts = _encode(tok, ["9 -> 9\n"])
    samples = _generator(backend, biased, tok).generate(prompts, SamplingParams(n=16, max_new_tokens=30, seed=3))
    ended = [s for s in samples if s.finish == "eos"]
    assert ended and any(len(s.tokens) > 1 for s in ended)
    for s in ended:
        assert s.tokens[-1] == tok.eos_token_id and tok.eos_token_id not in s.tokens[:-1]
        assert len(s.logprobs) == len(s.tokens) and tok.eos_token not in s.text
    for s in samples:
        assert s.finish in ("eos", "length") and (s.finish == "eos" or len(s.tokens) == 30)
    _assert_behaviour_logprobs(biased, prompts, samples)


def test_static_rows_emit_pad_after_eos_and_the_loop_ends_early(tiny):
    _, model, tok = tiny
    decoder = StaticDecoder(_eos_biased(model, tok, bias=4.0), compile=False)
    prompts = _encode(tok, ["9 -> 9\n", "1 2 -> 3\n"])
    tokens, logp = decoder.decode(prompts, 4, 50, lambda s: s, tok.pad_token_id, tok.eos_token_id,
                                  torch.Generator().manual_seed(0))
    assert tokens.shape == logp.shape and tokens.shape[0] == 8
    ends = [row.index(tok.eos_token_id) for row in tokens.tolist()]
    for row, end in zip(tokens.tolist(), ends):
        assert all(t == tok.pad_token_id for t in row[end + 1 :])
    # on the CPU "all rows finished?" is checked every step (on CUDA every 8, a host sync each)
    assert tokens.shape[1] == max(ends) + 1 < 50


@pytest.mark.parametrize("backend", BACKENDS)
def test_stop_strings_end_a_sample_and_cut_the_text(tiny, backend):
    _, model, tok = tiny
    prompt = _encode(tok, ["9 -> 9\n"])
    stopped = _generator(backend, model, tok).generate(prompt, SamplingParams(n=32, max_new_tokens=40, stop=("a",),
                                                                              seed=4))
    for s in stopped:
        assert s.finish in ("stop", "eos", "length") and len(s.logprobs) == len(s.tokens)
        if s.finish == "stop":
            assert s.text.endswith("a") and s.text.count("a") == 1
            assert tok.decode(s.tokens, skip_special_tokens=True) == s.text
            assert "a" not in tok.decode(s.tokens[:-1], skip_special_tokens=True)
    assert any(s.finish == "stop" for s in stopped)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_model(tiny, backend):
    _, model, tok = tiny
    half = copy.deepcopy(model).to(torch.bfloat16)
    prompts = _encode(tok, ["3 7 25 -> 178\n", "x"])
    samples = _generator(backend, half, tok).generate(prompts, SamplingParams(n=2, max_new_tokens=8, temperature=0.5,
                                                                              seed=0))
    assert len(samples) == 4 and all(isinstance(v, float) for s in samples for v in s.logprobs)
    # bf16 rounding differs between a cached decode and one full forward (about 1e-3 here); T = 1
    # instead of 0.5 would be off by about 0.1
    _assert_behaviour_logprobs(half, prompts, samples, atol=1e-2)


def test_static_cache_is_reused_across_calls_of_one_shape(tiny):
    _, model, tok = tiny
    gen = StaticCacheGenerator(model, tok, compile=False)
    prompts = _encode(tok, ["3 7 25 -> 178\n", "1 2 -> 3\n"])
    params = SamplingParams(n=4, max_new_tokens=12, seed=7)
    first = gen.generate(prompts, params)
    cache, _ = gen.decoder._caches[8]
    keys = cache.layers[0].keys
    again = gen.generate(_encode(tok, ["1 2 3 4 -> 10\n", "22 -> 4\n"]), params)  # same rows and width
    assert gen.decoder._caches[8][0] is cache and cache.layers[0].keys.data_ptr() == keys.data_ptr()
    assert [s.tokens for s in gen.generate(prompts, params)] == [s.tokens for s in first]  # no state leaks
    assert len(again) == 8
    assert gen.decoder.kept == 1  # on the CPU one cache: an evaluation's is not held through training
    gen.generate(prompts, SamplingParams(n=2, max_new_tokens=12, seed=7))  # another row count: its own cache
    assert set(gen.decoder._caches) == {4}
    gen.decoder.kept = 2  # as on CUDA
    gen.generate(prompts, params)
    cache = gen.decoder._caches[8][0]
    gen.generate(prompts, SamplingParams(n=2, max_new_tokens=12, seed=7))
    assert set(gen.decoder._caches) == {8, 4} and gen.decoder._caches[8][0] is cache
    gen.generate(prompts, SamplingParams(n=4, max_new_tokens=40, seed=7))  # longer: replaces the 8-row cache
    assert set(gen.decoder._caches) == {8, 4} and gen.decoder._caches[8][0] is not cache
    assert gen.decoder._caches[8][0].get_max_length() >= 14 + 40


def test_a_generating_thread_gets_its_own_cuda_graph_state():
    """Before torch 2.13 a graph compiled with CUDA graphs failed a bare assert in any thread but the one
    that imported inductor's graph trees (pytorch#123177): async generation's thread. The seam gives a
    thread its own state, once; the CUDA half of this is tests/test_gpu.py."""
    from torch._inductor import cudagraph_trees

    main = cudagraph_trees.get_obj(cudagraph_trees.local, "tree_manager_containers")
    seen = {}

    def worker():
        seen["before"] = torch._C._is_key_in_tls("tree_manager_containers")
        cuda_graphs_in_this_thread()
        seen["after"] = torch._C._is_key_in_tls("tree_manager_containers")
        own = cudagraph_trees.get_obj(cudagraph_trees.local, "tree_manager_containers")
        cuda_graphs_in_this_thread()  # a second call keeps the state the first made
        seen["own"] = own is not main and own is torch._C._get_obj_in_tls("tree_manager_containers")

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == {"before": False, "after": True, "own": True}
    assert cudagraph_trees.get_obj(cudagraph_trees.local, "tree_manager_containers") is main


def test_the_seam_meets_the_graph_trees_of_torch_before_2_13(monkeypatch):
    """The GPU machine has torch 2.11, whose `get_obj` asserted where 2.13's sets the state up: in a new
    thread, graph trees' first use fails that bare assert without the seam and finds a container with it."""
    from torch._inductor import cudagraph_trees

    def get_obj_before_2_13(local, attr_name):  # torch 2.11.0's, as its wheel has it
        if hasattr(local, attr_name):
            return getattr(local, attr_name)
        assert torch._C._is_key_in_tls(attr_name)
        return torch._C._get_obj_in_tls(attr_name)

    monkeypatch.setattr(cudagraph_trees, "get_obj", get_obj_before_2_13)
    seen = {}

    def first_use(seam: bool):
        if seam:
            cuda_graphs_in_this_thread()
        try:
            seen[seam] = type(cudagraph_trees.get_container(0)).__name__
        except AssertionError:
            seen[seam] = "AssertionError"

    for seam in (False, True):
        thread = threading.Thread(target=first_use, args=(seam,))
        thread.start()
        thread.join()
    assert seen == {False: "AssertionError", True: "TreeManagerContainer"}


def test_make_generator_picks_a_backend_by_name(tiny):
    _, model, tok = tiny
    assert isinstance(make_generator(model, tok, "hf"), HFGenerator)
    static = make_generator(model, tok, "static", max_batch=16)
    assert isinstance(static, StaticCacheGenerator) and static.max_batch == 16
    assert not static.decoder.compiled  # "auto" compiles on CUDA only
    assert isinstance(make_generator(model, tok, "auto"), StaticCacheGenerator)  # the same samples, faster
    unsupported = copy.copy(model)
    unsupported._can_compile_fullgraph = False  # a model class without a static cache
    assert isinstance(make_generator(unsupported, tok, "auto"), HFGenerator)
    stateful = copy.copy(model)
    stateful._is_stateful = True  # a recurrent or hybrid model: its cache is not a plain static one
    assert isinstance(make_generator(stateful, tok, "auto"), HFGenerator)
    with pytest.raises(ValueError, match=r"unknown generation backend 'vllm'; valid: hf, static, auto"):
        make_generator(model, tok, "vllm")
    with pytest.raises(ValueError, match="compile must be"):
        StaticCacheGenerator(model, tok, compile="yes")


def test_compiled_decode_step_matches_eager(tiny):
    """compile=True on CPU (inductor C++ code; 20-35 s to build on 2 cores): same tokens, same log-probs."""
    _, model, tok = tiny
    prompts = _encode(tok, ["3 7 25 -> 178\n", "x"])
    params = SamplingParams(n=2, max_new_tokens=10, temperature=0.7, top_p=0.9, seed=0)
    eager = StaticCacheGenerator(model, tok, compile=False).generate(prompts, params)
    compiled_gen = StaticCacheGenerator(model, tok, compile=True)
    assert compiled_gen.decoder.compiled
    compiled = compiled_gen.generate(prompts, params)
    assert [s.tokens for s in compiled] == [s.tokens for s in eager]
    for a, b in zip(eager, compiled):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


ARCHITECTURES = {  # beyond Llama: GQA with biases, learned positions, all-sliding-window, hybrid sliding/full
    "qwen2": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2),
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4),
    "mistral": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, sliding_window=8),
    "gemma2": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, sliding_window=8),
}


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_static_draws_the_samples_hf_draws_on_other_architectures(tiny, architecture):
    from transformers import AutoConfig, AutoModelForCausalLM

    _, _, tok = tiny
    torch.manual_seed(0)
    config = AutoConfig.for_model(architecture, vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                  **ARCHITECTURES[architecture])
    model = AutoModelForCausalLM.from_config(config).eval()
    prompts = _encode(tok, ["3 7 25 -> 178\n", "1 2 -> 3\n", "x"])  # longer than the sliding windows
    for n in (1, 3):
        params = SamplingParams(n=n, max_new_tokens=16, temperature=0.8, seed=n)
        hf = HFGenerator(model, tok).generate(prompts, params)
        static = StaticCacheGenerator(model, tok, compile=False).generate(prompts, params)
        assert [s.tokens for s in static] == [s.tokens for s in hf]
        for a, b in zip(hf, static):
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ignore_eos_gives_fixed_length_samples_with_exact_logprobs(tiny, backend):
    """Fixed work for benchmarks: EOS is never drawn, so every sample is max_new_tokens long, and the
    behaviour log-probs are those of the distribution with EOS removed."""
    _, model, tok = tiny
    biased = _eos_biased(model, tok, bias=3.0)  # EOS would end most samples early
    prompts = _encode(tok, ["9 -> 9\n"])
    params = SamplingParams(n=8, max_new_tokens=12, seed=3, ignore_eos=True)
    samples = _generator(backend, biased, tok).generate(prompts, params)
    eos = tok.eos_token_id
    assert all(len(s.tokens) == 12 and eos not in s.tokens and s.finish == "length" for s in samples)
    for s in samples:
        logits = _fresh_logits(biased, prompts[0], s.tokens)
        logits[:, eos] = float("-inf")
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.tokens)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(s.logprobs), expected, atol=1e-4)


def test_static_backend_under_an_autocast_computes_in_the_models_dtype(tiny):
    """A run evaluates its fp32 policy inside its bf16 autocast (on CUDA by default): the static
    cache holds fp32, so the decode loop must not take bf16 keys and values from the autocast."""
    from softrl.models.device import Placement

    _, model, tok = tiny
    prompts = _encode(tok, ["3 7 25 -> 178\n", "1 2 -> 3\n"])
    params = SamplingParams(n=3, max_new_tokens=10, seed=4)
    with Placement.create("cpu", "float32", "bfloat16").autocast():
        samples = _generator("static", model, tok).generate(prompts, params)
    _assert_behaviour_logprobs(model, prompts, samples)  # exact fp32 log-probs: no bf16 inside


class _Prefills:
    """Counts the tokens a model is fed in its multi-token forwards (prefills), not its decode steps."""

    def __init__(self, model):
        self.model, self.widths = model, []
        self.forward = model.forward
        model.forward = self

    def __call__(self, *args, input_ids=None, **kwargs):
        if input_ids is not None and input_ids.shape[1] > 1:
            self.widths.append(input_ids.shape[1])
        return self.forward(*args, input_ids=input_ids, **kwargs)

    def close(self):
        self.model.forward = self.forward


def _next_turn(tok, prompts, samples):
    """The next turn's contexts of `samples`: each conversation so far plus an environment's answer of its
    own length; one cut inside its sample (a turn kept shorter than drawn), one new prompt, one sample left out."""
    contexts = [prompts[s.prompt_index] + s.tokens + _encode(tok, ["\nno: " + "x" * i])[0] for i, s in enumerate(samples)]
    contexts[1] = prompts[samples[1].prompt_index] + samples[1].tokens[:2] + _encode(tok, ["\nshort"])[0]
    return contexts[:-1] + _encode(tok, ["5 5 -> 10\n"])


def test_a_prefix_session_prefills_only_what_the_prompts_add_and_draws_what_a_fresh_call_draws(tiny):
    _, model, tok = tiny
    biased = _eos_biased(model, tok, bias=2.0)  # some samples end early, so rows hold pads after their EOS
    prompts = _encode(tok, ["3 7 25 -> 178\n", "1 2 -> 3\n"])
    generator = StaticCacheGenerator(biased, tok, compile=False)
    prefills = _Prefills(biased)
    try:
        with generator.prefix_session():
            first = generator.generate(prompts, SamplingParams(n=3, max_new_tokens=10, temperature=0.9, seed=0))
            contexts = _next_turn(tok, prompts, first)
            prefills.widths.clear()
            second = generator.generate(contexts, SamplingParams(n=1, max_new_tokens=10, temperature=0.9, seed=1))
            kept = prefills.widths
            prefills.widths = []
            third = generator.generate(contexts, SamplingParams(n=1, max_new_tokens=10, temperature=0.9, seed=1))
            assert prefills.widths == []  # every context cached but its last token, which the first step feeds
        fresh = StaticCacheGenerator(biased, tok, compile=False).generate(
            contexts, SamplingParams(n=1, max_new_tokens=10, temperature=0.9, seed=1))
        whole = prefills.widths[-1]
    finally:
        prefills.close()
    assert any(s.finish == "eos" for s in first)
    # the conversations so far are not fed again: the widest new part is the new prompt, not a whole context
    assert kept and max(kept) < max(len(c) for c in contexts) - 1 == whole
    for same in (second, third):  # third: every context is now cached whole but its last token
        assert [s.tokens for s in same] == [s.tokens for s in fresh]
        for a, b in zip(same, fresh):
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    _assert_behaviour_logprobs(biased, contexts, second)


def test_a_prefix_session_does_not_reuse_keys_and_values_of_weights_that_changed(tiny):
    _, model, tok = tiny
    model = copy.deepcopy(model)
    prompts = _encode(tok, ["3 7 25 -> 178\n", "1 2 -> 3\n"])
    params = SamplingParams(n=2, max_new_tokens=8, seed=0)
    generator = StaticCacheGenerator(model, tok, compile=False)
    with generator.prefix_session():
        contexts = [prompts[s.prompt_index] + s.tokens + [tok.eos_token_id] for s in generator.generate(prompts, params)]
        with torch.no_grad():  # an optimizer step's kind of change: in place
            for p in model.parameters():
                p.mul_(1.1)
        after = generator.generate(contexts, SamplingParams(n=1, max_new_tokens=8, seed=1))
    fresh = StaticCacheGenerator(model, tok, compile=False).generate(contexts, SamplingParams(n=1, max_new_tokens=8, seed=1))
    assert [s.tokens for s in after] == [s.tokens for s in fresh]
    _assert_behaviour_logprobs(model, contexts, after)


def test_outside_a_prefix_session_and_compiled_nothing_is_kept(tiny):
    _, model, tok = tiny
    generator = StaticCacheGenerator(model, tok, compile=False)
    prompts = _encode(tok, ["1 2 -> 3\n"])
    generator.generate(prompts, SamplingParams(n=2, max_new_tokens=4, seed=0))
    assert getattr(generator.decoder._local, "session", None) is None
    with generator.prefix_session():
        generator.generate(prompts, SamplingParams(n=2, max_new_tokens=4, seed=0))
        assert len(generator.decoder._local.session.current) == 1
        seen = []  # another thread is outside this thread's session
        thread = threading.Thread(target=lambda: seen.append(getattr(generator.decoder._local, "session", None)))
        thread.start()
        thread.join()
        assert seen == [None]
    assert generator.decoder._local.session is None
    compiled = StaticDecoder(model, compile=True)
    with compiled.prefix_session():
        assert getattr(compiled._local, "session", None) is None


def test_a_prefix_session_continues_every_chunk_of_a_call_and_samples_n_a_prompt(tiny):
    """A call larger than `max_batch` decodes in chunks: each continues from any chunk of the call before
    (rows move between chunks as episodes end); n samples of a prompt continue from its cached prefix too."""
    _, model, tok = tiny
    prompts = _encode(tok, ["3 7 25 -> 178\n", "1 2 -> 3\n", "9 9 -> 18\n"])
    session_generator = StaticCacheGenerator(model, tok, max_batch=4, compile=False)
    fresh_generator = StaticCacheGenerator(model, tok, max_batch=4, compile=False)
    prefills = _Prefills(model)
    try:
        with session_generator.prefix_session():
            first = session_generator.generate(prompts, SamplingParams(n=2, max_new_tokens=6, seed=0))  # chunks 4 + 2
            contexts = [prompts[s.prompt_index] + s.tokens + _encode(tok, [" ok" * (i % 3)])[0] + [tok.eos_token_id]
                        for i, s in enumerate(first)][::-1][:5]  # another order, one row fewer
            prefills.widths = []
            second = session_generator.generate(contexts, SamplingParams(n=1, max_new_tokens=6, seed=1))
            resumed = prefills.widths
            prefills.widths = []
            third = session_generator.generate(contexts[:2], SamplingParams(n=3, max_new_tokens=6, seed=2))
            assert prefills.widths == []
        for got, params, asked in ((second, SamplingParams(n=1, max_new_tokens=6, seed=1), contexts),
                                   (third, SamplingParams(n=3, max_new_tokens=6, seed=2), contexts[:2])):
            fresh = fresh_generator.generate(asked, params)
            assert [s.tokens for s in got] == [s.tokens for s in fresh]
            for a, b in zip(got, fresh):
                assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    finally:
        prefills.close()
    assert len(resumed) == 2 and max(resumed) <= len(" ok" * 2) + 1  # two chunks, each prefilling only what was added


def test_longest_shared_prefixes_is_the_brute_force_search():
    """Comparing a context only with the rows that begin as it does finds what comparing it with every row
    finds (the first row of the longest shared prefix, and its length): random rows with shared heads,
    ties, short rows and contexts, contexts no row begins like, and rows that share a preamble longer than
    the narrowing's HEAD tokens."""
    import random

    from softrl.models.static_generation import HEAD, longest_shared_prefixes

    def brute(context, rows):
        width = len(context) - 1
        shared = []
        for row in rows:
            n = 0
            while n < min(width, len(row)) and row[n] == context[n]:
                n += 1
            shared.append(n)
        return shared.index(max(shared)), max(shared)

    rng = random.Random(0)
    for trial in range(600):
        # half the trials: every row begins with a preamble longer than HEAD, as a chat template's does
        preamble = [7] * rng.choice([HEAD + 3, 2 * HEAD]) if trial % 2 else []
        heads = [[rng.randrange(3) for _ in range(rng.choice([2, HEAD, HEAD + 5]))] for _ in range(3)]
        rows = [preamble + rng.choice(heads)[: rng.randrange(1, HEAD + 6)]
                + [rng.randrange(3) for _ in range(rng.randrange(0, 30))] for _ in range(rng.randrange(1, 12))]
        contexts = [rng.choice(rows + [[]])[: rng.randrange(0, 50)] + [rng.randrange(3) for _ in range(rng.randrange(1, 20))]
                    for _ in range(8)]
        assert longest_shared_prefixes(contexts, rows) == [brute(c, rows) for c in contexts]
