"""An exclusive lock on a path for one process's lifetime: a second holder is refused at once.

The lock is an flock on a file that also records the owner's pid. The kernel drops an flock
when its process dies (kill -9 included), so a lock file left by a dead owner is stale by
construction and the next run takes it over; the pid is only there to name the owner.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator

from wfm_jax.core.errors import UserError


class LockHeldError(UserError, RuntimeError):
    """Another live process holds the lock."""


def _owner(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 200).decode(errors="replace").split()
    except OSError:
        return "unknown"
    return f"pid {text[0]} on {text[1]}" if len(text) >= 2 else "unknown"


def _acquire(path: str, what: str) -> int:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _owner(fd)
            os.close(fd)
            raise LockHeldError(f"{what} is in use by another run ({owner}; lock file {path}); "
                           f"wait for it to finish or stop it") from None
        # the previous holder may have unlinked the file between our open and flock: we then
        # hold a lock on a dead inode, so start again on the current file
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
            return fd
        os.close(fd)


@contextlib.contextmanager
def exclusive_lock(path: str, what: str) -> Iterator[None]:
    """Hold the lock at `path` for the block; LockHeldError (naming `what` and the owner's pid) when
    a live process holds it. The file is removed on the way out."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = _acquire(path, what)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still locked: a waiter re-checks the inode (see _acquire)
        os.close(fd)
