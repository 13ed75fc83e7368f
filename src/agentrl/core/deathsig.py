"""Die with the parent process (Linux's PR_SET_PDEATHSIG): what the stack starts (nats-server,
job processes, a job launcher and its jobs) never outlives the process that started it, even
one that is SIGKILLed. libc's `prctl` is loaded at import, in the parent: a dlopen between fork
and exec, or first in a forked child, can deadlock on the loader's lock."""

from __future__ import annotations

import contextlib
import signal
import sys
from typing import Any

_PRCTL: Any = None
if sys.platform.startswith("linux"):
    import ctypes

    with contextlib.suppress(OSError):
        _PRCTL = ctypes.CDLL("libc.so.6", use_errno=True).prctl

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """This process gets `sig` when its parent ends (a no-op off Linux). Safe between fork
    and exec (`preexec_fn`): it takes no lock."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, sig)


def terminate_with_parent() -> None:
    """`die_with_parent(SIGTERM)`, as a `preexec_fn`: the child may stop cleanly."""
    die_with_parent(signal.SIGTERM)
