"""Write a directory all-or-nothing: build it under a temporary sibling, then rename into place."""
from __future__ import annotations

import contextlib
import os
import shutil
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
