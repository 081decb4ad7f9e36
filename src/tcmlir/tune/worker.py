"""Tuning worker processes: started as a fresh interpreter running tcmlir, never the user's program.

A worker is ``python -c <bootstrap> FD PATH`` whose bootstrap puts the tuner's ``sys.path``
in place and calls `worker_loops.main`: the child imports tcmlir and nothing else of the parent —
not its ``__main__`` — so a script that calls ``fn.autotune`` at module level without an
``if __name__ == "__main__":`` guard, or a notebook cell, tunes (multiprocessing's ``spawn``
and ``forkserver`` re-import the parent's main module in every child, which re-runs such a
script and fails with "An attempt has been made to start a new process before the current
process has finished its bootstrapping phase").

Parent and child talk over a socket pair wrapped as `multiprocessing.connection.Connection`
(pickled messages). The first message names the child's role and its arguments (objects of
tcmlir, numpy and the standard library only): ``"gpu"`` runs `worker_loops.gpu_worker_main`,
``"compile"`` `worker_loops.compile_worker_main`. The child has its own session (a Ctrl-C in
the terminal reaches only the tuner) and ends when the tuner's end of the pipe closes. A child
that dies is seen at once (its end of the socket closes); one that does not answer within
the start-up time is killed and reported.
"""

from __future__ import annotations

import json
import multiprocessing.connection as mp_connection
import os
import signal
import socket
import subprocess
import sys
import weakref
from typing import Any

from ..errors import TCError

__all__ = ["FAULT_ENV", "ROLES", "WorkerProcess", "exit_text"]

ROLES = ("gpu", "compile")
# the test hook that makes workers crash or hang on chosen candidates (`worker_loops.fault_action`)
FAULT_ENV = "TCMLIR_TUNE_FAULT"

_BOOTSTRAP = ("import sys, json; sys.path[:0] = json.loads(sys.argv[2]); "
              "from tcmlir.tune.worker_loops import main; main(int(sys.argv[1]))")


class _Child:
    """The child process, with the parts of `multiprocessing.Process` the evaluators use."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.pid = popen.pid

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()


def _reap(popen: subprocess.Popen) -> None:
    if popen.poll() is None:
        popen.kill()
        popen.wait(5)


class WorkerProcess:
    """A worker child (see the module docstring) and its pipe: start it, then `wait_ready`
    (which returns what the child said when it was ready), so that several start in parallel.

    ``role``: one of `ROLES`; ``args``: its loop's arguments after the connection; ``env``:
    variables set in the child's environment (e.g. ``CUDA_VISIBLE_DEVICES``)."""

    def __init__(self, role: str, args: tuple, what: str, env: dict[str, str] | None = None):
        if role not in ROLES:
            raise ValueError(f"unknown worker role {role!r}")
        self.what = what
        mine, theirs = socket.socketpair()
        self.parent = mp_connection.Connection(mine.detach())
        child_fd = theirs.detach()
        try:
            os.set_inheritable(child_fd, True)
            popen = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, str(child_fd), json.dumps(sys.path)],
                pass_fds=(child_fd,), env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            self.parent.close()
            raise TCError(f"{what} could not be started: {exc}") from None
        finally:
            os.close(child_fd)
        self.proc = _Child(popen)
        # a tuner that dies without closing its pool must not leave workers behind
        self._finalizer = weakref.finalize(self, _reap, popen)
        try:
            self.parent.send((role, args))
        except OSError:
            pass  # it died at once: `wait_ready` reports how

    def wait_ready(self, startup_s: float) -> Any:
        if not self.parent.poll(startup_s):
            self.kill()
            raise TCError(f"{self.what} did not start within {startup_s:.0f} s")
        try:
            kind, payload = self.parent.recv()
        except (EOFError, OSError):
            self.proc.join(5)
            kind, payload = "fatal", (f"it {exit_text(self.proc.exitcode)} while starting "
                                      "(its error output is above)")
        if kind != "ready":
            self.kill()
            raise TCError(f"{self.what} failed to start:\n{payload}")
        return payload

    def receive(self) -> tuple[str, Any] | None:
        """The child's answer if one is there, ("crash", why) if it died, else None."""
        try:
            if self.parent.poll(0):
                return self.parent.recv()
        except (EOFError, OSError):
            self.proc.join(5)
            return ("crash", f"worker {exit_text(self.proc.exitcode)}")
        if not self.proc.is_alive():
            return ("crash", f"worker {exit_text(self.proc.exitcode)}")
        return None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)
        self.parent.close()


def exit_text(code: int | None) -> str:
    """How a child ended: "was killed by SIGSEGV", "exited with code 3", "died"."""
    if code is None:
        return "died"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
