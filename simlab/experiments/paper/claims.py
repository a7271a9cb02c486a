"""Every number the paper publishes, how simlab computes its counterpart, and the direction of
the paper's claim about it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from simlab.experiments.paper.metrics import (
    flops_win,
    mean_hit,
    mean_ratio,
    p95_win,
    split_extreme,
)
from simlab.experiments.paper.plan import (
    FIG11_GB,
    FIG12A_LAYERS,
    FIG12B_DIM,
    FIG13A_SPS,
    FIG13B_ART,
    THREE,
    fmt_value,
)
from simlab.experiments.paper.results import ModeResults

NAMES = {"marconi": "Marconi", "sglang_plus": "SGLang+", "vllm_plus": "vLLM+"}
Check = Callable[[ModeResults], "bool | None"]


@dataclass(frozen=True)
class Published:
    """One number the paper publishes, how simlab computes its counterpart, and the direction
    of the paper's claim about it (``holds``: None when the points it needs were not run)."""

    figure: str
    quantity: str
    setting: str
    paper: float
    unit: str  # "%" hit rate, "x" ratio, "win" relative gain (%), "pp" hit-rate difference
    value: Callable[[ModeResults], float | None]
    claim: str
    holds: Check


def _above(study: str, at: int | None, hi: str, lo: str, res: ModeResults) -> bool | None:
    """``hi``'s token hit rate above ``lo``'s at the study's ``at``-th x (None: not run)."""
    a, b = res.hit(study, hi, at), res.hit(study, lo, at)
    return None if a is None or b is None else a > b


def _all_above(study: str, ats: Sequence[int], hi: str, lo: str, res: ModeResults) -> bool | None:
    """:func:`_above` at every x of ``ats`` that was run."""
    known = [c for c in (_above(study, at, hi, lo, res) for at in ats) if c is not None]
    return all(known) if known else None


def _near(study: str, at: int, tol: float, res: ModeResults) -> bool | None:
    """The three policies' token hit rates within ``tol`` percentage points of each other."""
    values = [res.hit(study, p, at) for p in THREE]
    known = [v for v in values if v is not None]
    return None if len(known) < len(values) else max(known) - min(known) <= tol


def _trend(study: str, policy: str, a: int, b: int, up: bool, res: ModeResults) -> bool | None:
    """``policy``'s token hit rate rises (``up``) or falls from the ``a``-th x to the
    ``b``-th (a tie holds neither)."""
    first, second = res.hit(study, policy, a), res.hit(study, policy, b)
    if first is None or second is None:
        return None
    return bool(np.sign(second - first) == (1 if up else -1))


def _compare(value: Callable[[ModeResults], float | None], limit: float, above: bool) -> Check:
    def check(res: ModeResults) -> bool | None:
        v = value(res)
        return None if v is None else (v > limit if above else v < limit)

    return check


def fig7_8_rows() -> list[Published]:
    """Figs. 7 and 8: a ratio and a P95 win per trace, over the trace's grid."""
    rows = []
    for trace, label, ratio, win in (
        ("lmsys", "LMSys", 4.5, 45.6),
        ("sharegpt", "ShareGPT", 7.3, 19.0),
        ("swebench", "SWE-bench", 34.4, 219.7),
    ):
        study = f"fig7_8_{trace}"
        mean = partial(mean_ratio, study=study, num="marconi", den="vllm_plus")
        p95 = partial(p95_win, study=study, winner="marconi", loser="sglang_plus")
        quantity = "Marconi / vLLM+ token hit rate, mean over configs"
        rows.append(
            Published("Fig. 7", quantity, label, ratio, "x", mean, "> 1", _compare(mean, 1, True))
        )
        quantity = "P95 over configs of Marconi's win over SGLang+"
        rows.append(
            Published("Fig. 8", quantity, label, win, "win", p95, "> 0", _compare(p95, 0, True))
        )
    return rows


FIG10_SETTING = "SWE-bench, 80 GB, 10 sessions/s, 7.5 s"


def fig10_rows() -> list[Published]:
    """Fig. 10 (Sec. 5.3): one SWE-bench point, overall and split at 7K input tokens."""
    above = partial(_above, "fig10", None, "marconi", "sglang_plus")
    flops = partial(flops_win, study="fig10", winner="marconi", loser="sglang_plus")
    below_7k = partial(split_extreme, study="fig10", below=True)
    above_7k = partial(split_extreme, study="fig10", below=False)
    rows = [
        Published(
            "Fig. 10",
            f"{NAMES[p]} token hit rate",
            FIG10_SETTING,
            paper,
            "%",
            partial(ModeResults.hit, study="fig10", policy=p),
            "Marconi > SGLang+",
            above,
        )
        for p, paper in (("sglang_plus", 16.4), ("marconi", 32.7))
    ]
    rows += [
        Published(
            "Fig. 10",
            "Marconi's FLOPs saved over SGLang+'s",
            FIG10_SETTING,
            90.3,
            "win",
            flops,
            "> 0",
            _compare(flops, 0, True),
        ),
        Published(
            "Fig. 10a",
            "Marconi - SGLang+ mean hit rate, worst 1K bin < 7K tokens",
            FIG10_SETTING,
            -3.0,
            "pp",
            below_7k,
            "< 0",
            _compare(below_7k, 0, False),
        ),
        Published(
            "Fig. 10a",
            "Marconi - SGLang+ mean hit rate, best 1K bin >= 7K tokens",
            FIG10_SETTING,
            25.5,
            "pp",
            above_7k,
            "> 0",
            _compare(above_7k, 0, True),
        ),
    ]
    return rows


def series_rows(
    figure: str,
    study: str,
    policy: str,
    labels: Sequence[str],
    paper: Sequence[float],
    claim: str,
) -> list[Published]:
    """One row per published value of ``policy``'s series, the ``i``-th at the study's
    ``i``-th x. ``claim``: ``above:<policy>`` (Marconi above that policy at this x) or
    ``trend`` (the series moves to the neighbouring x the way the paper's does: to the next
    x, from the previous one for the last)."""
    rows = []
    for i, (label, value) in enumerate(zip(labels, paper, strict=True)):
        if claim == "trend":
            a, b = sorted((i, i + 1 if i + 1 < len(labels) else i - 1))
            up = paper[b] > paper[a]
            text = f"{NAMES[policy]} {'rises' if up else 'falls'} from {labels[a]} to {labels[b]}"
            check = partial(_trend, study, policy, a, b, up)
        else:
            lo = claim.split(":")[1]
            text, check = f"Marconi > {NAMES[lo]}", partial(_above, study, i, "marconi", lo)
        hit = partial(ModeResults.hit, study=study, policy=policy, at=i)
        quantity = f"{NAMES[policy]} token hit rate"
        rows.append(Published(figure, quantity, label, value, "%", hit, text, check))
    return rows


def fig11_rows() -> list[Published]:
    labels = [f"SWE-bench, {gb} GB" for gb in FIG11_GB]
    marconi = (9.59, 22.74, 43.03, 47.92, 48.21)
    sglang = (7.72, 15.01, 25.57, 36.90, 43.89)
    return series_rows(
        "Fig. 11", "fig11", "marconi", labels, marconi, "above:sglang_plus"
    ) + series_rows("Fig. 11", "fig11", "sglang_plus", labels, sglang, "trend")


def fig12a_rows() -> list[Published]:
    """Fig. 12a: Marconi above SGLang+ while SSM layers are present, all three equal for a pure
    Transformer, SGLang+ falling towards it, vLLM+ below Marconi throughout."""
    labels = [f"Attn:SSM {name.replace('to', ':')}" for name in FIG12A_LAYERS]
    marconi, sglang = (18.06, 12.3, 8.35, 5.69), (11.31, 8.51, 6.62, 5.38, 5.04)
    rows = series_rows("Fig. 12a", "fig12a", "marconi", labels[:-1], marconi, "above:sglang_plus")
    last = len(labels) - 1
    hit = partial(ModeResults.hit, study="fig12a", policy="marconi", at=last)
    near = partial(_near, "fig12a", last, 1.0)
    quantity = "Marconi token hit rate"
    rows.append(
        Published("Fig. 12a", quantity, labels[-1], 5.05, "%", hit, "all three within 1 pp", near)
    )
    rows += series_rows("Fig. 12a", "fig12a", "sglang_plus", labels, sglang, "trend")
    mean = partial(mean_hit, study="fig12a", policy="vllm_plus")
    above = partial(_all_above, "fig12a", range(last), "marconi", "vllm_plus")
    quantity, claim = "vLLM+ token hit rate (mean over ratios)", "Marconi > vLLM+ at 1:8-1:2"
    rows.append(Published("Fig. 12a", quantity, "all ratios", 5.0, "%", mean, claim, above))
    return rows


def fig12b_rows() -> list[Published]:
    labels = [f"state dim {d}" for d in FIG12B_DIM]
    series = (
        ("marconi", (31.55, 29.88, 30.19, 29.36), "above:sglang_plus"),
        ("sglang_plus", (16.39, 17.39, 18.00, 18.37), "trend"),
        ("vllm_plus", (0.89, 1.5, 3.14, 5.17), "trend"),
    )
    return [r for p, v, c in series for r in series_rows("Fig. 12b", "fig12b", p, labels, v, c)]


def fig13_rows() -> list[Published]:
    """Fig. 13: Marconi's hit rate falls with more sessions/s and longer response times, and
    stays above SGLang+."""
    sps = [f"{fmt_value(float(v))} session{'' if v == 1 else 's'}/s" for v in FIG13A_SPS]
    art = [f"response time {fmt_value(float(v))} s" for v in FIG13B_ART]
    series = (
        ("Fig. 13a", "fig13a", sps, "marconi", (48.70, 44.92, 43.02), "trend"),
        ("Fig. 13a", "fig13a", sps, "sglang_plus", (35.18, 29.27, 26.36), "above:sglang_plus"),
        ("Fig. 13b", "fig13b", art, "marconi", (25.90, 24.25, 24.08), "trend"),
        ("Fig. 13b", "fig13b", art, "sglang_plus", (18.83, 16.60, 15.49), "above:sglang_plus"),
    )
    return [r for f, st, lab, p, v, c in series for r in series_rows(f, st, p, lab, v, c)]


def published() -> list[Published]:
    """Every number of the paper's text that ``paper.md`` sets beside simlab's, in order."""
    return [
        *fig7_8_rows(),
        *fig10_rows(),
        *fig11_rows(),
        *fig12a_rows(),
        *fig12b_rows(),
        *fig13_rows(),
    ]
