"""Seeded synthetic workloads: BatchLLM shared-prefix batches, common-context QA, chat sessions.

Ids. Every distinct piece of content (a prefix, a context, a question, a reply...) is drawn by
:class:`ContentIds`: its first id is a fresh *marker* (``vocab``, ``vocab + 1``, ... never reused)
and the rest are uniform in ``[0, vocab)``. Two different pieces therefore differ at their first
id, so prefixes match exactly where the generator shares content and nowhere else (no accidental
one-token matches); ideal reuse follows from the structure alone. Everything is drawn from one
``numpy.random.default_rng(seed)``: same parameters and seed, same trace.

Lengths. ``perturb="none"`` uses the base lengths; ``perturb="poisson"`` draws ``1 + Poisson(base -
1)`` per piece (mean = base, never below 1; BatchLLM's "lengths perturbed around base values
using a Poisson distribution"); a base of 0 stays 0.

Generators (each is a ``configs/trace/*.yaml``; requests that share nothing but a prefix are one
session each, ``turn`` 0, numbered in arrival order; ``arrival`` is NaN):

* :func:`load_batchllm` -- BatchLLM (seed 004) offline batches. Prompt = group prefix
  (``prefix_len``) + sub-group prefix (``sub_prefix_len``, 0 = single level) + distinct part
  (``distinct_len``); ``n_groups`` x ``n_subgroups`` x ``sharing_degree`` requests. Outputs fixed,
  Poisson-perturbed or bounded Pareto (``output_dist="pareto"``: shape ``pareto_shape`` on
  ``[output_min, output_max]``, inverse-CDF sampling). Requests shuffled (the paper's
  microbenchmarks shuffle) unless ``shuffle=false``. Ideal reuse, e.g.: 2000/200 with sharing
  degree 16 = 15*2000/(16*2200) = 85.2%; Table 3 setting A (50 groups x 64 sub-groups x 2,
  490 + 11 + 499) = (127*490 + 64*11)/128000 = 49.2% (BatchLLM's first-level-only 48.6% leaves the
  11-token sub-prefixes to LRU), setting B (400 + 101 + 499) = 44.7% (first level 39.7%).
  :func:`microbenchmark_batch` and :func:`table3_batch` draw the same prompts (shared
  :func:`batchllm_prompts`) as bare token arrays for the planner tests.
  Note: the paper says its Pareto outputs (alpha 1.5, 10..512) have mean 51.2 and median 25;
  a Pareto(1.5) truncated to [10, 512] has mean ~25.9 and median ~15.9, so those figures do not
  follow from the stated distribution; the generator implements the stated distribution.
* :func:`load_ccqa` -- common-context QA (seed 001, Table 1): one shared instruction, ``n_contexts``
  contexts, ``1 + Poisson(parallelism - 1)`` questions each (``round(parallelism)`` with no
  perturbation); prompt = instruction + context + question, output = answer. Presets
  :data:`CCQA_DATASETS` (NarrativeQA 5-shot, SQuAD 2.0, RACE, LongHealth).
* :func:`load_chat` -- multi-turn chat sessions: a system prompt from a shared pool, then turns of
  user message + reply; request ``k``'s input is the whole history plus the new user message, its
  output the reply (so ``input_k + output_k`` prefixes ``input_{k+1}``). Turn lengths are Poisson
  around ``user_len`` / ``reply_len``, or (``lengths=azure_conv|azure_code``) resampled
  ``(ContextTokens, GeneratedTokens)`` pairs of the Azure trace. ``max_tokens`` ends a session
  before the first request whose input + output exceeds it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from traces.format import TOKEN_DTYPE, Trace, make_frame, request_row

log = logging.getLogger(__name__)

PERTURBATIONS = ("none", "poisson")
OUTPUT_DISTS = ("fixed", "poisson", "pareto")
_MAX_ID = int(np.iinfo(np.int32).max)


class ContentIds:
    """Draws content pieces: a fresh marker id, then uniform ids in ``[0, vocab)``."""

    def __init__(self, rng: np.random.Generator, vocab: int) -> None:
        if vocab < 1:
            raise ValueError(f"vocab must be >= 1, got {vocab}")
        self.rng = rng
        self.vocab = int(vocab)
        self.next_marker = int(vocab)

    def piece(self, length: int) -> np.ndarray:
        """``length`` ids whose first is a marker never used before (empty for length 0)."""
        ids = self.rng.integers(0, self.vocab, int(length), dtype=TOKEN_DTYPE)
        if length > 0:
            if self.next_marker > _MAX_ID:
                raise OverflowError("synthetic trace needs more distinct pieces than int32 ids")
            ids[0] = self.next_marker
            self.next_marker += 1
        return ids


def perturbed(rng: np.random.Generator, base: float, perturb: str, size: int | None = None) -> Any:
    """Base length, or ``1 + Poisson(base - 1)`` (mean = base, >= 1); base 0 stays 0."""
    if perturb not in PERTURBATIONS:
        raise ValueError(f"perturb must be one of {PERTURBATIONS}, got {perturb!r}")
    if base < 0:
        raise ValueError(f"lengths must be >= 0, got {base}")
    if perturb == "none" or base == 0:
        value = round(base)
        return value if size is None else np.full(size, value, dtype=np.int64)
    return 1 + rng.poisson(max(base - 1.0, 0.0), size=size)


def bounded_pareto(
    rng: np.random.Generator, shape: float, low: float, high: float, size: int
) -> np.ndarray:
    """Integers from a Pareto(``shape``) truncated to ``[low, high]`` (inverse CDF, rounded)."""
    if not (shape > 0 and 0 < low <= high):
        raise ValueError(f"need shape > 0 and 0 < low <= high, got {shape}, {low}, {high}")
    u = rng.random(size)
    tail = 1.0 - (low / high) ** shape
    return np.rint(low / (1.0 - u * tail) ** (1.0 / shape)).astype(np.int64)


def output_lengths(
    rng: np.random.Generator,
    n: int,
    dist: str,
    output_len: int,
    pareto: tuple[float, float, float],
) -> np.ndarray:
    """``n`` output lengths: fixed, Poisson-perturbed, or bounded Pareto ``(shape, low, high)``."""
    if dist == "fixed":
        return np.full(n, int(output_len), dtype=np.int64)
    if dist == "poisson":
        return np.asarray(perturbed(rng, output_len, "poisson", size=n), dtype=np.int64)
    if dist == "pareto":
        return bounded_pareto(rng, *pareto, size=n)
    raise ValueError(f"output_dist must be one of {OUTPUT_DISTS}, got {dist!r}")


def _one_request_sessions(
    name: str,
    prompts: list[np.ndarray],
    outputs: list[np.ndarray],
    refs: dict[str, list[Any]],
    order: np.ndarray,
) -> Trace:
    """One session (turn 0) per request, numbered in ``order`` (the arrival order)."""
    rows = []
    for session_id, i in enumerate(order):
        i = int(i)
        rows.append(
            request_row(
                session_id, 0, prompts[i], outputs[i], **{f"ref_{k}": v[i] for k, v in refs.items()}
            )
        )
    return Trace(name=name, frame=make_frame(rows))


# --------------------------------------------------------------------------- BatchLLM


def batchllm_prompts(
    ids: ContentIds,
    shape: tuple[int, int, int],
    lengths: tuple[float, float, float],
    perturb: str = "none",
) -> tuple[list[np.ndarray], dict[str, list[Any]]]:
    """Prompts of a BatchLLM batch in generation order, and their ``group``/``subgroup`` refs.

    ``shape = (n_groups, n_subgroups, sharing_degree)``; ``lengths = (prefix_len, sub_prefix_len,
    distinct_len)``, each perturbed per piece by :func:`perturbed`. Draws from ``ids.rng`` only.
    """
    n_groups, n_subgroups, sharing_degree = (int(n) for n in shape)
    if min(n_groups, n_subgroups, sharing_degree) < 1:
        raise ValueError("n_groups, n_subgroups and sharing_degree must be >= 1")
    if sum(lengths) < 1:
        raise ValueError("a prompt needs at least one token")
    rng, (prefix_len, sub_prefix_len, distinct_len) = ids.rng, lengths
    prompts: list[np.ndarray] = []
    refs: dict[str, list[Any]] = {"group": [], "subgroup": []}
    for g in range(n_groups):
        group = ids.piece(perturbed(rng, prefix_len, perturb))
        for s in range(n_subgroups):
            sub = ids.piece(perturbed(rng, sub_prefix_len, perturb))
            for _member in range(sharing_degree):
                distinct = ids.piece(perturbed(rng, distinct_len, perturb))
                prompts.append(np.concatenate((group, sub, distinct)))
                refs["group"].append(g)
                refs["subgroup"].append(g * n_subgroups + s)
    return prompts, refs


def load_batchllm(
    n_groups: int = 20,
    n_subgroups: int = 1,
    sharing_degree: int = 16,
    prefix_len: int = 2000,
    sub_prefix_len: int = 0,
    distinct_len: int = 200,
    output_len: int = 100,
    output_dist: str = "fixed",
    pareto_shape: float = 1.5,
    output_min: int = 10,
    output_max: int = 512,
    perturb: str = "none",
    shuffle: bool = True,
    seed: int = 0,
    vocab: int = 32_000,
    name: str = "batchllm",
    **_: Any,
) -> Trace:
    """BatchLLM-style shared-prefix batch (see the module docstring)."""
    rng = np.random.default_rng(seed)
    ids = ContentIds(rng, vocab)
    shape = (n_groups, n_subgroups, sharing_degree)
    prompts, refs = batchllm_prompts(
        ids, shape, (prefix_len, sub_prefix_len, distinct_len), perturb
    )
    lengths = output_lengths(
        rng, len(prompts), output_dist, output_len, (pareto_shape, output_min, output_max)
    )
    outputs = [ids.piece(int(n)) for n in lengths]
    order = rng.permutation(len(prompts)) if shuffle else np.arange(len(prompts))
    log.info("batchllm: %d requests in %d groups", len(prompts), n_groups)
    return _one_request_sessions(str(name), prompts, outputs, refs, order)


#: Vocabulary of the bare prompt batches below (tests pin saving ratios on their token arrays).
BARE_VOCAB = 1 << 20


def microbenchmark_batch(
    prefix_len: int, distinct_len: int, sharing_degree: int, n_prefixes: int = 8, seed: int = 0
) -> list[np.ndarray]:
    """BatchLLM's microbenchmark (Sec. 4.2.1) as bare prompts: ``n_prefixes`` shared prefixes,
    each followed by ``sharing_degree`` distinct prompts; shuffled. The same prompts, in the same
    order, as :func:`load_batchllm` with ``n_groups=n_prefixes``, ``output_len=0`` and
    ``vocab=BARE_VOCAB``."""
    return _shuffled_prompts(seed, (n_prefixes, 1, sharing_degree), (prefix_len, 0, distinct_len))


def table3_batch(
    group_prefix: int,
    sub_prefix: int,
    prompt_len: int = 1000,
    groups: int = 50,
    subcategories: int = 64,
    per_subcategory: int = 2,
    seed: int = 0,
) -> list[np.ndarray]:
    """BatchLLM's Table 3 workload as bare prompts: ``group_prefix + sub_prefix + random_suffix``
    of ``prompt_len`` tokens; 50 groups x 64 subcategories x 2 prompts = 6,400; shuffled. The
    same prompts, in the same order, as :func:`load_batchllm` with ``n_groups=groups``,
    ``n_subgroups=subcategories``, ``sharing_degree=per_subcategory``, ``output_len=0`` and
    ``vocab=BARE_VOCAB`` (``configs/trace/batchllm_table3a``/``b`` with those overrides)."""
    suffix = prompt_len - group_prefix - sub_prefix
    shape = (groups, subcategories, per_subcategory)
    return _shuffled_prompts(seed, shape, (group_prefix, sub_prefix, suffix))


def _shuffled_prompts(
    seed: int, shape: tuple[int, int, int], lengths: tuple[int, int, int]
) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    prompts, _ = batchllm_prompts(ContentIds(rng, BARE_VOCAB), shape, lengths)
    return [prompts[i] for i in rng.permutation(len(prompts))]


# --------------------------------------------------------------------------- CCQA


class CcqaStats(NamedTuple):
    """Seed 001 Table 1: contexts, mean questions per context, mean token lengths."""

    contexts: int
    parallelism: float
    instruction: float
    context: float
    question: float
    answer: float


CCQA_DATASETS = {
    "narrativeqa_5s": CcqaStats(355, 29.73, 2754.00, 737.45, 11.97, 5.81),
    "squad2": CcqaStats(1365, 8.70, 47.00, 177.94, 12.58, 3.94),
    "race": CcqaStats(1407, 3.51, 40.00, 344.30, 39.81, 1.00),
    "longhealth": CcqaStats(20, 20.00, 73.00, 11719.75, 72.50, 1.00),
}


def load_ccqa(
    dataset: str = "squad2",
    n_contexts: int | None = None,
    perturb: str = "poisson",
    shuffle: bool = True,
    seed: int = 0,
    vocab: int = 32_000,
    **_: Any,
) -> Trace:
    """Common-context QA workload named ``ccqa_<dataset>`` (see the module docstring)."""
    if dataset not in CCQA_DATASETS:
        raise ValueError(f"dataset must be one of {sorted(CCQA_DATASETS)}, got {dataset!r}")
    stats = CCQA_DATASETS[dataset]
    n = stats.contexts if n_contexts is None else int(n_contexts)
    if n < 1:
        raise ValueError(f"n_contexts must be >= 1 or null, got {n_contexts}")
    rng = np.random.default_rng(seed)
    ids = ContentIds(rng, vocab)
    instruction = ids.piece(perturbed(rng, stats.instruction, "none"))
    prompts: list[np.ndarray] = []
    outputs: list[np.ndarray] = []
    refs: dict[str, list[Any]] = {"context": []}
    for c in range(n):
        context = ids.piece(perturbed(rng, stats.context, perturb))
        questions = perturbed(rng, stats.parallelism, perturb)
        for _question in range(int(questions)):
            question = ids.piece(perturbed(rng, stats.question, perturb))
            prompts.append(np.concatenate((instruction, context, question)))
            outputs.append(ids.piece(perturbed(rng, stats.answer, perturb)))
            refs["context"].append(c)
    order = rng.permutation(len(prompts)) if shuffle else np.arange(len(prompts))
    log.info("ccqa %s: %d contexts, %d questions", dataset, n, len(prompts))
    return _one_request_sessions(f"ccqa_{dataset}", prompts, outputs, refs, order)


# --------------------------------------------------------------------------- chat sessions


@dataclass(frozen=True)
class TurnLengths:
    """Draws ``(user_len, reply_len)`` per turn: Poisson around means, or Azure pairs."""

    user_len: float
    reply_len: float
    azure: tuple[np.ndarray, np.ndarray] | None = None

    def draw(self, rng: np.random.Generator) -> tuple[int, int]:
        if self.azure is not None:
            i = int(rng.integers(len(self.azure[0])))
            return int(self.azure[0][i]), int(self.azure[1][i])
        return int(perturbed(rng, self.user_len, "poisson")), int(
            perturbed(rng, self.reply_len, "poisson")
        )


def turn_lengths(
    lengths: str,
    user_len: float,
    reply_len: float,
    data_dir: str | os.PathLike[str] | None,
) -> TurnLengths:
    """``lengths="poisson"`` or ``"azure_conv"``/``"azure_code"`` (Azure pairs, resampled)."""
    if lengths == "poisson":
        return TurnLengths(user_len, reply_len)
    if lengths in ("azure_conv", "azure_code"):
        from traces.azure import azure_path, load_azure_arrivals

        arrivals = load_azure_arrivals(azure_path(lengths.split("_")[1], None, data_dir))
        return TurnLengths(
            user_len, reply_len, (arrivals.context_tokens, arrivals.generated_tokens)
        )
    raise ValueError(f"lengths must be poisson, azure_conv or azure_code, got {lengths!r}")


def chat_session_rows(
    rng: np.random.Generator,
    ids: ContentIds,
    session_id: int,
    system: np.ndarray,
    n_turns: int,
    lengths: TurnLengths,
    max_tokens: int | None,
) -> list[dict[str, Any]]:
    """Rows of one session; history grows by user message + reply each turn."""
    rows: list[dict[str, Any]] = []
    history = system
    for turn in range(n_turns):
        user_len, reply_len = lengths.draw(rng)
        prompt = np.concatenate((history, ids.piece(max(user_len, 1))))
        reply = ids.piece(reply_len)
        if max_tokens is not None and len(prompt) + len(reply) > max_tokens:
            break
        rows.append(request_row(session_id, turn, prompt, reply))
        history = np.concatenate((prompt, reply))
    return rows


def load_chat(
    n_sessions: int = 100,
    turns_min: int = 2,
    turns_max: int = 10,
    system_prompts: int = 4,
    system_len: int = 500,
    user_len: float = 100,
    reply_len: float = 200,
    lengths: str = "poisson",
    max_tokens: int | None = None,
    seed: int = 0,
    vocab: int = 32_000,
    data_dir: str | os.PathLike[str] | None = None,
    **_: Any,
) -> Trace:
    """Multi-turn chat sessions named ``chat_synthetic`` (see the module docstring)."""
    if n_sessions < 1 or not 1 <= turns_min <= turns_max or system_prompts < 1:
        raise ValueError("need n_sessions >= 1, 1 <= turns_min <= turns_max, system_prompts >= 1")
    rng = np.random.default_rng(seed)
    ids = ContentIds(rng, vocab)
    draw = turn_lengths(lengths, user_len, reply_len, data_dir)
    systems = [ids.piece(int(system_len)) for _ in range(int(system_prompts))]
    rows: list[dict[str, Any]] = []
    session_id = 0
    for _session in range(int(n_sessions)):
        system = systems[int(rng.integers(len(systems)))]
        n_turns = int(rng.integers(turns_min, turns_max + 1))
        session = chat_session_rows(rng, ids, session_id, system, n_turns, draw, max_tokens)
        if session:
            rows.extend(session)
            session_id += 1
    if not rows:
        raise ValueError(f"max_tokens={max_tokens} leaves no request in any session")
    return Trace(name="chat_synthetic", frame=make_frame(rows))
