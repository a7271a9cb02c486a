"""Atomic file writes, shared by every writer of results, reports, sweep tables and trace caches.

A file is written under a temporary name beside its destination and renamed onto it, so a reader
(or a crashed run's resume) never sees a partial file. It gets the permissions a plain ``open()``
would give, ``0o666`` minus the umask, not ``mkstemp``'s private ``0o600``: colleagues reading a
shared sweep directory see every result file, not only the report.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def current_umask() -> int:
    """The process umask (read by setting and restoring it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """A temporary path to write ``path``'s content to; renamed onto ``path`` when the block
    ends without error, removed otherwise (``path`` is then untouched)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
