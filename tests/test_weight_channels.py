"""Weights from the learner to a rollout worker over a torch.distributed channel (runtime/weights.py):
exact in the worker's dtype, in buckets, and a dead worker's channel is reported, not hung on."""

import multiprocessing

import pytest
import torch

from softrl.runtime import weights as channel


def model(seed: int):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 50))
    net[2].weight = net[0].weight  # tied, as a causal LM's head often is: sent once
    return net


def worker(address, epoch, dtype, out, die: bool, bucket: int = channel.BUCKET_ELEMENTS):
    channel.BUCKET_ELEMENTS = bucket  # a fresh process: the test's setting, as the learner's end has it
    receiver = channel.WeightReceiver(address, 0, epoch)
    if die:
        raise SystemExit(0)  # gone before the weights come
    net = model(seed=1).to(dtype)
    receiver.receive(net, dtype)
    # by value (numpy), not as tensors shared through the worker's file descriptors: those vanish with the
    # worker if it exits before the test reads them (FileNotFoundError on a loaded machine, CI 2026-11-28)
    out.put([t.float().numpy() for t in channel.weight_tensors(net)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_worker_receives_the_learners_weights(dtype, monkeypatch):
    monkeypatch.setattr(channel, "BUCKET_ELEMENTS", 300)  # several buckets, tensors split across none
    learner = model(seed=0)
    sender = channel.WeightSender()
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    proc = spawn.Process(target=worker, args=(sender.address, 1, dtype, out, False, 300))
    proc.start()
    sender.open(0, 1, dtype)
    assert sender.send(learner, [0]) == {0: True}
    got = [torch.from_numpy(array) for array in out.get(timeout=60)]
    proc.join(timeout=60)
    sent = channel.weight_tensors(learner)
    assert len(got) == len(sent) == 4  # the embedding (= the head's weight, once), two biases, one weight
    assert all(torch.equal(g, s.to(dtype).float()) for g, s in zip(got, sent))


def test_a_dead_workers_channel_is_reported():
    sender = channel.WeightSender()
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    proc = spawn.Process(target=worker, args=(sender.address, 1, torch.float32, out, True))
    proc.start()
    sender.open(0, 1, torch.float32)
    proc.join(timeout=60)
    assert sender.send(model(0), [0, 1]) == {0: False, 1: False}  # worker 1 never had one
    assert 0 not in sender.channels
