"""The compiled kernel of :mod:`simlab.fastpaths.radix.kernel`:
:func:`~simlab.fastpaths.radix.jit.serve.replay`, numba-compiled on first use and cached beside
its module (``cache=True``), so later processes load it. Every module but :mod:`.layout` imports
numba: import them only when numba is installed and the compiled path is asked for.

Each function is the :mod:`simlab.cache` (``tree``, ``match``, ``insertion``, ``evictor``)
function or method of the same name (or the step it names), over a few flat arrays held in one tuple ``st``
(:data:`~.layout.NODES` .. :data:`~.layout.TOKENS`; few, because numba counts references to
every array a function takes out of a tuple, and those atomic counts cost more than the tree's
work):

* ``NODES`` (int64, one column per node slot; the root is slot 0): ``PARENT``, ``START``,
  ``END`` (positions in ids of ``UNIT`` tokens), ``REF`` (where in ``tokens`` a sequence through the node starts: ``tokens[ref + p]``
  is the token at position ``p`` of its path), ``NID``, ``PINS``, ``KIDS`` (children),
  ``KID_SUM`` (the sum of the children's slots: a one-child node's only child), ``CKPT`` and
  ``ALIVE`` (0 / 1);
* ``FLOATS`` (float64, per slot): ``LAST`` (last access), ``SIZE`` (``node_bytes``) and
  ``SAVED`` (``saved_flops``);
* ``TABLE``: the children, an open-addressing hash table (row 0 keys, row 1 values) from
  ``(parent slot, first token)`` to the child's slot;
* ``INTS`` (int64): the counters ``FREE`` .. ``TOP`` and the settings
  ``KV_PER_TOKEN`` .. ``UNIT``; ``SETTINGS`` (float64): ``NOW`` .. ``QQ``;
  ``FREE_SLOTS``: the free slots (a stack); ``TOKENS``: every sequence's tokens.

Slots past ``TOP`` hold nothing (a copy leaves them uninitialised: a new node writes every
column), and no loop reads them.

The modules: :mod:`.layout` (the arrays' rows and codes, plain Python), :mod:`.decorators`
(numba's two compilations), :mod:`.table` (the children table), :mod:`.nodes`, :mod:`.match`
(the walk, the hit, the states to plan), :mod:`.heap` and :mod:`.evict` (eviction),
:mod:`.admit` (insertion) and :mod:`.serve` (a request, and :func:`~.serve.replay`).

numba's cache checks only the file of the function it caches; :mod:`.decorators` deletes the
package's cache files whenever any module here changed, so no caller keeps a stale callee.
"""
