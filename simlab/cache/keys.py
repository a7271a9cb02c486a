"""How a request is keyed in the prefix cache (:class:`simlab.cache.contract.Keys`).

A :class:`KeyedRequest` is what the request step matches and admits:

* ``lookup``: the ids the input is matched with (the hit rule caps a hit at ``len - 1``);
* ``sequence``: the ids the running request allocates;
* ``cacheable``: how many leading ids of ``sequence`` may stay in the cache;
* ``prompt``: how many of those the prompt alone fills (what a prefill can publish).

Schemes:

* **tokens** (the paper's policies, and SGLang's radix tree): the trace's own ids. The sequence
  is input + output, or with ``committed`` input + output - 1: a production engine never feeds
  back the last sampled token, so its KV and state are never computed. Everything is cacheable.
* **blocks of B ids** (vLLM's block pool): each full block becomes one id, identified by its
  content; under its parent in the tree that is the block hash chain, so two sequences share a
  block only if they agree on all of it and on everything before it (a branch inside a block
  duplicates the block). A partial tail block gets an id of its own that matches nothing and
  is never cached, but the running request holds it (``sequence`` includes it).

Hash-id traces (ids of many tokens) keep their ids; ``committed`` then has nothing to trim (an
id is the smallest unit the trace knows). A prompt's last id usually holds fewer tokens than
the others (``Request.input_tokens`` short of ids x id tokens):

* for blocks it is a partial block, so the full blocks are counted in tokens, unless
  ``whole_last_id`` counts it whole (:class:`simlab.cache.contract.Keys`);
* for tokens it is a *short id*: keyed by (id, tokens), a negative id of its own (trace ids are
  >= 0), so it matches only the same id of the same length, and ``short`` tells the cache how
  many tokens it lacks (SGLang's radix tree holds the prompt's true tokens). The ids are
  content hashes of the blocks, so a partial block's id never names a full block nor one of
  another length (none of the 3,776 tail ids of Mooncake's trace does); where a trace breaks
  that, the token-level match would reach into the id and this one stops before it. The trace
  admits no output, so a short id always ends its sequence.

Invariants: ``lookup`` is a prefix of the sequence the input would allocate, except for a
partial block; ids are deterministic in content, so the same requests give the same keys in any
order of calls.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from simlab.cache.contract import Keys
from traces.format import TOKEN_DTYPE, Request

_ID_BYTES = np.dtype(TOKEN_DTYPE).itemsize
#: sessions whose last view :meth:`BlockKeys.session_blocks` keeps (the most recent; an older
#: session's next request keys every block, with the same ids): bounds the memory it holds
SESSIONS_KEPT = 4096


@dataclass(slots=True)
class KeyedRequest:
    """A request as the cache sees it (see the module docstring)."""

    lookup: np.ndarray
    sequence: np.ndarray
    cacheable: int
    prompt: int  # leading ids of ``sequence`` that the prompt fills (cacheable after prefill)
    short: int = 0  # tokens the sequence's last id lacks (token keys: a short id, else 0)


def sequence_ids(req: Request, committed: bool) -> np.ndarray:
    """Input + output ids, without the last output token when ``committed`` (token traces)."""
    seq = req.full_sequence()
    if committed and req.block_size == 1 and req.output_ids.shape[0] > 0:
        return seq[:-1]
    return seq


@dataclass(frozen=True, slots=True)
class TokenKeys:
    """The trace's own ids, a hash-id prompt's short last id keyed apart (module docstring)."""

    committed: bool = False
    _short_ids: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)

    def view(self, req: Request) -> KeyedRequest:
        inputs, outputs = req.input_ids, req.output_ids
        if outputs.shape[0] == 0:
            n, short = inputs.shape[0], short_tokens(req)
            if short:
                inputs = self._with_short_id(inputs, self._short_id(req, short))
            return KeyedRequest(inputs, inputs, n, n, short)
        seq = np.concatenate(
            (inputs, outputs[:-1] if self.committed and req.block_size == 1 else outputs)
        )
        return KeyedRequest(inputs, seq, seq.shape[0], inputs.shape[0])

    def lookup_ids(self, req: Request) -> np.ndarray:
        """The ids :meth:`view` would match, read-only: a short id never seen gets one no
        node holds (the next :meth:`view` would assign), so the match stops there."""
        short = short_tokens(req) if req.output_ids.shape[0] == 0 else 0
        if not short:
            return req.input_ids
        key = (int(req.input_ids[-1]), short)
        known = self._short_ids.get(key, -1 - len(self._short_ids))
        return self._with_short_id(req.input_ids, known)

    def _short_id(self, req: Request, short: int) -> int:
        """The id of ``req``'s short last id: one per (id, tokens), in order of first view."""
        ids = self._short_ids
        return ids.setdefault((int(req.input_ids[-1]), short), -1 - len(ids))

    @staticmethod
    def _with_short_id(inputs: np.ndarray, short_id: int) -> np.ndarray:
        out = inputs.copy()
        out[-1] = short_id
        return out


def short_tokens(req: Request) -> int:
    """Tokens a hash-id prompt's last id lacks (0: token traces, or a whole last id)."""
    if req.block_size == 1 or req.input_len == 0:
        return 0
    return max(0, req.input_len * req.block_size - req.input_tokens)


@dataclass
class BlockKeys:
    """Blocks of ``block_size`` ids, one id per distinct block content (module docstring)."""

    block_size: int
    committed: bool = True
    whole_last_id: bool = False  # hash-id traces: a short last id counts as a whole one
    #: key only the blocks after those a request shares with its session's last view
    #: (:meth:`session_blocks`); False keys every block (the same ids)
    share_prefixes: bool = True
    _ids: dict[int | bytes, int] = field(default_factory=dict, repr=False)
    _latest: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)
    _partial: itertools.count = field(default_factory=lambda: itertools.count(-1, -1), repr=False)

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")

    def whole_ids(self, req: Request) -> int:
        """Leading input ids that hold all their tokens: every id, except a hash-id trace's
        last one when the prompt ends inside it (``input_tokens`` short of ids x id tokens)
        and ``whole_last_id`` is off."""
        n = req.input_len
        return n - 1 if short_tokens(req) and not self.whole_last_id else n

    def input_blocks(self, req: Request) -> int:
        """Full blocks of the input (the most a lookup can match)."""
        return self.whole_ids(req) // self.block_size

    def view(self, req: Request) -> KeyedRequest:
        seq = sequence_ids(req, self.committed)
        n_input, whole = req.input_len, self.whole_ids(req)
        full = self.session_blocks(req.session_id, seq if whole == n_input else seq[:whole])
        n_full = whole // self.block_size
        lookup = full[:n_full]
        if n_input > n_full * self.block_size:
            lookup = np.append(lookup, next(self._partial)).astype(TOKEN_DTYPE)
        sequence = full
        if seq.shape[0] > full.shape[0] * self.block_size:
            sequence = np.append(full, next(self._partial)).astype(TOKEN_DTYPE)
        prompt = min(n_full, int(full.shape[0]))
        return KeyedRequest(lookup, sequence, int(full.shape[0]), prompt)

    def lookup_ids(self, req: Request, refill: int = 0) -> np.ndarray:
        """The ids :meth:`view` would match, read-only: no id is assigned, so a router may peek
        without changing the numbering. A block content never seen (and the partial tail block)
        gets ``len(ids)``, an id no node holds, so the match stops there as it would.
        ``refill``: a recomputed request's input followed by its first ``refill`` outputs (its
        fill ids; a trace of tokens)."""
        ids, n = req.input_ids, req.input_len
        n_full = self.input_blocks(req)
        if refill > 0:
            ids = np.concatenate((ids, req.output_ids[:refill]))
            n += refill
            n_full = n // self.block_size
        fresh, get = len(self._ids), self._ids.get
        out = [get(block, fresh) for block in self._contents(ids[: n_full * self.block_size])]
        if n > n_full * self.block_size:
            out.append(fresh)
        return np.asarray(out, dtype=TOKEN_DTYPE)

    def session_blocks(self, session: int, source: np.ndarray) -> np.ndarray:
        """The ids of ``source``'s full blocks (read-only). A chat's or an agent's request
        repeats its session's previous one and adds to it: the leading whole blocks it shares
        with the session's last view (one array comparison) take that view's ids, and only the
        blocks after them are keyed. The same ids as keying every block, since those contents
        were keyed then; ``tests/test_block_walk.py`` checks it on real traces."""
        latest = self._latest.get(session) if self.share_prefixes else None
        if latest is None:
            full = self._full_blocks(source)
        else:
            end = source.shape[0] // self.block_size * self.block_size
            shared = shared_prefix(source[:end], latest[0]) // self.block_size
            rest = self._full_blocks(source[shared * self.block_size : end])
            full = np.concatenate((latest[1][:shared], rest))
        full.setflags(write=False)
        if self.share_prefixes:
            self._latest.pop(session, None)  # the most recent session last
            self._latest[session] = (source, full)
            if len(self._latest) > SESSIONS_KEPT:
                del self._latest[next(iter(self._latest))]
        return full

    def _contents(self, ids: np.ndarray) -> list[int] | list[bytes]:
        """The content of each block of ``ids`` (whole blocks): the id itself for blocks of one
        id (a hash-id trace in blocks of its ids), else the block's bytes as one ``bytes``
        object (a void view: no per-block slicing). The keys of :attr:`_ids`."""
        if self.block_size == 1:
            return ids.tolist()
        contiguous = np.ascontiguousarray(ids, dtype=TOKEN_DTYPE)
        return contiguous.view(f"V{self.block_size * _ID_BYTES}").tolist()

    def _full_blocks(self, seq: np.ndarray) -> np.ndarray:
        """One id per full block of ``seq``; a new content gets the next id."""
        n_full = seq.shape[0] // self.block_size
        blocks = self._contents(seq[: n_full * self.block_size])
        ids = self._ids
        out = list(map(ids.get, blocks))  # known contents (all, when seen by ``prepare``)
        if None in out:  # a new content gets the next id, in order of first appearance
            setdefault = ids.setdefault
            out = [setdefault(b, len(ids)) for b in blocks]
        return np.asarray(out, dtype=TOKEN_DTYPE)


def shared_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading ids ``a`` and ``b`` hold alike."""
    n = min(a.shape[0], b.shape[0])
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.shape[0] else n


KeyScheme = TokenKeys | BlockKeys


def key_scheme(keys: Keys) -> KeyScheme:
    """The scheme a policy's :class:`~simlab.cache.contract.Keys` asks for (a fresh id table)."""
    if keys.block_size is None:
        return TokenKeys(keys.committed)
    return BlockKeys(keys.block_size, keys.committed, keys.whole_last_id)
