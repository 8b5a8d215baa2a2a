"""Tasks: prompts with ids, and graders that turn a response into (reward, passed, details)."""

from softrl.tasks.base import Grade, Prompt, Task, extract_answer, extract_code
from softrl.tasks.records import RecordError, read_records
from softrl.tasks.registry import load_task

__all__ = ["Grade", "Prompt", "RecordError", "Task", "extract_answer", "extract_code", "load_task", "read_records"]
