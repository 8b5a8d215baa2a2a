"""Shared fixtures."""

import pytest
import torch


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """(directory, model, tokenizer): a random 2-layer Llama over the character tokenizer, saved to disk."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    from softrl.models.chartok import build_char_tokenizer
    from softrl.models.loading import load_causal_lm

    directory = tmp_path_factory.mktemp("tiny")
    tokenizer = build_char_tokenizer(directory)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(directory)
    model, tokenizer = load_causal_lm(directory)
    return directory, model, tokenizer
