"""A run's trace: the configured loader with arrival times assigned (seeded), shared by the
runs of one trace inside :func:`shared_traces`."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate

from simlab.config import ConfigError, RunSettings
from traces.agents import assign_agent_arrivals, is_agentic
from traces.arrival_modes import assign as assign_arrival_times
from traces.arrivals import GapsError
from traces.format import Request, Trace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TraceSpec:
    """The configured trace (``trace.*``, checked by :func:`simlab.run.plan.plan_run`): its
    loader (``target``), the loader's keyword arguments (``options``, resolved: plain values,
    ``name`` among them, which labels the results) and ``data_dir``."""

    target: str
    options: dict[str, Any]
    data_dir: str | None = None

    @property
    def name(self) -> str | None:
        """The name that labels the results (None: the loader's)."""
        name = self.options.get("name")
        return None if name is None else str(name)


#: ``(key, trace, requests)`` of the last trace loaded while :func:`shared_traces` is on
_shared: list[tuple[str, Trace, list[Request]]] | None = None


@contextmanager
def shared_traces() -> Iterator[None]:
    """Within this block, runs of the same trace (same ``trace`` config, data directory, arrival
    settings and seed) share one loaded trace and its requests instead of loading it again:
    the sweep launcher (``hydra_plugins.simlab_launcher``) runs a group of points in it. One
    trace is kept (the last), and none after the block. Runs never mutate a trace or its
    requests (the capacities of a list already share them)."""
    global _shared
    outer, _shared = _shared, []
    try:
        yield
    finally:
        _shared = outer


def trace_key(spec: TraceSpec, settings: RunSettings) -> str:
    """What the loaded trace and its arrival times depend on."""
    return repr((spec, settings.arrivals, settings.seed))


def trace_requests(spec: TraceSpec, settings: RunSettings) -> tuple[Trace, list[Request]]:
    """The configured trace (:func:`load_trace`) and its requests in processing order; the
    shared ones inside :func:`shared_traces` when the last run loaded the same."""
    if _shared is None:
        trace = load_trace(spec, settings)
        return trace, list(trace.requests())
    key = trace_key(spec, settings)
    if _shared and _shared[0][0] == key:
        log.info("trace shared with the previous point: %s", spec.name)
        return _shared[0][1], _shared[0][2]
    _shared.clear()
    trace = load_trace(spec, settings)
    requests = list(trace.requests())
    _shared.append((key, trace, requests))
    return trace, requests


def load_trace(spec: TraceSpec, settings: RunSettings) -> Trace:
    """Instantiate the configured loader and assign arrival times (seeded)."""
    try:
        trace: Trace = instantiate({"_target_": spec.target, **spec.options}, _convert_="all")
    except InstantiationException as err:  # a missing or malformed file: the loader's message
        if isinstance(err.__cause__, FileNotFoundError | ValueError):
            raise ConfigError(f"trace: {err.__cause__}") from err
        raise
    trace.name = spec.name or trace.name  # the config's name labels results
    arrivals = settings.arrivals
    if is_agentic(trace):
        return agent_arrivals(trace, settings)
    try:
        return assign_arrival_times(
            trace,
            mode=arrivals.mode,
            session_rate=arrivals.session_rate,
            think_time_mean=arrivals.think_time_mean,
            seed=settings.seed,
            azure=arrivals.azure,
            azure_path=arrivals.azure_path,
            data_dir=spec.data_dir,
            time_scale=arrivals.time_scale,
            gaps=arrivals.gaps,
            typing_wpm=arrivals.typing_wpm,
            response_time=arrivals.response_time,
        )
    except GapsError as err:  # e.g. typing gaps on a trace without word counts
        raise ConfigError(f"arrivals.gaps={arrivals.gaps}: {err}") from err
    except ValueError as err:  # e.g. timestamps on a trace without them
        raise ConfigError(f"arrivals.mode={arrivals.mode}: {err}") from err


def agent_arrivals(trace: Trace, settings: RunSettings) -> Trace:
    """An agentic trace's arrivals: its root sessions start by ``arrivals.mode`` (or its closed
    loop), everything else follows its session graph (:mod:`traces.agents`); the gaps within a
    session are the trace's own, so ``arrivals.gaps`` must stay ``exponential`` and
    ``arrivals.think_time_mean`` is not used."""
    arrivals = settings.arrivals
    if arrivals.gaps != "exponential":
        raise ConfigError(f"arrivals.gaps={arrivals.gaps}: an agentic trace has its own gaps")
    try:
        return assign_agent_arrivals(
            trace,
            mode=arrivals.mode,
            session_rate=arrivals.session_rate,
            seed=settings.seed,
            time_scale=arrivals.time_scale,
        )
    except ValueError as err:
        raise ConfigError(f"arrivals.mode={arrivals.mode}: {err}") from err
