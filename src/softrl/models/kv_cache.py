"""The key/value cache's name in transformers' calls. transformers 5 renamed the argument and output
field `past_key_values` to `cache`; the old name still works there but warns on every call (and is
to go in 5.40), while the 4.x releases softrl supports know only the old one."""

import dataclasses
from functools import cache as _once


@_once
def cache_name() -> str:
    """`cache` where the installed transformers uses the new name, else `past_key_values`."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"


def cache_arg(cache) -> dict:
    """The keyword argument that hands `cache` to a model's forward or `generate`."""
    return {cache_name(): cache}


def returned_cache(out):
    """The cache a forward pass returned (None where it kept none)."""
    return getattr(out, cache_name(), None)
