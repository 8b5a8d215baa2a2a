"""The `softrl` command (root.py assembles it). `app`, `MODULES`, `command_line` and `entry` are
loaded on first use, so that a command group's own module (the benchmarks' `softrl_bench.cli`)
can import `softrl.cli.common` without assembling the app halfway through its own import."""

ASSEMBLED = ("app", "MODULES", "command_line", "entry", "add_installed_groups")


def __getattr__(name: str):
    if name in ASSEMBLED:
        import importlib

        return getattr(importlib.import_module("softrl.cli.root"), name)
    raise AttributeError(f"module 'softrl.cli' has no attribute {name!r}")
