"""Write a directory or a file all-or-nothing: build it under a temporary sibling, then rename into
place."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator


@contextlib.contextmanager
def atomic_directory(dst: str) -> Iterator[str]:
    """Yield a fresh temporary directory; on success it replaces `dst`, on error it is removed.

    The temporary sibling lives on the same filesystem, so the final step is one `os.replace`
    (an existing `dst` is first moved aside, then deleted once the new one is in place).
    """
    dst = os.path.abspath(dst)
    parent = os.path.dirname(dst)
    os.makedirs(parent, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    tmp = os.path.join(parent, f".{os.path.basename(dst)}.tmp-{tag}")
    os.makedirs(tmp)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if os.path.lexists(dst):
        old = os.path.join(parent, f".{os.path.basename(dst)}.old-{tag}")
        os.replace(dst, old)
    os.replace(tmp, dst)
    if old is not None:
        if os.path.isdir(old) and not os.path.islink(old):
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.remove(old)


def write_text_atomic(path: str, text: str, *, fsync: bool = False) -> str:
    """Write `text` to `path` whole or not at all: a temporary sibling (`.NAME.tmp-*`), renamed
    over `path`; on error the temporary is removed. fsync: flush it to disk before the rename
    (what a resumed run reads back). The parent directory must exist. Returns `path`."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def remove_stale_temporaries(dst: str) -> list[str]:
    """Delete the `.NAME.tmp-*` / `.NAME.old-*` siblings of `dst` that an atomic_directory killed
    midway (kill -9, SIGTERM without a handler) left behind. Only call it while no other process
    can be writing `dst` (e.g. under wfm_jax.io.lock). Returns the names removed."""
    dst = os.path.abspath(dst)
    parent, name = os.path.dirname(dst), os.path.basename(dst)
    if not os.path.isdir(parent):
        return []
    stale = sorted(n for n in os.listdir(parent)
                   if n.startswith((f".{name}.tmp-", f".{name}.old-")))
    for n in stale:
        path = os.path.join(parent, n)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)
    return stale
