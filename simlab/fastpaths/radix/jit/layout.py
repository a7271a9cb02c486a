"""The layout of the kernel's state ``st`` (see :mod:`simlab.fastpaths.radix.jit`): which array
is which, their rows, the counters and settings, and the codes the kernel returns. Plain Python:
it imports no numba."""

ROOT = 0
EMPTY = -1
TOMB = -2
# st
NODES, FLOATS, TABLE, INTS, SETTINGS, FREE_SLOTS, TOKENS = range(7)
# NODES rows
PARENT, START, END, REF, NID, PINS, KIDS, KID_SUM, CKPT, ALIVE = range(10)
N_ROWS = 10
# FLOATS rows
LAST, SIZE, SAVED = range(3)
# INTS: free slots, the next node id, KV bytes, SSM bytes, their peaks, table entries in use
# (tombstones too), slots ever used; then KV bytes per token, checkpoint bytes, hybrid, the
# eviction kind, round_down, the chunk
FREE, NEXT_NID, KV, SSM, PEAK_KV, PEAK_SSM, PEAK, FILL, TOP = range(9)
KV_PER_TOKEN, CKPT_BYTES, HYBRID, EVICTION, ROUND_DOWN, CHUNK = range(9, 15)
# ... the admission kind, a fine-grained admission's block, the page a Transformer's hit rounds
# down to
ADMISSION, BLOCK, PAGE = range(15, 18)
# ... tokens per id (``PrefixCache.unit``: 1, or a hash-id trace's block; ``KV_PER_TOKEN`` is
# per id)
UNIT = 18
N_INTS = 19
# eviction kinds (radix_kernel.EVICTIONS)
FLOP_AWARE, LRU = 0, 1
# admission kinds (radix_kernel.ADMISSIONS)
JUDICIOUS, FINE_GRAINED = 0, 1
# why replay stopped: all served, after the first eviction, no room for the next request's nodes
DONE, EVICTED, ROOM = 0, 1, 2
# SETTINGS: the clock, capacity, alpha, the prefill FLOPs' coefficients
# (ModelSpec.prefill_coefficients)
NOW, CAPACITY, ALPHA, LIN, PQ, QQ = range(6)
# an admission's result (InsertResult): KV bytes, SSM bytes, states, bytes and nodes evicted,
# truncated
R_KV, R_SSM, R_CKPTS, R_FREED, R_EVICTED, R_TRUNCATED = range(6)
