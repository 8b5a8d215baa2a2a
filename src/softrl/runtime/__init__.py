"""Runtimes: where generation and learning run and how they talk (local threads, or Ray actors)."""
