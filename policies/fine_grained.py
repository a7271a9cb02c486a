"""Fine-grained admission (the Marconi paper's vLLM+): a checkpoint every ``block_size`` tokens.

Only whole blocks are admitted (paged KV, like vLLM's block hashing); the partial tail block of
a sequence is not cached. ``block_size`` is also the KV page size, so Transformer hits round
down to whole blocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from simlab.cache.contract import Admission, AdmissionPolicy, Tokens

if TYPE_CHECKING:
    from simlab.cache.nodes import Lookup


@dataclass
class FineGrained(AdmissionPolicy):
    block_size: Tokens = 32
    kind = "fine_grained"

    @classmethod
    def reference_semantics(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """The reference vLLM+ (``radix_cache_vllm.py``) has its own block match (no descent
        bug) and its own insertion estimate (``block_estimate``: its block size, in tokens)."""
        block = int(options.get("block_size", cls.block_size))
        return {"partial_descent": False, "block_estimate": block}

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"admission.block_size must be >= 1, got {self.block_size}")

    @property
    def page_size(self) -> int:
        return self.block_size

    def states_per_checkpoint(self, unit_tokens: int) -> int:
        """A state per ``block_size`` tokens: 16 per 512-token id for the paper's 32."""
        return max(1, round(unit_tokens / self.block_size))

    def plan(self, lookup: Lookup, input_len: int, seq_len: int) -> Admission:
        end = (seq_len // self.block_size) * self.block_size
        return Admission(ckpts=list(range(self.block_size, end + 1, self.block_size)), end=end)
