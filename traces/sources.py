"""Where a loader's input file is: the user's ``trace.path=FILE`` or a file under the data dir."""

from __future__ import annotations

import os
from pathlib import Path

from traces.paths import require_file, resolve_data_dir


def resolve_source(
    path: str | os.PathLike[str] | None,
    data_dir: str | os.PathLike[str] | None,
    relative: str | os.PathLike[str],
    what: str,
    how_to_get: str,
    *,
    allow_dir: bool = False,
    key: str = "trace.path",
) -> Path:
    """``path`` when given (the user's own file in the loader's format), else
    ``<data_dir>/<relative>`` (data dir resolved by :func:`traces.paths.resolve_data_dir`).

    A directory is accepted only with ``allow_dir`` (loaders that read a folder of files).
    ``key``: the config key ``path`` came from, named in the error. Raises :class:`traces.paths.DataFileMissingError` naming the path and ``how_to_get``.
    """
    if path is not None and str(path) != "":
        chosen = Path(path).expanduser().resolve()
        how = f"{key}={path} was given; {how_to_get}"
    else:
        chosen = resolve_data_dir(data_dir) / relative
        how = how_to_get
    if allow_dir and chosen.is_dir():
        return chosen
    return require_file(chosen, what, how)
