"""The plan: the studies (one Hydra multirun each) that reproduce the paper's figures, and the
full and quick plans' grids and traces."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Value = float | int | str
Grid = tuple[tuple[str, tuple[Value, ...]], ...]


@dataclass(frozen=True)
class Study:
    """One Hydra multirun: ``+experiment=<experiment>`` over ``grid`` (key -> values; every key
    is passed on the command line and replaces the file's own sweep of it) plus ``overrides``.
    ``policies`` are the file's ``compare`` set; ``x`` is the swept key the figure plots, its
    values in the order the paper lists its numbers."""

    name: str
    experiment: str
    policies: tuple[str, ...]
    grid: Grid
    x: str | None = None
    overrides: tuple[str, ...] = ()

    @property
    def points(self) -> int:
        return math.prod(len(values) for _, values in self.grid)

    @property
    def x_values(self) -> tuple[Value, ...]:
        return dict(self.grid)[self.x] if self.x is not None else ()

    def sweep_args(self) -> list[str]:
        """``key=v1,v2,...`` per grid key (Hydra's basic sweeper takes their product)."""
        return [f"{key}={','.join(fmt_value(v) for v in values)}" for key, values in self.grid]


@dataclass(frozen=True)
class Plan:
    """The studies to run and, in words, how they were sized to the time budget."""

    name: str
    studies: tuple[Study, ...]
    budget: str

    def study(self, name: str) -> Study | None:
        return next((s for s in self.studies if s.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "budget": self.budget, "studies": jsonable(self.studies)}


def fmt_value(value: Value) -> str:
    """A swept value as Hydra's command line takes it (``7.5``, ``10``, ``1to8``)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda o: dataclasses.asdict(o)))


THREE = ("vllm_plus", "sglang_plus", "marconi")
TWO = ("sglang_plus", "marconi")
SPS = (0.25, 0.5, 1, 2, 5, 10)
ART = (5, 7.5, 10)
#: x values of the microbenchmarks, in the order the paper lists its numbers.
FIG11_GB = (60, 80, 100, 120, 140)
FIG12A_LAYERS = ("1to8", "1to6", "1to4", "1to2", "1to0")  # configs/paper/layers/
FIG12B_DIM = (128, 64, 32, 16)
FIG13A_SPS = (0.5, 1, 2)
FIG13B_ART = (5, 7.5, 10)
STUDY_ORDER = (
    "fig7_8_lmsys",
    "fig7_8_sharegpt",
    "fig7_8_swebench",
    "fig10",
    "fig11",
    "fig12a",
    "fig12b",
    "fig13a",
    "fig13b",
)
#: SWE-bench cache sizes (GB) of the one-size studies (as their experiment files set them).
SWE_GB = {"fig10": 80, "fig12b": 80, "fig13a": 100, "fig13b": 80}


def _scaled(sizes: Sequence[Value], scale: float) -> tuple[Value, ...]:
    """Cache sizes (GB) times ``scale``, rounded to 0.1 GB (unchanged at scale 1)."""
    return tuple(sizes) if scale == 1 else tuple(round(float(gb) * scale, 1) for gb in sizes)


def swe_studies(limit: int, scale: float, figs_7_8: Grid) -> list[Study]:
    """The SWE-bench studies on its first ``limit`` sessions, every cache size times
    ``scale`` (the Figs. 7-8 grid's ``cache.size_gb`` included)."""
    trace = f"trace.limit={limit}"

    def size(name: str) -> tuple[str, ...]:
        return (trace, f"cache.size_gb={fmt_value(_scaled([SWE_GB[name]], scale)[0])}")

    grid = tuple(
        (key, _scaled(values, scale) if key == "cache.size_gb" else values)
        for key, values in figs_7_8
    )
    gb, dim = ("cache.size_gb", _scaled(FIG11_GB, scale)), ("model.ssm_state_dim", FIG12B_DIM)
    sps, art = ("arrivals.session_rate", FIG13A_SPS), ("arrivals.response_time", FIG13B_ART)
    return [
        Study("fig7_8_swebench", "marconi_fig7_8_swebench", THREE, grid, None, (trace,)),
        Study("fig10", "marconi_fig10_flop_aware", TWO, (), None, size("fig10")),
        Study("fig11", "marconi_fig11_contention", TWO, (gb,), gb[0], (trace,)),
        Study("fig12b", "marconi_fig12_state_dim", THREE, (dim,), dim[0], size("fig12b")),
        Study("fig13a", "marconi_fig13a_session_rate", TWO, (sps,), sps[0], size("fig13a")),
        Study("fig13b", "marconi_fig13b_response_time", TWO, (art,), art[0], size("fig13b")),
    ]


def paper_studies(
    swe: tuple[int, float], sharegpt_limit: int, grids: Mapping[str, Grid]
) -> tuple[Study, ...]:
    """The nine studies: SWE-bench ones per :func:`swe_studies` (``swe``: limit, scale),
    ShareGPT cut to its first ``sharegpt_limit`` conversations, LMSys whole (its 15 qualifying
    conversations); Figs. 7-8 over ``grids[trace]``."""
    layers = ("+paper/layers", FIG12A_LAYERS)
    sharegpt = (f"trace.limit={sharegpt_limit}",)
    studies = [
        Study("fig7_8_lmsys", "marconi_fig7_8_lmsys", THREE, grids["lmsys"]),
        Study(
            "fig7_8_sharegpt", "marconi_fig7_8_sharegpt", THREE, grids["sharegpt"], None, sharegpt
        ),
        Study("fig12a", "marconi_fig12_layers", THREE, (layers,), layers[0]),
        *swe_studies(*swe, grids["swebench"]),
    ]
    return tuple(sorted(studies, key=lambda study: STUDY_ORDER.index(study.name)))


#: SWE-bench cache sizes are scaled by ``sessions / SWE_PAPER_SESSIONS``: with that many of
#: simlab's SWE-bench sessions (mini-swe-agent, Gemini 3 Pro) SGLang+ follows the paper's Fig. 11
#: series at the paper's cache sizes (measured at 50 sessions, Fig. 11's 5 sessions/s and 10 s:
#: 9.2/16.1/22.4/31.4/40.0% against the published 7.72/15.01/25.57/36.90/43.89%); unscaled, 50
#: sessions reach the infinite-cache hit rate at about 50 GB and every SWE-bench figure (40-140
#: GB) would be uncontended.
SWE_PAPER_SESSIONS = 285
SWE_SCALING = (
    "SWE-bench cache sizes are scaled by sessions / {paper} = {scale:.3f} (the rows name the "
    "paper's sizes, the study table lists those run): the authors' SWE-bench trace is not "
    "available, and with {paper} of simlab's SWE-bench sessions SGLang+ follows the paper's "
    "Fig. 11 series at the paper's sizes (so Fig. 11's SGLang+ values are calibrated, not "
    "predicted; only its trend is judged)."
)
CHAT_SPS = (0.25, 1, 10)
SWE_SPS = (0.25, 10)

#: Full plan: sized for about 15 minutes on 2 cores (`--jobs 2`), both modes.
FULL_SWE_LIMIT = 50
FULL_SHAREGPT_LIMIT = 100


def full_plan() -> Plan:
    """The paper's grids; ShareGPT at 3 and SWE-bench at 2 of the 6 session rates."""
    scale = FULL_SWE_LIMIT / SWE_PAPER_SESSIONS
    grids = {
        "lmsys": (("cache.size_gb", (1, 2, 3, 4, 5)), ("arrivals.session_rate", SPS)),
        "sharegpt": (("cache.size_gb", (1, 2, 3, 4, 5, 10)), ("arrivals.session_rate", CHAT_SPS)),
        "swebench": (
            ("cache.size_gb", (40, 60, 80, 100)),
            ("arrivals.session_rate", SWE_SPS),
            ("arrivals.response_time", ART),
        ),
    }
    budget = (
        "Full plan, sized for about 15 minutes on 2 cores: the paper's grids for LMSys (5 cache "
        "sizes x 6 session rates) and every microbenchmark; ShareGPT's 6 cache sizes at 3 of "
        f"the 6 session rates ({', '.join(fmt_value(v) for v in CHAT_SPS)}/s), SWE-bench's 4 cache "
        f"sizes x 3 response times at 2 ({', '.join(fmt_value(v) for v in SWE_SPS)}/s); the paper "
        "mode's and simlab's alpha tuners replay each window once per alpha on the 21-value "
        "grid, which is where the time goes. Traces: LMSys all 15 qualifying "
        f"conversations of the public 191-conversation sample, ShareGPT the first "
        f"{FULL_SHAREGPT_LIMIT} conversations, SWE-bench the first {FULL_SWE_LIMIT} sessions. "
        + SWE_SCALING.format(paper=SWE_PAPER_SESSIONS, scale=scale)
    )
    studies = paper_studies((FULL_SWE_LIMIT, scale), FULL_SHAREGPT_LIMIT, grids)
    return Plan("full", studies, budget)


QUICK_SWE_LIMIT = 20
QUICK_SHAREGPT_LIMIT = 40


def quick_plan() -> Plan:
    """Every figure on small grids and traces (about 3 minutes on 2 cores)."""
    scale = QUICK_SWE_LIMIT / SWE_PAPER_SESSIONS
    grids = {
        "lmsys": (("cache.size_gb", (1, 5)), ("arrivals.session_rate", (1, 10))),
        "sharegpt": (("cache.size_gb", (1, 10)), ("arrivals.session_rate", (1, 10))),
        "swebench": (
            ("cache.size_gb", (40, 100)),
            ("arrivals.session_rate", (10,)),
            ("arrivals.response_time", (7.5,)),
        ),
    }
    budget = (
        "Quick plan (--quick, about 3 minutes on 2 cores): every figure and microbenchmark "
        "point, Figs. 7-8 on 2 x 2 points per chat trace (1 and 5 GB (LMSys) or 1 and 10 GB "
        "(ShareGPT) x 1 and 10 sessions/s) and 2 SWE-bench points (40 and 100 GB, 10 "
        f"sessions/s, 7.5 s). Traces: LMSys all 15 qualifying conversations, ShareGPT the first "
        f"{QUICK_SHAREGPT_LIMIT} conversations, SWE-bench the first {QUICK_SWE_LIMIT} sessions. "
        + SWE_SCALING.format(paper=SWE_PAPER_SESSIONS, scale=scale)
        + " A smoke test more than a reproduction: too few configs for Figs. 7-8's statistics."
    )
    studies = paper_studies((QUICK_SWE_LIMIT, scale), QUICK_SHAREGPT_LIMIT, grids)
    return Plan("quick", studies, budget)
