"""Replicas behind a router, in the timed engine (``cluster.*``).

``cluster.replicas=N`` runs N timed engines (:class:`simlab.engines.timed.world.TimedWorld`) in **one** SimPy
environment: each replica has its own GPU process, FCFS queue, running set and its own cache and
policy instance (its own :class:`~simlab.engines.step.RequestStep`, built for the same policy, with
``cache.size_gb`` per replica). The chat sessions (:class:`simlab.engines.timed.feeders.SessionFeeder`) submit
each request to the cluster, and the router picks a replica at arrival; a session's next
request still arrives a think time after the previous one completed, wherever it ran.

Routers (``cluster.router``):

* ``round_robin``: request ``i`` (in submission order) goes to replica ``i mod N``;
* ``least_loaded``: the smallest load, load = queued input tokens + running requests' tokens
  (input + decoded so far);
* ``random``: uniform, seeded (``cluster.seed``, else the run seed);
* ``prefix_aware``: the largest ``overlap - load_weight x load``, overlap = the longest cached
  prefix (KV match, the checkpoint rule ignored). This is Dynamo's KV-router cost in tokens:
  Dynamo picks the worker of lowest ``w x prefill_blocks + decode_blocks`` with
  ``prefill_blocks = (pending prompt tokens + input - overlap) / block`` and ``decode_blocks``
  the active KV blocks (``--kv-overlap-score-weight`` w, default 1); dividing by ``w``, it is
  our score with ``load_weight = 1 / w`` on the decode part and 1 on the pending prompts, which
  we merge into one load: at Dynamo's default ``w = 1`` and ``load_weight = 1`` the two rank
  replicas alike (up to block rounding, and counting a running request's whole input as its
  KV even while it still prefills). SGLang's cache-aware router instead switches between a shortest-queue
  rule (when loads are imbalanced) and the highest match rate; a linear cost is the simpler of
  the two to tune and sweep (``load_weight=0``: cache affinity only);
* ``hybrid_aware``: the same cost with the **usable** hit as overlap: for a hybrid model the
  deepest SSM checkpoint on the matched path (a replica holding the KV without the state gives
  no hit); for a pure Transformer the KV match, so it routes exactly as ``prefix_aware``;
* ``session_affinity``: a session's requests go where its first went; new sessions round robin.

Ties go to the smaller load, then to the replica that got fewer requests so far, then to the
lower index (so at low load new prefixes still spread); every router is deterministic given the
config and seed.

What the router reads. The router matches with :meth:`RequestStep.peek`, a read-only lookup (no
clock tick, no recency refresh, no pin, no key assigned), so routing never changes a replica's
cache. The load is the router's own bookkeeping and is always current (real routers count their
in-flight requests). With ``cluster.router_lag_s = L > 0`` the router sees each replica's cache
as of ``L`` seconds ago: each replica has a *twin* step (same policy, fresh cache) that replays
the replica's cache operations (start, prefill published, finish) ``L`` simulated seconds after
they happened. A cache's state is a function of its operation sequence alone (its clock is
logical), so at time ``t`` the twin holds exactly the replica's cache of time ``t - L``
(operations at exactly ``t - L`` may or may not be visible yet: same-time events run in the order
they were scheduled). It is the KV-event stream of Dynamo's indexer delivered late, evictions
included, at the price of a second cache per replica.

Records and summaries. With N > 1 each record gains ``replica`` (chosen), ``best_overlap``
(the largest usable hit any replica offered at routing time, on their true caches, in tokens),
``routed_overlap`` (the chosen replica's) and ``routing_regret`` (their difference, >= 0); the
hit actually taken (``hit_tokens``) is looked up later, when the request is scheduled. The
policy's summary gains per-replica request counts, hit rates and GPU busy fractions, the load
imbalance and the regret; peaks are summed over replicas. With N = 1 the engine is the plain
timed engine, untouched: records and summaries stay byte-identical.

Disaggregation (``cluster.disaggregated``): prefill replicas and decode replicas with the KV
moved between them; see :class:`~simlab.engines.cluster.disaggregated.DisaggregatedCluster`.

Not modelled: clairvoyant policies see the whole trace's future, not their replica's share.

The package: :mod:`~simlab.engines.cluster.engine` (the engine, and
:func:`~simlab.engines.cluster.engine.with_cluster`), :mod:`~simlab.engines.cluster.router` (the
routers), :mod:`~simlab.engines.cluster.mirror` (the lagged view),
:mod:`~simlab.engines.cluster.world` (a run: the replicas in one environment),
:mod:`~simlab.engines.cluster.disaggregated` (prefill and decode replicas) and
:mod:`~simlab.engines.cluster.summary` (the summary items).
"""
