"""A character-level tokenizer built with `tokenizers`, saved as an ordinary Hugging Face tokenizer."""

from __future__ import annotations

import string
from pathlib import Path

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = [c for c in string.printable if c not in "\r\x0b\x0c"]  # printable ASCII, tab and newline


def build_char_tokenizer(directory: str | Path | None = None):
    """PreTrainedTokenizerFast over printable ASCII plus <pad> <bos> <eos> <unk>; saved to `directory`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                        eos_token="<eos>", unk_token="<unk>")
    if directory is not None:
        tokenizer.save_pretrained(str(directory))
    return tokenizer
