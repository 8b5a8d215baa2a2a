"""softrl: reinforcement-learning post-training of language models from any data (SPO, AGRO)."""

__version__ = "0.1.0"
