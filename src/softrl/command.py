"""The `softrl` console script. Ctrl-C while the command line is still loading (typer, rich, torch,
then typer building the command: a second or more) ends it with one line and status 130, never a
traceback; during a command, typer ends it with status 130 and runs stop cleanly (runtime/stop.py);
once the command is over, while Python exits, Ctrl-C is ignored. Before this module runs (the
interpreter starting, the console script's own `import re`) Python's default handler prints a
traceback: no program can catch that."""

import sys


def main() -> None:
    try:
        import signal

        from softrl.cli import command_line, entry

        command = command_line()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    try:
        entry(command)
    finally:  # the command is over: a Ctrl-C now would land in Python's exit handlers (torch's) as a traceback
        signal.signal(signal.SIGINT, signal.SIG_IGN)
