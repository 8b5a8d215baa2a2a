"""Stopping a run on SIGINT (Ctrl-C) or SIGTERM without losing it. While a run trains, the first
signal asks it to stop after the step in progress: that step ends, a checkpoint of it is written, and
the run raises `RunStopped`. A signal outside the steps (loading, Q0, an evaluation, the end), or a
second one, raises at once; a checkpoint being written is finished first either way, so the newest
checkpoint is always a complete one."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from pathlib import Path

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunStopped(KeyboardInterrupt):
    """Training stopped by SIGINT or SIGTERM. `step`: that of the run's newest complete checkpoint,
    where `resume` continues (0: none yet, a resumed run starts over); `exit_status` 128 + the
    signal's number (130 for SIGINT, 143 for SIGTERM), as a shell reports it. A KeyboardInterrupt, so
    that code which stops on Ctrl-C still does."""

    def __init__(self, run_dir: Path, step: int, signum: int):
        self.run_dir, self.step, self.signum = Path(run_dir), step, signum
        self.exit_status = 128 + signum
        super().__init__(self.line("resume=True (softrl.train) or --resume (softrl train)"))

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    def line(self, resume: str) -> str:
        """The one-line report, `resume` saying how to continue."""
        if not self.step:
            return (f"stopped by {self.signal_name} before the first checkpoint of {self.run_dir}: "
                    f"{resume} starts it over from step 0")
        checkpoint = self.run_dir / "checkpoints" / f"step-{self.step:06d}"
        return f"stopped by {self.signal_name} at step {self.step} (checkpoint {checkpoint}): continue with {resume}"


class StopRequests:
    """Turns SIGINT and SIGTERM into a stop request while installed (`installed()`; in the main
    thread only: elsewhere Python delivers no signals). Outside `steps()` a signal raises
    KeyboardInterrupt at once; within them the first one only sets `requested`, which the loop reads
    after each step (then `interrupt()`), and a second raises. `held()` (and `deferred()`) keep a
    raise back until the block ends: a checkpoint being written is finished first."""

    def __init__(self):
        self.signum: int | None = None  # the first signal received
        self.stepping = False
        self.deferring = 0
        self.pending = False  # a raise held back by `deferred`
        self.raised = False

    def _handle(self, signum, frame) -> None:
        if self.raised:  # already stopping: let the clean-up run
            return
        first = self.signum is None
        self.signum = self.signum or signum
        if self.stepping and first:
            return  # the loop stops after this step
        if self.deferring:
            self.pending = True
            return
        self.interrupt()

    def interrupt(self) -> None:
        self.raised = True
        raise KeyboardInterrupt

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @contextmanager
    def installed(self):
        global _active
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.getsignal(s) for s in SIGNALS}
        outer, _active = _active, self
        try:
            for s in SIGNALS:
                signal.signal(s, self._handle)
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)
            _active = outer

    @contextmanager
    def steps(self):
        """The training loop: a first signal waits for the loop to read `requested`."""
        self.stepping = True
        try:
            yield
        finally:
            self.stepping = False

    @contextmanager
    def held(self):
        self.deferring += 1
        try:
            yield
        finally:
            self.deferring -= 1
        if not self.deferring and self.pending and not self.raised:  # not when the block raised
            self.pending = False
            self.interrupt()


_active: StopRequests | None = None


@contextmanager
def deferred():
    """Hold a stop signal back until the block ends (whatever installed the handlers raises it then)."""
    if _active is None:
        yield
        return
    with _active.held():
        yield
