"""Benchmarks: learning (the papers' claims) and systems (speed, memory, throughput)."""
