"""The Hugging Face hub, offline unless asked: a hub id (a model `org/name`, a dataset
`hf:org/name`) is read from the local cache, and an id the cache lacks is refused at once, in one
line saying how to get it, instead of after half a minute of retries on a network that is often not
there (a cluster node, a sandbox). `HF_HUB_OFFLINE=0`, set explicitly, lets transformers and datasets
download as they do by default (models/loading.py `hub_files`, tasks/records.py `_hub_dataset`)."""

from __future__ import annotations

import os
from pathlib import Path

ONLINE_HINT = "or set HF_HUB_OFFLINE=0 to let softrl download it"


def online() -> bool:
    """Whether the hub may be asked: only when HF_HUB_OFFLINE is set to a false value (0, false, no, off)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("0", "false", "no", "off")


def looks_like_hub_id(name: str | Path, slashes: tuple[int, ...] = (1,)) -> bool:
    """Not a local path, and shaped as a hub id (`org/name`; `slashes` (0, 1) also allows `name`)."""
    text = str(name)
    return (bool(text) and not Path(text).exists() and not Path(text).is_absolute() and not text.startswith((".", "~"))
            and text.count("/") in slashes)
