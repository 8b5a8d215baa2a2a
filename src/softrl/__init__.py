"""softrl: reinforcement-learning post-training of language models from any data: SPO (Soft Policy
Optimization, Cohen et al. 2025) and AGRO (Any-Generation Reward Optimization).

`softrl.train(...)`, `softrl.evaluate(...)`, `softrl.Run` and `softrl.Callback` are the Python API
(softrl/api.py); they load on first use, so `import softrl` stays light."""

__version__ = "0.1.0"
__all__ = ["Callback", "Run", "evaluate", "train"]


def __getattr__(name: str):
    if name in __all__:
        from softrl import api

        return getattr(api, name)
    raise AttributeError(f"module 'softrl' has no attribute {name!r}")
