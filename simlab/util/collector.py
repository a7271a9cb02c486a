"""The cyclic garbage collector paused while a simulation runs.

A simulation allocates millions of tree nodes, and each of the collector's passes walks every
node still cached again (SWE-bench, vLLM+ on the timed engine: 1,974 passes, 0.41 s of 4.3 s).
Pausing it frees nothing late, by an invariant of the engines: they make no reference cycles
while they run, so reference counting frees whatever they drop (``tests/test_collector.py``,
on every engine, on traces of two lengths). A world's own cycles (the tree's parent and child
links, SimPy's processes) wait for the collector once the run is over; a tuner's copies of
the tree are dismantled as it drops them (:meth:`simlab.cache.prefix.PrefixCache.dismantle`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the body without the collector's passes: the objects alive on entry (modules,
    configs, the trace) are frozen out of its reach (``gc.freeze``) and it does not run
    (``gc.disable``) until exit, when it is back on. A pause within a pause, or with the
    collector off already, changes nothing."""
    if not gc.isenabled():
        yield
        return
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()
