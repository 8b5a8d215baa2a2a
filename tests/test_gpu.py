"""CUDA only (`make test-gpu`): the learner, log-probs and both generation backends on a GPU, in fp32
and under bf16 autocast, against the CPU and against a fresh forward pass. Tolerances: fp32 on CUDA
uses TF32 matmuls (10-bit mantissa), so CUDA-vs-CPU numbers agree to about 1e-2 relative, while
same-device exactness checks (padded vs unpadded, chunked vs unchunked, behaviour log-probs vs a
fresh forward) hold to 1e-4 in fp32 and 5e-2 in bf16."""

import copy
import json

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

pytest.importorskip("transformers")

from softrl.config import load_config  # noqa: E402
from softrl.models.device import Placement  # noqa: E402
from softrl.models.logprobs import pad_batch, token_logprobs, token_stats  # noqa: E402
from test_device import batch_of, learner_for  # noqa: E402
from test_training import seed_store, tiny_overrides  # noqa: E402


def cuda(autocast="off"):
    return Placement.create("cuda", "float32", autocast)


@pytest.mark.parametrize("algorithm", ["spo", "ppo", "grpo", "agro-off"])
def test_learner_step_on_cuda_matches_the_cpu(tiny, algorithm):
    batch = batch_of(tiny)
    on_cpu = learner_for(tiny, [], algorithm=algorithm).step(batch)
    on_gpu = learner_for(tiny, [], placement=cuda(), algorithm=algorithm)
    assert next(on_gpu.policy.model.parameters()).is_cuda
    metrics = on_gpu.step(batch)
    for key in ("loss", "grad_norm", "kl_ref", "entropy"):
        assert metrics[key] == pytest.approx(on_cpu[key], rel=2e-2, abs=2e-3), key
    mixed = learner_for(tiny, [], placement=cuda("auto"), algorithm=algorithm)
    assert mixed.placement.compute == torch.bfloat16
    assert mixed.step(batch)["loss"] == pytest.approx(on_cpu["loss"], rel=0.1, abs=0.05)


def test_a_moving_average_reference_on_cuda_keeps_its_average_in_fp32_beside_a_bf16_copy(tiny):
    """Under bf16 autocast the reference is stored in bf16 (the generation dtype, issue 51's memory), and the
    average that moves it by 1 - tau a step stays in fp32 on the device; after a few steps the copy is the
    average rounded, and the steps' losses follow the CPU learner's."""
    ema = ["data.objective.reference_update={ema: 0.9}"]
    batch = batch_of(tiny)
    on_cpu = learner_for(tiny, ema)
    mixed = learner_for(tiny, ema, placement=cuda("auto"))
    for _ in range(3):
        cpu_metrics, gpu_metrics = on_cpu.step(batch), mixed.step(batch)
        assert gpu_metrics["loss"] == pytest.approx(cpu_metrics["loss"], rel=0.1, abs=0.05)
    assert mixed.placement.frozen == torch.bfloat16  # else no average is kept beside the copy
    moving = mixed.moving
    name, copy_ = next(iter(moving.model.model.named_parameters()))
    average = moving.average[name]
    assert copy_.dtype == torch.bfloat16 and copy_.is_cuda and average.dtype == torch.float32 and average.is_cuda
    assert torch.equal(copy_, average.to(torch.bfloat16)) and moving.version == 3
    start = dict(on_cpu.reference.model.named_parameters())[name]
    assert not torch.equal(average.cpu(), start.detach().float())  # it moved


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 5e-2)])
def test_padded_and_chunked_logprobs_on_cuda(tiny, dtype, tol):
    _, model, tokenizer = tiny
    model = copy.deepcopy(model).to(device="cuda", dtype=dtype)  # the fixture's model stays as it is
    prompts, responses = [[5, 6, 7], [8, 9]], [[10, 11, 12, 13], [14]]
    batch = pad_batch(prompts, responses, tokenizer.pad_token_id)
    with torch.no_grad():
        full, mask, _ = token_logprobs(model, batch)
        chunked = token_stats(model, batch, entropy=True, reference=model, chunk_elements=64)
        for i in range(2):  # each row alone, unpadded
            alone, _, _ = token_logprobs(model, pad_batch([prompts[i]], [responses[i]], tokenizer.pad_token_id))
            n = len(responses[i])
            assert torch.allclose(full[i, :n].float().cpu(), alone[0, :n].float().cpu(), atol=tol)
    assert full.is_cuda and torch.allclose(full.cpu(), chunked.logp.cpu(), atol=tol)
    assert chunked.kl.abs().max().item() < tol  # KL of a model to itself


@pytest.mark.parametrize("backend", ["hf", "static"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 5e-2)])
def test_behaviour_logprobs_on_cuda_match_a_fresh_forward(tiny, backend, dtype, tol):
    from softrl.models.generation import SamplingParams, make_generator

    _, model, tokenizer = tiny
    model = copy.deepcopy(model).to(device="cuda", dtype=dtype).eval()
    generator = make_generator(model, tokenizer, backend)
    prompts = [[5, 6, 7, 8], [9, 10]]
    for temperature in (1.0, 0.7):
        samples = generator.generate(prompts, SamplingParams(n=3, max_new_tokens=12, temperature=temperature, seed=1))
        batch = pad_batch([prompts[s.prompt_index] for s in samples], [s.tokens for s in samples],
                          tokenizer.pad_token_id)
        with torch.no_grad():
            logits = model(input_ids=batch.input_ids.cuda(), attention_mask=batch.attention_mask.cuda(),
                           position_ids=batch.position_ids.cuda()).logits.float() / temperature
        fresh = torch.log_softmax(logits, -1)
        for b, s in enumerate(samples):
            start = int(batch.response_start[b])
            for t, (token, logp) in enumerate(zip(s.tokens, s.logprobs)):
                assert abs(fresh[b, start + t - 1, token].item() - logp) < tol * max(1.0, abs(logp))


def test_compiled_generation_runs_in_a_second_thread(tiny):
    """A decode compiled with CUDA graphs in this thread, then one of a new shape in another (async
    generation's), which records its own graphs: torch before 2.13 failed a bare assert there
    (pytorch#123177; the likely cause of an async run's failure on the 0.53B model, 2026-11-27). Same
    seed and shape in either thread, same samples."""
    import threading

    from softrl.models.generation import SamplingParams, StaticCacheGenerator

    _, model, tokenizer = tiny
    generator = StaticCacheGenerator(copy.deepcopy(model).to("cuda").eval(), tokenizer, compile=True)
    params = SamplingParams(n=2, max_new_tokens=12, seed=3)
    generator.generate([[5, 6, 7], [8, 9]], params)  # this thread's graphs (2 prompts)
    three = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    there = {}

    def worker():
        try:
            there["samples"] = generator.generate(three, params)  # a shape this thread has not recorded
        except BaseException as e:  # noqa: BLE001 - the test's thread reports it
            there["error"] = repr(e)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert "error" not in there, there.get("error")
    assert [s.tokens for s in there["samples"]] == [s.tokens for s in generator.generate(three, params)]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_trains_on_cuda(tiny, tmp_path, mode):
    from softrl.runtime.local import train

    seed_store(tmp_path)
    config = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{
        "model.device": "cuda", "runtime.mode": mode, "optim.steps": 3, "log.checkpoint_every": 3,
        "eval.stats": "true"}))
    summary = train(config, log=lambda m: None)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert summary["steps"] == 3 and all(r["loss"] == r["loss"] for r in records if "loss" in r)
    assert summary["pass@1_after"] is not None


def test_out_of_memory_on_cuda_is_one_line(capsys):
    import typer

    from softrl.cli.common import one_line_errors

    with pytest.raises(typer.Exit), one_line_errors():
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "optim.micro_batch_tokens" in err
