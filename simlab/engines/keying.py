"""How a request step keys its requests against its cache, and counts ids as tokens.

A :class:`StepKeys` holds the admission's key scheme (:mod:`simlab.cache.keys`: token ids, or
block ids standing for ``per_key`` tokens each), the views it made of the run's requests ahead
of time, and the rules that turn a match in ids into tokens: the ids a (recomputed) request is
matched with and the tokens a hit of so many ids reuses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from simlab.cache.keys import BlockKeys, KeyedRequest, KeyScheme, TokenKeys, short_tokens

if TYPE_CHECKING:
    from simlab.cache.prefix import PrefixCache
    from traces.format import Request


class StepKeys:
    """A step's key scheme over its cache; see the module docstring."""

    def __init__(self, scheme: KeyScheme, cache: PrefixCache):
        self.scheme = scheme
        self.per_key = scheme.block_size if isinstance(scheme, BlockKeys) else 1  # trace ids
        self.unit = cache.unit  # tokens per cache id
        self.exact_tokens = cache.exact_tokens
        #: a radix tree keyed by pages of a token trace (SGLang's ``--page-size``): a key is
        #: ``cache.unit`` tokens
        self.pages_of_tokens = (
            cache.block_keys and not cache.block_nodes and cache.unit == self.per_key
        )
        self.tokens_are_ids = self.per_key == 1 and cache.unit == 1
        #: block keys (token keys with short ids): each prepared request's view, used (once)
        #: by :meth:`view`
        self._views: dict[int, tuple[Request, KeyedRequest]] = {}

    def prepare(self, requests: Sequence[Request]) -> Sequence[Request]:
        """The run's requests as the plug-ins see them: with block keys (or a hash-id prompt's
        short last id) each one's keyed input (``input_ids``) instead of its tokens, its view
        kept for :meth:`view`."""
        if not (isinstance(self.scheme, BlockKeys) or any(map(short_tokens, requests))):
            return requests
        views = [self.scheme.view(r) for r in requests]
        self._views = {id(r): (r, v) for r, v in zip(requests, views, strict=True)}
        return [replace(r, input_ids=v.lookup) for r, v in zip(requests, views, strict=True)]

    def view(self, req: Request) -> KeyedRequest:
        """``req`` as the cache sees it: the view :meth:`prepare` made, the first time (block
        ids depend on content only, so a fresh view would differ only in the partial tail
        block's id, which matches nothing and is never cached), else a fresh one."""
        if self._views:
            entry = self._views.pop(id(req), None)
            if entry is not None and entry[0] is req:
                return entry[1]
        return self.scheme.view(req)

    def lookup_ids(self, req: Request) -> np.ndarray:
        """The ids ``req``'s input is matched with (no key assigned)."""
        return self.scheme.lookup_ids(req)

    def fill(self, ids: np.ndarray, req: Request, refill: int) -> tuple[np.ndarray, int]:
        """The ids a request is matched with and the outputs among them: ``ids`` (its
        prompt's lookup) followed by the ``refill`` outputs a recomputed request prefills again,
        on a tree of tokens (SGLang keys a retracted request by its fill ids,
        ``origin_input_ids + output_ids``, as it matches, refreshes and publishes it; a hybrid's
        publish keeps the state at the fill's end,
        :meth:`simlab.engines.publish.Publisher.prefill_states`); elsewhere the prompt's alone."""
        if refill <= 0:
            return ids, 0
        if self.pages_of_tokens:  # the fill ids' pages (``RadixKey.page_aligned``)
            assert isinstance(self.scheme, BlockKeys)
            return self.scheme.lookup_ids(req, refill), refill
        if not (isinstance(self.scheme, TokenKeys) and self.unit == 1):
            return ids, 0
        return np.concatenate((ids, req.output_ids[:refill])), refill

    def refill_ids(self, req: Request, prompt: int, refill: int) -> int:
        """Ids of the sequence past its ``prompt`` ids that a recompute's ``refill`` outputs
        fill: the outputs themselves on a tree of tokens; on a tree of pages, the full pages
        the input and those outputs make past the prompt's (what its publish caches)."""
        if refill <= 0 or not self.pages_of_tokens:
            return refill
        return (req.input_len + refill) // self.per_key - prompt

    def hit_tokens(self, req: Request, ids: int, refill: int = 0) -> int:
        """Tokens a hit of ``ids`` trace ids reuses: with ``cache.exact_tokens`` (ids of many
        tokens, a Transformer's token-keyed tree) the hit rule leaves one token, as SGLang's
        radix tree over the prompt's tokens does, not one id. With ``refill`` (ids are tokens)
        the hit may run into the recomputed outputs, up to the last one."""
        if refill > 0:
            return min(ids, req.input_tokens + refill - 1)
        tokens = req.hit_tokens(ids)
        return min(tokens, req.input_tokens - 1) if self.exact_tokens else tokens
