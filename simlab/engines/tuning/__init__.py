"""Marconi's retrospective tuning of ``alpha`` (paper Sec. 4.2, "Managing the balance").

``policy.tuning.protocol`` selects a whole protocol
(:data:`~simlab.engines.tuning.settings.PROTOCOLS`); every other ``policy.tuning`` key left null
takes that protocol's value, an explicit value overrides it.

Common to every protocol. ``alpha = 0`` (recency only) until the first tuning. ``N`` is the number
of requests seen up to and including the one whose admission first evicted a node. A tuning replays
a *window* of requests on copies of a snapshot of the cache taken at the window's start, one copy
per grid alpha (in parallel across ``workers`` processes: this one and ``workers - 1`` workers,
:func:`simlab.engines.tuning.search.grid_results`), scores each replay on ``objective`` over its
last ``score_last`` requests (all of them when null) and adopts the winner for every later request.
Invariants: 0 is always in the grid (a grid without it is rejected), so recency only is always a
candidate; the adopted alpha scores at least as well on the window as the alpha it replaces, and as
alpha 0 up to ``margin`` (exactly, with the default margin 0); ties go to the smallest alpha, so the
result never depends on the number of workers or their order; the same seed gives the same run.
The first window is ``first_window`` requests when set (else ``bootstrap_multiplier x N``, as each
protocol below says): a short trace can end before it. A run with fewer than ``min_tunings``
tunings (default 1) logs a WARNING that says why and lists it in its summary's ``caveats``; its
summary's ``alpha`` gives the final, smallest and largest adopted alpha and the number of tunings.

``paper``: what the Marconi reference code does (``../shared/notes/marconi_reference.md`` Sec. 2.5;
``radix_cache_hybrid.py``, ``config_tuner.py``).

* ``snapshot: start``: the snapshot is the *empty* cache before the first request, and the window is
  the first ``max(N, round(bootstrap_multiplier x N))`` requests of the trace, from its start.
  ``bootstrap_multiplier`` 5 (the reference sets 15 for LMSys).
* Each alpha replays the whole window from the empty snapshot and is scored on its last
  ``score_last: 500`` requests, objective ``flops_saved``; grid 0, 0.1, ..., 2.0 (21 values).
* Tuned exactly once (``retune_every: null``); if the trace ends before the window fills, ``alpha``
  stays 0 (and the run warns: :meth:`~simlab.engines.tuning.tuner.AlphaTuner.caveats`).
* Deviation: the reference breaks ties between equally scored alphas by its worker processes'
  completion order (nondeterministic, and ties are common); simlab takes the smallest alpha.
* The paper's *text* differs from its code: it snapshots at the first eviction and replays the
  bootstrap requests from there (``snapshot: first_eviction``), and adopts the alpha that maximises
  the hit rate (``objective: token_hit_rate``), over the whole window.

``robust`` (the default): grid 0, 0.1, ..., 1.0 (:data:`~simlab.engines.tuning.settings.ROBUST_GRID`
says why not above 1); ``snapshot: first_eviction``, so the first window is the
``round(bootstrap_multiplier x N)`` requests after the first eviction (multiplier 5), replayed from
the cache as it was then; objective ``token_hit_rate`` on the last ``score_last: 50`` requests of
each replay; re-tuned every ``retune_every: 50`` requests on the last ``window`` requests (default:
the first window's length), replayed from a snapshot taken at their start (never earlier than the
first eviction); hysteresis: the alpha in force (the *incumbent*, scored like every grid alpha) is
kept unless another beats it by more than ``margin`` (default 0: a tie keeps it), in the objective's
share (token hit rate, or FLOPs saved / prefill FLOPs of the scored requests). Why each of these:
:data:`~simlab.engines.tuning.settings.PROTOCOLS`. That tuned Marconi stays within 0.5 points of
SGLang+'s token hit rate is measured, not guaranteed: a window replay cannot see what the cache it
leaves behind is worth.

Snapshot (:func:`simlab.cache.snapshot.pack` / :func:`simlab.cache.snapshot.unpack`). A
:class:`CacheImage` is the cache as plain data: its attributes with every per-slot array copied and
each tree node flattened to a row whose parent/children are slot numbers. Packing is iterative (no
recursion, so no depth limit, unlike ``copy.deepcopy`` or ``pickle`` of a deep tree) and shares the
token arrays, which the cache never writes in place. Pins are cleared: a replay has nothing in
flight. The ``start`` snapshot is an empty cache of the same shape
(:func:`simlab.engines.tuning.window.empty_like`).

The tuner is an engine-level controller (:class:`simlab.engines.step.Controller`): the request step
calls :meth:`simlab.engines.tuning.tuner.AlphaTuner.observe` after every admission, for any eviction
policy that is :class:`simlab.cache.contract.Tunable` (``set_alpha``), Marconi's and Marconi+'s. The
window is the *admission order*: the arrival order with ``engine=replay``, the completion order with
``engine=timed``. Window replays run through the same request step (without time, queueing or pins),
one fresh copy of the policy per alpha. The first eviction is the first admission that evicted a
node. Adoption is immediate: the grid search costs wall time, not simulated time (the paper runs it
asynchronously in seconds).

The package: :mod:`~simlab.engines.tuning.settings` (``policy.tuning`` and the protocols),
:mod:`~simlab.engines.tuning.window` (a window's replay and its result),
:mod:`~simlab.engines.tuning.search` (the grid search and its worker processes) and
:mod:`~simlab.engines.tuning.tuner` (the controller: its schedule and snapshots).
"""
