"""The two plug-in protocols: admission (which SSM checkpoints to take) and eviction.

A policy is a small object behind one of these protocols and never owns the tree: the cache
(:class:`simlab.cache.PrefixCache`) owns nodes, bytes, pins and evict-until-fits. Adding a policy
touches two files: its module here and its ``configs/admission|eviction/*.yaml`` (``_target_``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from simlab.cache import Lookup, PrefixCache


@dataclass(frozen=True, slots=True)
class Admission:
    """Checkpoint positions (1..end, sorted) and how many tokens of the sequence to admit."""

    ckpts: list[int]
    end: int


class AdmissionPolicy(Protocol):
    """Decides which SSM states of a request are checkpointed into the cache."""

    #: KV paging granularity this admission implies; Transformer hits round down to it.
    page_size: int

    def plan(self, lookup: Lookup, input_len: int, seq_len: int) -> Admission:
        """Checkpoints for a request whose input matched ``lookup`` and whose full sequence
        (input + output) has ``seq_len`` tokens. Positions <= input_len are taken during
        prefill, the others at the end of decoding."""
        ...


class EvictionPolicy(Protocol):
    """Scores a candidate set; the cache evicts the lowest score and goes on until it fits."""

    #: False: only leaves are candidates; True: nodes with at most one child too (merge on evict).
    evicts_inner_nodes: bool
    #: True when a node's score depends on the other candidates (e.g. min-max normalisation);
    #: the cache then re-scores the whole set after every eviction. False promises static
    #: scores: a node's score changes only when it is hit, admitted into or split, never because
    #: other nodes (its only child included) are evicted; the cache then keeps a heap and
    #: scores a chain of one-child ancestors in one call (checked against full re-scoring in
    #: ``tests/test_policies.py`` for every shipped policy).
    scores_depend_on_candidates: bool

    def on_hit(self, cache: PrefixCache, lookup: Lookup) -> None:
        """Recency bookkeeping when a request's input has been matched."""
        ...

    def scores(self, cache: PrefixCache, candidates: np.ndarray) -> np.ndarray:
        """One score per candidate slot; the lowest is evicted first (ties: oldest node)."""
        ...


def in_units(admission: AdmissionPolicy, unit_tokens: int) -> AdmissionPolicy:
    """The admission with its token-valued parameters (``TOKEN_FIELDS``) converted to ids of
    ``unit_tokens`` tokens (rounded, at least 1); unchanged for token traces."""
    names = getattr(admission, "TOKEN_FIELDS", ())
    if unit_tokens == 1 or not names:
        return admission
    scaled = {n: max(1, round(getattr(admission, n) / unit_tokens)) for n in names}
    return dataclasses.replace(admission, **scaled)  # type: ignore[type-var]


def min_max(values: np.ndarray) -> np.ndarray:
    """Scale to [0, 1] over the candidates; all ones when they are all equal (reference code)."""
    lo, hi = values.min(), values.max()
    if hi == lo:
        return np.ones_like(values)
    return (values - lo) / (hi - lo)
