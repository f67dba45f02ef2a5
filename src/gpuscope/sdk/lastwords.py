"""A rank's last words: why it died, reported before it goes, without changing how it goes.

An uncaught exception (``sys.excepthook``) and a terminating signal (SIGTERM, which torchrun,
Slurm and Kubernetes send) are the common ends of a training process. :class:`LastWords`
hooks both, chaining whatever was installed before: the previous excepthook still prints the
traceback, and a signal whose previous disposition was the default is re-delivered with the
default restored, so the process exits with the same status as without the SDK. An exception in
another thread (``threading.excepthook``) does not end the process; it is remembered and named in
the last words if the rank dies afterwards.

A signal that arrives while the last words are being shipped (torchrun terminates a rank whose
peer just failed) waits until they are out, then takes effect.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

#: report(ts, reason, cause): ship the rank's failure and flush; called at most once
Report = Callable[[float, str, dict[str, Any]], None]
_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


def exception_cause(exc_type: type[BaseException], exc: BaseException | None) -> tuple[str, dict[str, Any]]:
    """The reason text and structured cause of an exception (type and message)."""
    message = str(exc) if exc is not None else ""
    reason = f"{exc_type.__name__}: {message}" if message else exc_type.__name__
    return reason, {"cause": "exception", "exception": exc_type.__name__, "message": message[:2000]}


def signal_cause(signum: int) -> tuple[str, dict[str, Any]]:
    name = signal.Signals(signum).name
    # the status a shell reports for a process the signal's default action ended
    return f"terminated by {name}", {"cause": "signal", "signal": name, "exit_code": 128 + signum}


class LastWords:
    """Installs exception and signal hooks that call ``report`` once when the rank dies."""

    def __init__(self, report: Report, signals: tuple[int, ...] = (signal.SIGTERM,)) -> None:
        self._report = report
        self._signals = signals
        self._lock = threading.RLock()  # a signal may arrive while the main thread holds it
        self._spoken = False
        self._speaking = False
        self._deferred: int | None = None
        self._thread_error: tuple[str, dict[str, Any]] | None = None
        self._prev_excepthook: Callable[[type[BaseException], BaseException, TracebackType | None], Any] = (
            sys.excepthook
        )
        self._prev_thread_hook: Callable[[threading.ExceptHookArgs], Any] = threading.excepthook
        self._prev_signals: dict[int, _Handler] = {}

    # -- installing ------------------------------------------------------------------------------

    def install(self) -> None:
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        self._prev_thread_hook = threading.excepthook
        threading.excepthook = self._thread_hook
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may set signal handlers
        for signum in self._signals:
            previous = signal.getsignal(signum)
            # ignored stays ignored (the process would not die), and a handler set outside
            # Python cannot be chained
            if previous is signal.SIG_IGN or previous is None:
                continue
            self._prev_signals[signum] = previous
            signal.signal(signum, self._on_signal)

    def uninstall(self) -> None:
        """Put back what was there, where nobody has replaced our hooks since."""
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_excepthook
        if threading.excepthook == self._thread_hook:
            threading.excepthook = self._prev_thread_hook
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._prev_signals.items():
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, previous)
        self._prev_signals.clear()

    # -- hooks -----------------------------------------------------------------------------------

    def speak(self, ts: float, reason: str, cause: dict[str, Any], report: Report | None = None) -> bool:
        """Report once (later deaths of the same rank are consequences); True if this call did.

        ``report`` replaces the failure report (a clean finish goes through here too, so that a
        signal arriving while it ships waits for it)."""
        with self._lock:
            if self._spoken:
                return False
            self._spoken = self._speaking = True
        if self._thread_error is not None and report is None:
            thread_reason, thread_cause = self._thread_error
            reason = f"{reason} (after {thread_reason})"
            cause = {**cause, "thread_error": thread_cause}
        previous = dict(self._prev_signals)  # the report uninstalls the hooks
        try:
            (report or self._report)(ts, reason, cause)
        finally:
            self._speaking = False
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            self._chain_signal(deferred, None, previous.get(deferred, signal.SIG_DFL))
        return True

    def _excepthook(
        self, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        ts = time.time()
        self._prev_excepthook(exc_type, exc, tb)  # the traceback first: the user's view comes first
        self.speak(ts, *exception_cause(exc_type, exc))

    def _thread_hook(self, args: threading.ExceptHookArgs) -> None:
        if self._thread_error is None and not issubclass(args.exc_type, SystemExit):
            reason, cause = exception_cause(args.exc_type, args.exc_value)
            name = args.thread.name if args.thread is not None else "?"
            self._thread_error = (f"{reason} in thread {name}", {**cause, "thread": name})
        self._prev_thread_hook(args)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._speaking:  # interrupting our own last words: let them finish first
            self._deferred = signum
            return
        previous = self._prev_signals.get(signum, signal.SIG_DFL)  # speaking uninstalls
        self.speak(time.time(), *signal_cause(signum))
        self._chain_signal(signum, frame, previous)

    def _chain_signal(self, signum: int, frame: FrameType | None, previous: _Handler) -> None:
        if callable(previous):
            previous(signum, frame)
            return
        if threading.current_thread() is threading.main_thread():
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
