"""Judicious admission (Marconi; the paper's SGLang+).

Before prefill, a speculative insertion of the input finds whether it creates a branch point
(an intermediate node inside an existing edge, or at a state-less node with children); if so the
state at the branch point is checkpointed during prefill. The state after the last decoded token
is always checkpointed.

``branch_on: sequence`` finds the branch point where the whole admitted sequence (input +
output) diverges inside an edge when it is inserted, as the Marconi reference code does
(``radix_cache_hybrid.py`` ``insert``: its speculative match runs on input + output); the paper
(and the default, ``input``) speculatively inserts the input before prefill.

A branch point that is not on a chunk boundary is taken either exactly (``alignment: exact``,
costing a second prefill pass) or rounded down to the previous chunk boundary
(``alignment: round_down``), which may lose the checkpoint altogether inside the first chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from simlab.cache.contract import Admission, AdmissionPolicy, Switches, Tokens
from simlab.cache.scoring import ALIGNMENTS, aligned

if TYPE_CHECKING:
    from simlab.cache.nodes import Lookup

BRANCH_ON = ("input", "sequence")


@dataclass
class Judicious(AdmissionPolicy):
    alignment: str = "exact"
    chunk_size: Tokens = 256
    page_size: Tokens = 1
    branch_on: str = "input"
    reference_switches: ClassVar[Switches] = {
        "reference": {"branch_on": "sequence"},
        "reference_fixed": {"branch_on": "sequence"},
    }

    @property
    def kind(self) -> str:
        """``judicious`` on its input, unpaged; ``custom`` otherwise."""
        plain = self.branch_on == "input" and self.page_size == 1
        return "judicious" if plain else "custom"

    def __post_init__(self) -> None:
        if self.branch_on not in BRANCH_ON:
            raise ValueError(
                f"admission.branch_on must be one of {BRANCH_ON}, got {self.branch_on!r}"
            )
        if self.alignment not in ALIGNMENTS:
            raise ValueError(
                f"admission.alignment must be one of {ALIGNMENTS}, got {self.alignment!r}"
            )
        if self.chunk_size < 1 or self.page_size < 1:
            raise ValueError("admission.chunk_size and admission.page_size must be >= 1")

    def plan(self, lookup: Lookup, input_len: int, seq_len: int) -> Admission:
        ckpts = [seq_len]
        if self.branch_on == "sequence":
            return Admission(ckpts=ckpts, end=seq_len, branch_at_insert=True)
        branch = lookup.branch_point()
        if branch is not None:
            pos = aligned(branch, self.alignment, self.chunk_size)
            if 0 < pos < seq_len:
                ckpts.insert(0, pos)
        return Admission(ckpts=ckpts, end=seq_len)
