"""The paper's derived quantities over a mode's results: ratios, P95 wins, FLOPs saved,
Fig. 10a's input-length bins."""

from __future__ import annotations

import numpy as np
import pandas as pd

from simlab.experiments.paper.results import ModeResults


def mean_ratio(res: ModeResults, study: str, num: str, den: str) -> float | None:
    """Mean over the study's points of ``num``'s token hit rate / ``den``'s (points where
    ``den`` hit nothing are left out: the ratio is unbounded there)."""
    table = res.per_point(study)
    if table.empty:
        return None
    ok = table[den] > 0
    return float((table[num][ok] / table[den][ok]).mean()) if ok.any() else None


def p95_win(res: ModeResults, study: str, winner: str, loser: str) -> float | None:
    """P95 over the study's points of ``winner``'s token hit rate over ``loser``'s (%)."""
    table = res.per_point(study)
    if table.empty:
        return None
    ok = table[loser] > 0
    wins = 100 * (table[winner][ok] / table[loser][ok] - 1)
    return float(np.percentile(wins, 95)) if ok.any() else None


def flops_win(res: ModeResults, study: str, winner: str, loser: str) -> float | None:
    """``winner``'s FLOPs saved over ``loser``'s at a one-point study (%)."""
    table = res.per_point(study, "flops_saved")
    if table.empty or not table[loser].iloc[0] > 0:
        return None
    return float(100 * (table[winner].iloc[0] / table[loser].iloc[0] - 1))


#: Fig. 10a's split and bin width (tokens of input).
SPLIT_TOKENS = 7000
BIN_TOKENS = 1000


def length_diff(res: ModeResults, study: str, winner: str, loser: str) -> pd.Series:
    """Mean per-request token hit rate of ``winner`` minus ``loser`` (percentage points) per
    1K-token input-length bin (index: the bin's lower edge in tokens)."""
    records = res.records(study)
    if records.empty:
        return pd.Series(dtype=float)
    records = records.assign(
        rate=records["hit_tokens"] / records["input_tokens"].where(records["input_tokens"] > 0),
        bin=records["input_tokens"] // BIN_TOKENS * BIN_TOKENS,
    ).fillna({"rate": 0.0})
    means = records.groupby(["policy", "bin"])["rate"].mean().unstack("policy")
    return 100 * (means[winner] - means[loser]).dropna()


def split_extreme(res: ModeResults, study: str, below: bool) -> float | None:
    """The lowest bin difference under :data:`SPLIT_TOKENS` (``below``), else the highest at
    or above it (Fig. 10a's "up to -3.0%" and "up to +25.5%")."""
    diff = length_diff(res, study, "marconi", "sglang_plus")
    part = (
        diff[diff.index + BIN_TOKENS <= SPLIT_TOKENS] if below else diff[diff.index >= SPLIT_TOKENS]
    )
    if part.empty:
        return None
    return float(part.min() if below else part.max())


def mean_hit(res: ModeResults, study: str, policy: str) -> float | None:
    """Mean token hit rate (%) of ``policy`` over the study's points."""
    rows = res.rows(study, policy)
    return None if rows.empty else 100 * float(rows["token_hit_rate"].mean())
