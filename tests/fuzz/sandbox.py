"""Run one function in a forked child under memory and CPU limits.

The fuzz target can make C code (thriftpy2's decoder) allocate gigabytes, spin for seconds
or, when an allocation fails, write through a null pointer. None of that may take the test
process with it: the child gets an address-space cap (an allocation past it fails at once
instead of eating the machine) and a CPU-time cap (a spinning loop is killed by SIGXCPU),
and whatever happens to it comes back as a value.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import resource
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

GiB = 1 << 30


@dataclass(frozen=True)
class Died:
    """The child ended without a result: killed by a signal, or exited on its own."""

    how: str


def address_space() -> int:
    """This process's virtual size, in bytes (what an address-space cap counts)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def limit_memory(headroom: int) -> None:
    """Cap this process's address space at its current size plus ``headroom``."""
    cap = address_space() + headroom
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def isolated(
    fn: Callable[..., Any], *args: Any, headroom: int = 3 * GiB, cpu_seconds: int = 20
) -> Any:
    """``fn(*args)`` in a forked child: its return value, or the exception it raised
    (re-raised here), or :class:`Died`."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 0
        try:
            os.close(read_end)
            faulthandler.disable()  # the parent reports a fatal signal; no dump on stderr
            limit_memory(headroom)
            used = int(resource.getrusage(resource.RUSAGE_SELF).ru_utime) + 1
            resource.setrlimit(resource.RLIMIT_CPU, (used + cpu_seconds, used + cpu_seconds + 5))
            try:
                outcome: tuple[str, Any] = ("value", fn(*args))
            except BaseException as exc:  # handed to the parent, whatever it is
                outcome = ("raised", exc)
            try:
                payload = pickle.dumps(outcome)
            except Exception as exc:
                payload = pickle.dumps(("raised", RuntimeError(f"unpicklable outcome: {exc!r}")))
            with os.fdopen(write_end, "wb") as out:
                out.write(payload)
        except BaseException:
            status = 70
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as inp:
        payload = inp.read()
    _, wait_status = os.waitpid(pid, 0)
    if payload:
        kind, value = pickle.loads(payload)
        if kind == "raised":
            raise value
        return value
    if os.WIFSIGNALED(wait_status):
        return Died(f"killed by {signal.Signals(os.WTERMSIG(wait_status)).name}")
    return Died(f"exited with status {os.WEXITSTATUS(wait_status)} without a result")
