"""The documented limits on inputs (docs/USAGE.md, "When something goes wrong"), in one place: a
value beyond one is refused in one line naming it, before it can fill the memory or hang."""

MAX_SEED = 2**32 - 1  # numpy's bound; torch's and Python's are wider
MAX_PROMPTS = 10_000_000  # a task's size: a generated task builds every prompt up front
MAX_RECORD_CHARS = 16 * 2**20  # characters of one JSONL record (a dataset or import line); no context is longer
MAX_SANDBOX_INPUT = 16 * 2**20  # `softrl sandbox`'s program, stdin and tests file
MAX_TIMEOUT = 86_400  # seconds of a sandbox run: a day (Python's timers overflow near 1e7 s)
MAX_TOY_SEQUENCES = 2**20  # V**L of `softrl toy`'s exact problem, which enumerates every sequence
