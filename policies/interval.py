"""Interval admission (SGLang's current hybrid cache): a checkpoint every ``interval`` tokens,
plus branch points (as in judicious admission) and the state after the last decoded token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from simlab.cache.contract import Admission, AdmissionPolicy, Tokens
from simlab.cache.scoring import ALIGNMENTS, aligned

if TYPE_CHECKING:
    from simlab.cache.nodes import Lookup


@dataclass
class Interval(AdmissionPolicy):
    interval: Tokens = 256
    branch_points: bool = True
    last_token: bool = True
    alignment: str = "exact"
    chunk_size: Tokens = 256
    page_size: Tokens = 1

    def __post_init__(self) -> None:
        if self.interval < 1:
            raise ValueError(f"admission.interval must be >= 1, got {self.interval}")
        if self.alignment not in ALIGNMENTS:
            raise ValueError(
                f"admission.alignment must be one of {ALIGNMENTS}, got {self.alignment!r}"
            )

    def states_per_checkpoint(self, unit_tokens: int) -> int:
        """A state per ``interval`` tokens: 2 per 512-token id for SGLang's 256 (every id is
        then on the interval's grid, so its branch-point and last checkpoints are too)."""
        return max(1, round(unit_tokens / self.interval))

    def plan(self, lookup: Lookup, input_len: int, seq_len: int) -> Admission:
        ckpts = set(range(self.interval, seq_len + 1, self.interval))
        if self.last_token:
            ckpts.add(seq_len)
        branch = lookup.branch_point() if self.branch_points else None
        if branch is not None:
            pos = aligned(branch, self.alignment, self.chunk_size)
            if 0 < pos < seq_len:
                ckpts.add(pos)
        return Admission(ckpts=sorted(ckpts), end=seq_len)
