"""vLLM's block keys of a request (:mod:`simlab.engines.block_pool`): the chained hashes of its
full blocks, for token and hash-id requests alike."""

from __future__ import annotations

from collections.abc import Sequence

from traces.format import Request


def committed_tokens(req: Request, committed: bool) -> int:
    """Tokens of ``req`` whose KV is computed: all but the last sampled one when
    ``committed`` (the engine never feeds it back)."""
    return req.input_tokens + req.output_len - (1 if committed and req.output_len else 0)


def token_keys(tokens: Sequence[int], size: int, committed: int) -> list[int]:
    """vLLM's chained block hashes of the full ``size``-token blocks of ``tokens`` within the
    first ``committed``: block ``i``'s key hashes block ``i - 1``'s with its tokens."""
    keys, chain = [], 0
    for i in range(committed // size):
        chain = hash((chain, tuple(tokens[i * size : (i + 1) * size])))
        keys.append(chain)
    return keys


#: an output token of a hash-id request: its replies are unknown (``crosscheck.export``)
REPLY_TOKEN = -1


def request_keys(req: Request, size: int, committed: int) -> list[int]:
    """:func:`token_keys` of ``req``'s first ``committed`` tokens. A hash-id request's tokens
    are its ids, each ``block_size`` times, cut at its true length, then its outputs, each
    :data:`REPLY_TOKEN` (what ``crosscheck.export --outputs trace`` gives the engines): a
    block's content is its runs ``(value, count)``, which are equal exactly where the tokens
    are (adjacent runs of one value merged), so the keys match exactly where vLLM's hashes of
    those tokens do, without spelling the tokens out."""
    if req.block_size == 1:
        return token_keys(req.full_sequence().tolist(), size, committed)
    ids, unit, prompt = req.input_ids.tolist(), req.block_size, req.input_tokens
    keys, chain = [], 0
    whole = min(committed, prompt) // size if unit == size else 0
    for value in ids[:whole]:  # a block of one id: its one run (the loop below gives it too)
        chain = hash((chain, ((value, size),)))
        keys.append(chain)
    for i in range(whole, committed // size):
        runs: list[tuple[int, int]] = []
        pos, end = i * size, (i + 1) * size
        while pos < end:
            if pos < prompt:
                value, stop = ids[pos // unit], min(end, (pos // unit + 1) * unit, prompt)
            else:
                value, stop = REPLY_TOKEN, end
            if runs and runs[-1][0] == value:
                runs[-1] = (value, runs[-1][1] + stop - pos)
            else:
                runs.append((value, stop - pos))
            pos = stop
        chain = hash((chain, tuple(runs)))
        keys.append(chain)
    return keys
