"""SGLang's request admission against the running requests' expected outputs
(``engine.request_admission=sglang``).

SGLang's ``PrefillAdder`` admits a queued request when its uncached input, its clipped outputs
left (``min(max_new_tokens - len(output_ids), CLIP_MAX_NEW_TOKENS)``: all of them unless it was
retracted) and one page fit in the free and evictable KV
less what the running requests are expected to still write:
``min(max_new_tokens - len(output_ids), CLIP_MAX_NEW_TOKENS)`` each, times the *new token ratio*
(1 for a request with ``ignore_eos``, which runs to its ``max_new_tokens``; 1 for a request still
prefilling, which reserves its whole clipped output). Requests admitted in the same pass reserve
their whole clipped output, ``min(max_new_tokens, CLIP_MAX_NEW_TOKENS)``, a retracted one's
outputs already sampled included (``_update_prefill_budget``).

The ratio (``NewTokenRatioTracker``) starts at ``SGLANG_INIT_NEW_TOKEN_RATIO`` = 0.7, drops by
``(0.7 - 0.7 x 0.14) / 600`` at every decode step that retracts nothing, down to 0.7 x 0.14; a
retraction sets it to what the kept requests show, ``(decoded + 20 each) / (max_new_tokens + 1)``
(at most 1); an idle server resets it to 0.7. ``max_new_tokens`` is the request's output length
here, as a benchmark client sets it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Sequence

INIT_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO (x schedule_conservativeness = 1)
MIN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
WAITING_PREFIX_REFRESH_INTERVAL = 32  # schedule_policy: passes between waiting-prefix refreshes
WAITING_PREFIX_MAX = 128  # WAITING_QUEUE_PREFIX_MATCH_MAX: queued prefixes a refresh touches


@dataclass
class NewTokenRatio:
    """SGLang's new token ratio; invariant: ``current <= 1`` (a retraction may set it below
    ``MIN``, as SGLang's does; the next decay lifts it to ``MIN``)."""

    current: float = INIT_RATIO

    MIN = INIT_RATIO * MIN_RATIO_FACTOR
    DECAY = (INIT_RATIO - INIT_RATIO * MIN_RATIO_FACTOR) / DECAY_STEPS

    def after(self, steps: int | np.ndarray) -> float | np.ndarray:
        """The ratio once ``steps`` (>= 0) more decode steps decayed it."""
        steps = np.asarray(steps)
        decayed = np.maximum(self.current - steps * self.DECAY, self.MIN)
        return np.where(steps > 0, decayed, self.current)

    def decay(self, steps: int) -> None:
        """``steps`` decode steps ran without a retraction."""
        if steps > 0:
            self.current = float(self.after(steps))

    def reset(self) -> None:
        """The server went idle."""
        self.current = INIT_RATIO

    def retracted(self, outputs: Sequence[int], max_new: Sequence[int]) -> None:
        """Requests were retracted; the kept ones sampled ``outputs`` of their ``max_new``."""
        estimate = (sum(outputs) + RETRACT_DECODE_STEPS * len(outputs)) / (sum(max_new) + 1)
        self.current = min(1.0, estimate)
