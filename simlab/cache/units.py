"""Plug-in parameters counted in tokens (:data:`Tokens`) and their conversion to a trace's
units (:mod:`simlab.cache.contract` re-exports them)."""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated


class TokenUnit:
    """Marker of a parameter counted in tokens (see :data:`Tokens`)."""


#: A plug-in parameter counted in tokens. Engines convert it to the trace's units (ids of
#: ``unit_tokens`` tokens for hash-id traces) with :func:`in_units`; an ``int`` field without
#: this type is taken as unit-free.
Tokens = Annotated[int, TokenUnit]


def token_fields(plugin: object) -> tuple[str, ...]:
    """Names of a dataclass plug-in's fields typed :data:`Tokens` (none for another object)."""
    if not dataclasses.is_dataclass(plugin):
        return ()
    hints = typing.get_type_hints(type(plugin), include_extras=True)
    return tuple(
        f.name
        for f in dataclasses.fields(plugin)
        if f.init and TokenUnit in getattr(hints.get(f.name), "__metadata__", ())
    )


Plugin = typing.TypeVar("Plugin")


def in_units(plugin: Plugin, unit_tokens: int) -> Plugin:
    """The plug-in (an admission or an eviction) with its :data:`Tokens` parameters converted
    to ids of ``unit_tokens`` tokens (rounded, at least 1); unchanged for token traces."""
    names = token_fields(plugin)
    if unit_tokens == 1 or not names:
        return plugin
    scaled = {n: max(1, round(getattr(plugin, n) / unit_tokens)) for n in names}
    return dataclasses.replace(plugin, **scaled)  # type: ignore[type-var]


__all__ = ["TokenUnit", "Tokens", "in_units", "token_fields"]
