"""The `softrl` console script. Ctrl-C while the command line is still loading (typer, rich, torch:
a second or more) ends it with one line and status 130, never a traceback; during a command, typer
ends it with status 130 and runs stop cleanly (runtime/stop.py)."""

import sys


def main() -> None:
    try:
        from softrl.cli import entry
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    entry()
