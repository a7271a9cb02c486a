"""Reading a Hugging Face config's fields, each error one line naming the field and the file."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

#: config ``torch_dtype`` / ``dtype`` / ``mamba_ssm_dtype`` names and their bytes per element
DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "fp32": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "bf16": 2,
    "fp16": 2,
}


class Fields:
    """One config's fields (a flat mapping, see :func:`~simlab.model.hf.resolve.read_config`)
    and the file it came from."""

    def __init__(self, cfg: dict[str, Any], path: Path | str):
        self.cfg = cfg
        self.path = str(path)

    def error(self, name: str, what: str) -> ValueError:
        return ValueError(f"{self.path}: field {name!r} {what}")

    def has(self, name: str) -> bool:
        return self.cfg.get(name) is not None

    def get(self, name: str, default: Any = None) -> Any:
        value = self.cfg.get(name)
        return default if value is None else value

    def integer(self, name: str, default: int | None = None, minimum: int = 1) -> int:
        """An integer field (``default`` when absent or null; required when ``default`` is
        None), at least ``minimum``."""
        value = self.cfg.get(name)
        if value is None:
            if default is None:
                raise self.error(name, "is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(name, f"must be an integer, got {value!r}")
        if value < minimum:
            raise self.error(name, f"must be >= {minimum}, got {value}")
        return value

    def first(self, *names: str, default: int | None = None) -> int:
        """The first of ``names`` present (configs of one family spell fields differently)."""
        for name in names:
            if self.has(name):
                return self.integer(name)
        if default is None:
            raise self.error(names[0], "is missing" + (f" (nor {names[1:]})" if names[1:] else ""))
        return default

    def dtype_bytes(self, *names: str, default: int | None = None) -> int | None:
        """Bytes of the first dtype field of ``names`` present, else ``default``."""
        for name in names:
            value = self.cfg.get(name)
            if value is None or value == "auto":
                continue
            key = str(value).removeprefix("torch.")
            if key not in DTYPE_BYTES:
                raise self.error(name, f"has an unknown dtype {value!r}")
            return DTYPE_BYTES[key]
        return default

    def pattern(self, name: str, kinds: dict[str, str], length: int | None = None) -> list[str]:
        """A hybrid layer pattern (a string of letters or a list of names) mapped through
        ``kinds`` to simlab's kinds; an unknown entry or a wrong length is an error."""
        raw = self.cfg.get(name)
        if raw is None:
            raise self.error(name, "is missing")
        items: Sequence[Any] = list(raw) if isinstance(raw, str | list) else []
        if not items:
            raise self.error(name, f"must be a non-empty string or list, got {raw!r}")
        unknown = sorted({str(x) for x in items if str(x) not in kinds})
        if unknown:
            raise self.error(name, f"has unknown layer type(s) {unknown}; known: {sorted(kinds)}")
        if length is not None and len(items) != length:
            raise self.error(name, f"has {len(items)} layers but num_hidden_layers is {length}")
        return [kinds[str(x)] for x in items]

    def indices(self, name: str, values: Iterable[Any], layers: int, base: int) -> set[int]:
        """Layer numbers (``base``-based) in ``values``, checked to lie in range."""
        out: set[int] = set()
        for v in values:
            if isinstance(v, bool) or not isinstance(v, int) or not base <= v < layers + base:
                raise self.error(
                    name, f"has a layer number {v!r} outside {base}..{layers + base - 1}"
                )
            out.add(v - base)
        return out
