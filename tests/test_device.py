"""One device: placement and precision, token-budget micro-batches, activation checkpointing, losses
that never read the device, and out-of-memory as one line. Everything here runs on the CPU; the
CUDA-only checks are in test_gpu.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from softrl.config import ConfigError, load_config  # noqa: E402
from softrl.models.device import CPU, Placement, resolve_device  # noqa: E402
from softrl.models.wrappers import PolicyModel, ReferenceModel, ValueModel  # noqa: E402
from softrl.training import learner as learner_module  # noqa: E402
from softrl.training.learner import Learner, micro_batches  # noqa: E402
from test_training import make_rows, seed_store, tiny_overrides  # noqa: E402


def batch_of(tiny, n_prompts=4, n=3):
    from softrl.models.loading import encode_prompt
    from softrl.training.batch import make_batch

    rows, fingerprint, task = make_rows(tiny, n_prompts, n)
    tok = tiny[2]
    return make_batch(rows, fingerprint, tok.pad_token_id, lambda t: encode_prompt(tok, t),
                      lambda t: tok(t)["input_ids"], {p.id: 0.5 for p in task.prompts()})


def learner_for(tiny, overrides, placement=CPU, algorithm="spo"):
    config = load_config(None, [f"data.objective.algorithm={algorithm}", "sampling.samples_per_prompt=3",
                                "data.mix={online: 1}", "optim.warmup_steps=0", *overrides])
    policy = PolicyModel.load(tiny[0])
    placement.place(policy.model)
    reference = ReferenceModel.from_policy(policy)
    value = placement.place(ValueModel(reference.model)) if algorithm == "ppo" else None
    placement.place(reference.model, frozen=True)
    if config.optim.gradient_checkpointing:
        policy.checkpoint_activations()
    return Learner(policy, reference, config, value, placement)


def test_placement_on_a_machine_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") and resolve_device("cpu") == torch.device("cpu")
    for bad, message in [("cuda", "sees no CUDA device"), ("cuda:1", "sees no CUDA device"), ("gpu", "auto, cpu, cuda")]:
        with pytest.raises(ValueError, match=message):
            resolve_device(bad)
    auto = Placement.create("auto")
    assert auto.compute is None and auto.frozen == torch.float32  # no bf16 autocast on the CPU unless asked
    forced = Placement.create("cpu", "float32", "bfloat16")
    assert forced.compute == torch.bfloat16 and forced.frozen == torch.bfloat16 and forced.weights == torch.float32
    assert Placement.create("cpu", "bfloat16", "auto").frozen == torch.bfloat16
    x = torch.ones(3)
    assert CPU.to_device(x) is x


HEAP_PROBE = """
import resource, sys, torch
from pathlib import Path
from softrl.models.device import CPU
def rss_mib():
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmRSS"))
    return int(line.split()[1]) // 1024
policy = sys.argv[1]
applied = CPU.host_allocator(lean=policy == "lean") if policy != "glibc" else True
x = torch.ones(2**19); del x  # one 2 MiB block freed: glibc's own threshold rises past it
base = rss_mib()
blocks = [torch.ones(2**19) for _ in range(100)]  # 200 MiB in 2 MiB blocks
del blocks[:-1]  # all freed but the last, which pins the heap's top
held = rss_mib() - base
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
blocks += [torch.ones(2**19) for _ in range(100)]  # the same again: fresh pages, or the freed ones
print(applied, held, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_host_allocator_policies():
    """`Placement.host_allocator` on the CPU: lean (under activation checkpointing) returns freed 2 MiB
    tensors to the system, which glibc's own policy keeps; fast reuses freed pages (no page faults)."""
    def probe(policy: str) -> tuple[str, int, int]:
        out = subprocess.run([sys.executable, "-c", HEAP_PROBE, policy], capture_output=True, text=True, check=True)
        applied, held, faults = out.stdout.split()
        return applied, int(held), int(faults)

    applied, lean_held, lean_faults = probe("lean")
    if applied == "False":
        pytest.skip("not glibc: no mallopt")
    _, glibc_held, _ = probe("glibc")
    _, fast_held, fast_faults = probe("fast")
    assert lean_held < 30 and glibc_held > 150 and fast_held > 150
    assert fast_faults < lean_faults / 3  # the lean policy maps and faults in every block afresh
    assert not Placement(torch.device("cuda"), torch.float32, None).host_allocator()


def test_device_settings_are_checked_at_the_door(monkeypatch, tiny, tmp_path):
    with pytest.raises(ConfigError, match="model.device: must be auto, cpu, cuda or cuda:N, got 'gpu'"):
        load_config(None, ["model.device=gpu"])
    with pytest.raises(ConfigError, match="model.autocast"):
        load_config(None, ["model.autocast=fp16"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    from softrl.assemble import RunParts

    config = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{"model.device": "cuda"}))
    with pytest.raises(ConfigError, match="model.device: device 'cuda': this PyTorch sees no CUDA device"):
        RunParts(config)


def test_token_budget_micro_batches_keep_groups_whole_within_the_budget(tiny):
    batch = batch_of(tiny, n_prompts=6, n=3)
    lengths = (batch.padded.response_start + batch.padded.response_len).tolist()
    groups = [set(range(g, g + 3)) for g in range(0, len(batch), 3)]
    for budget in (1, 60, 200, 10_000):
        chunks = micro_batches(batch, 1, lambda source: 3, max_tokens=budget)
        rows = sorted(i for _, index in chunks for i in index)
        assert rows == list(range(len(batch)))  # every row once
        for _, index in chunks:
            assert all(g <= set(index) or not g & set(index) for g in groups)  # groups whole
            cost = len(index) * max(lengths[i] for i in index)
            assert cost <= budget or len(index) == 3  # over budget only as a lone group
        if budget == 10_000:
            assert len(chunks) == 1
        if budget == 1:
            assert len(chunks) == len(groups)


@pytest.mark.parametrize("algorithm", ["spo", "ppo"])
def test_token_budget_and_activation_checkpointing_give_the_same_step(tiny, algorithm):
    batch = batch_of(tiny)
    results = []
    for overrides in ([], ["optim.micro_batch_tokens=60"], ["optim.gradient_checkpointing=true"]):
        torch.manual_seed(0)
        learner = learner_for(tiny, overrides, algorithm=algorithm)
        if overrides == ["optim.gradient_checkpointing=true"]:
            model = learner.policy.model
            assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing
        results.append((learner.step(batch), [p.detach().clone() for p in learner.params]))
    (base, base_params), *others = results
    for metrics, params in others:
        for key in ("loss", "grad_norm", "kl_ref", "entropy"):
            assert metrics[key] == pytest.approx(base[key], rel=1e-5, abs=1e-6), key
        # 1e-5 of lr 1e-4: AdamW's first step is about lr * sign(g), so the rounding of a near-zero gradient
        # (shared prompts by default, not under checkpointing) moves a weight by ~1e-6
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(base_params, params))


def test_losses_never_read_a_tensor(tiny, monkeypatch):
    """On a GPU every `.item()` in a loss is a synchronisation per micro-batch: losses hand back
    detached tensors, and the learner reads them once per step. Value checks read host tensors only
    (`violates`), so the tensors are put on the meta device for them."""
    from softrl.algorithms.common import violates

    assert violates(torch.tensor([False, True])) and not violates(torch.ones(2, device="meta") > 0)
    real_loss = learner_module.objective_loss

    def no_reads(options, inputs):
        with monkeypatch.context() as m:
            for name in ("item", "tolist", "__float__"):
                m.setattr(torch.Tensor, name, lambda *a: pytest.fail(f"a loss read a tensor ({name})"))
            loss, parts = real_loss(options, inputs)
        assert all(isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad for v in parts.values())
        return loss, parts

    monkeypatch.setattr(learner_module, "objective_loss", no_reads)
    from softrl.objectives import REGISTRY

    batch = batch_of(tiny, n_prompts=2)
    for algorithm in REGISTRY:
        metrics = learner_for(tiny, [], algorithm=algorithm).step(batch)
        assert all(isinstance(v, float) and v == v for v in metrics.values()), algorithm


def test_bf16_autocast_step_on_the_cpu_is_close_to_fp32(tiny):
    batch = batch_of(tiny)
    fp32 = learner_for(tiny, []).step(batch)
    learner = learner_for(tiny, [], placement=Placement.create("cpu", "float32", "bfloat16"))
    assert next(learner.reference.model.parameters()).dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in learner.params)  # fp32 weights and so fp32 AdamW state
    mixed = learner.step(batch)
    assert mixed["loss"] == pytest.approx(fp32["loss"], rel=0.05, abs=0.02)
    assert all(s["exp_avg"].dtype == torch.float32 for s in learner.optimizer.state.values())


def test_out_of_memory_is_one_line_naming_the_settings(capsys):
    import typer

    from softrl.cli.common import one_line_errors

    with pytest.raises(typer.Exit) as exit_info, one_line_errors():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB\nmore detail")
    err = capsys.readouterr().err
    assert exit_info.value.exit_code == 2 and err.count("\n") == 1
    assert "Tried to allocate 20.00 GiB" in err and "optim.micro_batch_tokens" in err and "gradient_checkpointing" in err


def test_static_backend_trains_with_a_token_budget_and_checkpointing(tiny, tmp_path):
    from softrl.runtime.local import train

    seed_store(tmp_path)
    config = load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{
        "sampling.backend": "static", "optim.micro_batch_tokens": 64, "optim.gradient_checkpointing": "true",
        "model.device": "cpu", "optim.steps": 2, "log.checkpoint_every": 2}))
    summary = train(config, log=lambda m: None)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert summary["steps"] == 2 and [r["step"] for r in steps] == [1, 2]
    assert all(r["loss"] == r["loss"] for r in steps)
    for r in steps:  # the split of a step's time, from the runtime (generation) and the learner
        parts = [r[f"time/{name}"] for name in ("generation", "forward", "backward", "optimizer")]
        assert all(0 < seconds < 60 for seconds in parts), r


def test_a_run_makes_one_generator_per_model_for_all_its_evaluations(tiny, tmp_path):
    """Q0, rollouts and every evaluation of a model share its generator: the static backend's KV caches
    (and, on CUDA, its compiled decode step) are made once per model and shape, not once per evaluation."""
    from softrl.assemble import RunParts

    seed_store(tmp_path)
    run = RunParts(load_config(None, tiny_overrides(str(tiny[0]), str(tmp_path), **{"sampling.backend": "static"})))
    first = run.evaluate(run.policy.model)
    decoder = run.generator(run.policy.model).decoder
    caches = {rows: id(cache) for rows, (cache, _) in decoder._caches.items()}
    assert caches and run.evaluate(run.policy.model)["pass@1"] == first["pass@1"]  # same seed, same samples
    assert run.generator(run.policy.model).decoder is decoder
    assert {rows: id(cache) for rows, (cache, _) in decoder._caches.items()} == caches  # reused, not remade
    assert run.spec(run.policy.model, "eval").generator is run.worker(run.policy.model).spec.generator
    run.q0()  # the reference samples once: no generator (and no KV caches) kept for it
    assert list(run.generators) == [id(run.policy.model)]
