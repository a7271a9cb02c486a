"""Generate ``docs/reference/configuration.md`` from the typed settings and the YAML defaults.

The typed sections (``cache``, ``arrivals``, ``metrics``, ``cluster`` and the run view) come from
the dataclasses of :mod:`simlab.config` (``dataclasses.fields``: name, type, default); the config
groups (``engine``, ``hardware``, ``model``, ``trace``, ``policy`` ...) from the YAML files under
``configs/``. A key's meaning is, in this order: its ``#:`` comment in ``simlab/config.py``, its
comment in the YAML file, the class docstring's ``name``: entry, its inline comment in
``simlab/config.py``, or the short text in :data:`MEANINGS` below. A key with none of them is
reported (the mkdocs hook turns that into a warning, which fails ``mkdocs build --strict``).

Run by the mkdocs hook (``docs/hooks.py``) before every build, or by hand::

    python docs/gen_config_reference.py            # writes docs/reference/configuration.md
    python docs/gen_config_reference.py --check    # exit 1 if the committed page is stale
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import math
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
OUT = ROOT / "docs" / "reference" / "configuration.md"

# Short meanings for keys whose YAML and code carry no comment (written from the code that reads
# them). Keys are "group.key" (or "group/option.key"); a bare key applies to every group.
MEANINGS: dict[str, str] = {
    # generic
    "_target_": "the class or loader function Hydra instantiates for this option",
    "name": "the option's name, as summaries, records and run directories show it",
    # top level
    "seed": "the run seed: Poisson arrivals, think times, random routers and orders, synthetic "
    "traces (a non-negative integer)",
    "defaults.trace": "the workload (`trace=NAME`)",
    "defaults.model": "the model whose KV and SSM-state bytes and FLOPs are simulated "
    "(`model=NAME`)",
    "defaults.engine": "the engine that drives the requests (`engine=NAME`)",
    "defaults.hardware": "the GPU preset the timed engine's cost model uses (`hardware=NAME`)",
    "defaults.compare": "the standard policy set a run compares when no `+policy=NAME` is given",
    "defaults.bounds.clairvoyant": "the clairvoyant policy whose hit rate is reported beside "
    "every policy (`policy@bounds.clairvoyant=clairvoyant_blocks` for the block-trie Belady)",
    # arrivals
    "arrivals.azure": "mode `azure`: which Azure LLM inference arrival trace starts the sessions "
    "(`conv` or `code`)",
    "arrivals.azure_path": "mode `azure`: a file of your own in the Azure trace's format, "
    "instead of the one `arrivals.azure` names under `data_dir`",
    "arrivals.time_scale": "modes `azure` and `timestamps`: a factor on the arrival clock (0.5 = "
    "twice as fast, 2 = half as fast)",
    # run settings (the typed view)
    "run.seed": "the run seed (`seed`)",
    "run.cache": "the `cache.*` section, validated",
    "run.arrivals": "the `arrivals.*` section, validated",
    "run.metrics": "the `metrics.*` section, validated (the request-hit rule)",
    "run.cluster": "the `cluster.*` section, validated",
    # engine
    "engine.name": "the engine's name (`timed`, `replay` or `offline`)",
    "engine.hardware": "the GPU the engine runs on: the `hardware` group's preset",
    "engine.max_running": "running requests at most (the offline engine: memory-centric "
    "batching, the running-memory threshold limits the batch)",
    "engine.scheduler": "the offline scheduler (`offline@engine.scheduler=batchllm|"
    "threshold_sort|random_order`; the `offline` group below)",
    # hardware
    "hardware.name": "the preset's name",
    "hardware.compute_capability": "the GPU's CUDA compute capability (null: not CUDA); vLLM's "
    "kernel choices follow it (a GDN model's block on Hopper: engine geometry guide)",
    "hardware.system": "the GPU's name in aiconfigurator-core's measured kernel tables "
    "(`engine.kernels=measured`); null: no tables, the calibrated roofline",
    "hardware.peak_tflops": "published dense FP16/BF16 tensor-core peak, TFLOP/s",
    "hardware.mem_bw_gbps": "published memory bandwidth, GB/s",
    "hardware.mem_gb": "GPU memory, GB: cache + running memory + weights must fit "
    "`mem_gb x engine.tp` (unless `engine.memory_check=false`)",
    "hardware.fp32_tflops": "CUDA-core FP32 peak, TFLOP/s: the ceiling of the selective scan, "
    "the recurrent decode step and the elementwise ops (null: no ceiling)",
    "hardware.link_bw_gbps": "GPU-to-GPU link bandwidth per direction, GB/s (tensor-parallel "
    "all-reduce)",
    "hardware.calibration": "the preset's default calibration file (`engine.calibration` reads "
    "it; null: the default efficiencies)",
    # model
    "model.name": "the preset's name",
    "model.architecture": "the Hugging Face architecture the engines' per-model defaults key on "
    "(e.g. vLLM's FP32 SSM state for `NemotronHForCausalLM`); empty: none",
    "model.flop_formula": "`paper`: the Marconi paper's per-layer formulas; `exact`: matmul "
    "FLOPs counted as 2 m n k, GQA, gated MLPs and MoE included",
    "model.d_model": "hidden size",
    "model.n_attn_layers": "attention layers (they hold KV)",
    "model.n_ssm_layers": "SSM (Mamba) layers (they hold the recurrent and conv state)",
    "model.n_mlp_layers": "dense MLP layers",
    "model.n_moe_layers": "mixture-of-experts layers",
    "model.n_heads": "attention (query) heads",
    "model.n_kv_heads": "KV heads (0: `n_heads`, multi-head attention)",
    "model.head_dim": "attention head dimension (0: `d_model // n_heads`)",
    "model.mlp_intermediate": "MLP intermediate size (0: `4 x d_model`)",
    "model.mlp_gated": "gated (SwiGLU) MLP: three matrices instead of two",
    "model.moe_experts": "experts per MoE layer",
    "model.moe_top_k": "experts each token is routed to",
    "model.moe_intermediate": "an expert's intermediate size (0: `mlp_intermediate`)",
    "model.ssm_kind": "`mamba1` (selective scan), `mamba2` (SSD chunked scan), `gdn` (gated "
    "delta net), `kda` (Kimi delta attention) or `short_conv`",
    "model.ssm_state_dim": "SSM state dimension N",
    "model.ssm_expand": "SSM inner expansion (`d_inner = ssm_expand x d_model`)",
    "model.ssm_conv_kernel": "causal convolution width (the conv state is counted at full width)",
    "model.ssm_n_groups": "Mamba2 B/C groups",
    "model.ssm_head_dim": "Mamba2 head dimension",
    "model.ssm_n_heads": "Mamba2 heads (0: `d_inner // ssm_head_dim`)",
    "model.ssm_dt_rank": "Mamba1 `dt_rank` (0: `ceil(d_model / 16)`)",
    "model.dtype_bytes": "bytes per weight and activation element (and KV, by default)",
    "model.ssm_state_dtype_bytes": "bytes per SSM recurrent-state element (2: BF16/FP16; 4: "
    "engines that keep the state in FP32)",
    "model.vocab_size": "vocabulary size, for the LM head's cost (0: the LM head is not modelled)",
    "model.tie_embeddings": "input embedding and LM head share one matrix (weight bytes)",
    "model.v_head_dim": "attention value head dimension (0: `head_dim`)",
    "model.attn_kind": "`gqa` (MHA/GQA: K and V per KV head) or `mla` (latent attention: one "
    "compressed latent per token)",
    "model.attn_gate": "attention output gate (Qwen3-Next/3.5): q_proj twice as wide",
    "model.mla_q_rank": "MLA query compression rank (`q_lora_rank`; 0: none)",
    "model.mla_kv_rank": "MLA latent width (`kv_lora_rank`), cached per token",
    "model.mla_rope_dim": "MLA rotary key width (`qk_rope_head_dim`), cached per token",
    "model.n_swa_layers": "of the attention layers, the sliding-window ones",
    "model.swa_window": "tokens a sliding-window layer attends",
    "model.moe_shared_intermediate": "shared experts' total intermediate size (0: none)",
    "model.moe_latent": "width the routed experts run at (latent MoE; 0: `d_model`)",
    "model.ssm_conv_state_width": "conv-state columns kept (0: the kernel; vLLM keeps kernel - 1)",
    "model.state_dtypes": "which dtype each state is kept in, and why (set by `model=hf`)",
    "model.config_ssm_dtype": "the recurrent state dtype the config.json names (set by "
    "`model=hf`; empty: none, and `+policy=vllm` / `sglang` apply their engine's default)",
    "model.source": "the config.json a `model=hf` model was read from",
    "model.id": "`model=hf`: the Hugging Face id `<org>/<name>`",
    "model.config": "`model=hf`: a config.json (or a folder holding one) to read instead",
    "model.defaults": "the option a preset extends (`hf`: read from its config.json)",
    # trace
    "trace.kind": "which Azure service's trace: `conv` (conversation) or `code` (code completion)",
    "trace.path": "read this file (or folder) in the loader's format instead of the default under "
    "`data_dir`",
    "trace.file": "the default file, relative to `data_dir`",
    "trace.data_dir": "where real traces are read from (the top-level `data_dir`)",
    "trace.limit": "the first this many sessions (conversations, instances, requests) in file "
    "order; null: all",
    "trace.seed": "seed of the synthetic ids, lengths and order (the run seed)",
    "trace.vocab": "synthetic token ids are drawn from `[0, vocab)`",
    "trace.lenient": "skip malformed records (counted in the log) instead of failing with the "
    "file and line",
    "trace.min_messages": "keep conversations with at least this many messages",
    "trace.max_tokens": "a session stops before the request whose input + output exceed this "
    "many tokens; null: no cap",
    "trace.instances": "a list of instance ids to load (overrides `limit`)",
    "trace.truncate_history": "SWE-agent's history truncation: round 0 and the last `keep_last` "
    "observations verbatim, older ones replaced by a one-line placeholder",
    "trace.keep_last": "observations kept verbatim with `truncate_history`",
    "trace.max_turns": "a session stops after this many LLM calls; null: no cap",
    "trace.min_turns": "keep conversations with at least this many turns",
    "trace.max_non_ascii": "exclude conversations whose share of non-ASCII characters is above "
    "this",
    "trace.block_size": "tokens per hash id (one tree node per id; hits are reported in tokens)",
    "trace.n_groups": "groups of requests sharing a prefix",
    "trace.n_subgroups": "sub-groups per group, each with a second-level prefix (1: none)",
    "trace.sharing_degree": "requests per (sub-)group",
    "trace.prefix_len": "tokens of the group's shared prefix",
    "trace.sub_prefix_len": "tokens of the sub-group's prefix (0: none)",
    "trace.distinct_len": "tokens of each request's own part",
    "trace.output_len": "output tokens per request",
    "trace.output_dist": "`fixed` (`output_len`) or `pareto` (heavy-tailed outputs)",
    "trace.pareto_shape": "`output_dist=pareto`: the Pareto shape",
    "trace.output_min": "`output_dist=pareto`: shortest output",
    "trace.output_max": "`output_dist=pareto`: longest output",
    "trace.perturb": "`poisson`: lengths drawn around the base values; `none`: exact",
    "trace.shuffle": "shuffle the requests",
    "trace.dataset": "`narrativeqa_5s`, `squad2`, `race` or `longhealth` (lengths and counts of "
    "the common-context QA paper's Table 1)",
    "trace.n_contexts": "contexts to generate; null: the dataset's count",
    "trace.n_sessions": "chat sessions",
    "trace.turns_min": "fewest turns per session",
    "trace.turns_max": "most turns per session",
    "trace.system_prompts": "size of the shared pool of system prompts",
    "trace.system_len": "tokens per system prompt",
    "trace.user_len": "mean tokens per user message (`lengths=poisson`)",
    "trace.reply_len": "mean tokens per reply (`lengths=poisson`)",
    "trace.lengths": "`poisson` (around `user_len` / `reply_len`), `azure_conv` or `azure_code` "
    "(resampled Azure input/output pairs)",
    # policy
    "policy.compat": "null: simlab's semantics; `reference` / `reference_fixed`: the Marconi "
    "reference code's, with or without its bugs",
    "policy.alpha": "FLOP-efficiency weight of the eviction score",
    "policy.tuning.enabled": "tune alpha with the grid search (the `tuning` group)",
    "policy.block_size": "tokens per block",
    "policy.mamba": "hybrids: SGLang's Mamba strategy, `no_buffer` or `extra_buffer`",
    "policy.mamba_cache_mode": "hybrids: vLLM's `mamba_cache_mode`, `align` or `none`",
    "policy.mamba_ssm_cache_dtype": "hybrids: vLLM's `--mamba-ssm-cache-dtype`; `auto`: vLLM "
    "0.33.0's default for the model (float32 for Nemotron-H, else the model's dtype)",
    "policy.mamba_ssm_dtype": "hybrids: SGLang's SSM state dtype; `auto`: SGLang 0.5.23's "
    "default, float32",
    "policy.mamba_full_memory_ratio": "hybrids without `cache.ssm_gb`: SGLang's "
    "`--mamba-full-memory-ratio`, the Mamba pool's share of `cache.size_gb`; null: SGLang "
    "0.5.23's default, 0.9 (docs: engine geometry)",
    "policy.eviction.alpha": "the eviction's alpha (the policy's `alpha`)",
    "policy.eviction.page_size": "the clairvoyant eviction's KV page (the admission's page size)",
    "policy.admission.block_size": "the admission's block size (the policy's `block_size`)",
    "policy.admission.mamba": "the admission's Mamba strategy (the policy's `mamba`)",
    "policy.admission.mamba_cache_mode": "the admission's Mamba mode (the policy's "
    "`mamba_cache_mode`)",
    "policy.admission.mamba_ssm_cache_dtype": "the admission's SSM dtype (the policy's "
    "`mamba_ssm_cache_dtype`)",
    "policy.admission.mamba_ssm_dtype": "the admission's SSM dtype (the policy's "
    "`mamba_ssm_dtype`)",
    "policy.admission.prefix_cache_retention_interval": "the admission's retention interval "
    "(the policy's `prefix_cache_retention_interval`)",
    "policy.admission.prefix_match_unit": "the admission's prefix match unit (the policy's "
    "`prefix_match_unit`)",
    "policy.admission.enable_mamba_shared_prefix_checkpoint": "the admission's shared-prefix "
    "checkpoint switch (the policy's `enable_mamba_shared_prefix_checkpoint`)",
    "policy.admission.compute_capability": "the GPU's CUDA compute capability "
    "(`hardware.compute_capability`): vLLM prefills GDN layers with FlashInfer on Hopper, "
    "whose 64-token alignment can raise the block",
    "policy.admission.mamba_full_memory_ratio": "the admission's Mamba pool ratio (the "
    "policy's `mamba_full_memory_ratio`)",
    # admission
    "admission.block_size": "tokens per block (one node per whole block)",
    "admission.interval": "a checkpoint every this many tokens",
    "admission.branch_points": "also checkpoint at branch points (as judicious admission does)",
    "admission.last_token": "also checkpoint the state after the last decoded token",
    "admission.alignment": "`exact`: a checkpoint off a scan-chunk boundary costs a second "
    "prefill pass; `round_down`: it moves to the previous chunk boundary",
    "admission.chunk_size": "the scan chunk the alignment rounds to, tokens",
    "admission.page_size": "KV page, tokens (Transformer hits round down to it)",
    "admission.checkpoint_grid": "`extra_buffer`: the grid its prefill extends track states on, "
    "tokens",
    "admission.mamba_track_interval": "`extra_buffer`: decode steps track a state every "
    "lcm(grid, this) tokens",
    "admission.version": "the vLLM version whose rules are modelled",
    "admission/vllm.max_num_batched_tokens": "vLLM's pool (hybrids; any model with the timed "
    "engine's `kv_pool=shared`): tokens one scheduler step prefills (longer prompts go in "
    "block-aligned chunks); null: the engine's `engine.token_budget` (on the replay engine, "
    "null there: `vllm serve`'s default on the run's GPU)",
    "admission/vllm.block_pool": "hybrids, replay and timed engines: vLLM's pool block by block; "
    "false: the prefix tree",
    "eviction.alpha": "FLOP-efficiency weight of the score",
    "eviction.memory": "`own`: a node's own bytes; `path`: a state plus the KV of the node's "
    "whole path (the reference code)",
    "eviction.recency": "Marconi: `shifted` 1 / (1 + age) or `inverse_age` 1 / age (the "
    "reference code); Marconi+: `linear` (age) or `inverse` (1 / (1 + age))",
    "eviction.ties": "`oldest` node first, or `dfs`: the first minimum in depth-first order (the "
    "reference code)",
    "eviction.mlp_bug": "the reference code's bug: the MLP term subtracts the parent's attention "
    "FLOPs",
    "eviction.miscounts_freed_bytes": "the reference code's bug: a deleted leaf counts the last "
    "candidate's KV",
    "eviction.page_size": "the admission's KV page, tokens (Transformer hits)",
    # tuning
    "tuning.enabled": "tune alpha (the policies that compose this group turn it on as they need)",
    # offline
    "offline.seed": "seed of the random order (the run seed)",
    "offline.threshold": "a group is kept while its common prefix exceeds this share of its "
    "shortest member",
}

# README section names that YAML comments still point at, and the guide that holds them now.
README_REFS = {
    "many capacities": "guides/many-capacities.md",
    "shared KV pool": "guides/shared-kv-pool.md",
}

# Types of YAML-only keys whose default (null) says nothing about the type.
TYPES: dict[str, str] = {
    "data_dir": "path or null",
    "output_dir": "path or null",
    "engine.token_budget": "int or null",
    "engine.max_prefill_tokens": "int or null",
    "engine.typing_wpm": "float or null",
    "engine.calibration": "path or null",
    "engine.costs.allreduce_latency_s": "float or null",
    "hardware.calibration": "path or null",
    "tuning.grid": "list of float or null",
    "tuning.bootstrap_multiplier": "int or null",
    "tuning.objective": "str or null",
    "tuning.snapshot": "str or null",
    "tuning.score_last": "int or null",
    "tuning.retune_every": "int or null",
    "tuning.first_window": "int or null",
    "tuning.window": "int or null",
    "tuning.margin": "float or null",
    "tuning.min_tunings": "int",
    "policy.compat": "str or null",
    "trace.path": "path or null",
    "trace.limit": "int or null",
    "trace.max_tokens": "int or null",
    "trace.max_turns": "int or null",
    "trace.instances": "list of str or null",
    "trace.n_contexts": "int or null",
    "engine.running_memory_gb": "float",
    "predict.measured.path": "path or null",
    "predict.measured.prefix": "str or null",
    "predict.measured.tp": "str or null",
}


# --------------------------------------------------------------------------------------------
# YAML comments


def yaml_comments(path: Path) -> tuple[list[str], dict[tuple[str, ...], str]]:
    """The file's header comment and each key's comment (the block right above it, its inline
    comment and the inline comment's continuation lines), by key path."""
    header: list[str] = []
    comments: dict[tuple[str, ...], list[str]] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    seen_key = False
    last: tuple[str, ...] | None = None
    inline_col = -1  # column of the last key's inline comment (-1: none; continuations end)
    for line in path.read_text().splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if not stripped:
            pending, inline_col = [], -1
            continue
        if stripped.startswith("#"):
            text = stripped.lstrip("#").strip()
            if text.startswith("@package"):
                continue
            if not seen_key:
                header.append(text)
            elif last is not None and inline_col >= 0 and indent >= inline_col - 4:
                comments[last].append(text)
            else:
                pending.append(text)
                inline_col = -1
            continue
        match = re.match(r"([\w@/.+-]+):(.*)$", stripped)
        if stripped.startswith("-") or match is None:
            pending, inline_col = [], -1
            continue
        seen_key = True
        key, rest = match.group(1), match.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path_ = (*(k for _, k in stack), key)
        value, _, inline = _split_comment(rest)
        comments[path_] = [*pending, *([inline] if inline else [])]
        pending = []
        inline_col = line.index("#", len(line) - len(rest)) if inline else -1
        if not value.strip():
            stack.append((indent, key))
        last = path_
    return header, {k: _join(v) for k, v in comments.items() if v}


def _split_comment(rest: str) -> tuple[str, str, str]:
    """``value  # comment`` -> (value, '#', comment); a ``#`` inside quotes is kept."""
    quote = None
    for i, ch in enumerate(rest):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or rest[i - 1].isspace()):
            return rest[:i], "#", rest[i + 1 :].strip()
    return rest, "", ""


def _join(parts: list[str]) -> str:
    text = " ".join(p for p in parts if p)
    text = re.sub(r"\s+", " ", text).strip()
    for name, page in README_REFS.items():
        text = text.replace(f"README: {name}", f"[{name}](../{page})")
    return text


# --------------------------------------------------------------------------------------------
# simlab/config.py comments


def code_comments(path: Path) -> dict[str, dict[str, dict[str, str]]]:
    """Per dataclass of ``path``: its fields' ``#:`` comments ('doc'), inline comments
    ('inline') and docstring entries (```name``: text``, 'docstring')."""
    source = path.read_text()
    lines = source.splitlines()
    out: dict[str, dict[str, dict[str, str]]] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        doc: dict[str, str] = {}
        inline: dict[str, str] = {}
        names = []
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            name = item.target.id
            names.append(name)
            above = []
            i = item.lineno - 2
            while i >= 0 and lines[i].strip().startswith("#:"):
                above.insert(0, lines[i].strip()[2:].strip())
                i -= 1
            if above:
                doc[name] = " ".join(above)
            _, hash_, comment = _split_comment(lines[item.lineno - 1].split(":", 1)[1])
            if hash_ and not comment.startswith("type:"):
                inline[name] = comment
        out[node.name] = {
            "doc": doc,
            "inline": inline,
            "docstring": _docstring_entries(ast.get_docstring(node) or "", names),
        }
    return out


def _docstring_entries(docstring: str, names: list[str]) -> dict[str, str]:
    """``name``: text entries of a docstring, for the given field names."""
    text = " ".join(docstring.split())
    alternatives = "|".join(re.escape(n) for n in names)
    if not alternatives:
        return {}
    pattern = re.compile(rf"``({alternatives})``(?: / ``({alternatives})``)*:")
    hits = list(pattern.finditer(text))
    entries: dict[str, str] = {}
    for k, hit in enumerate(hits):
        end = hits[k + 1].start() if k + 1 < len(hits) else len(text)
        body = text[hit.end() : end].strip()
        for name in re.findall(r"``(\w+)``", hit.group(0)):
            if name in names:
                entries[name] = _rst_to_md(body)
    return entries


def _rst_to_md(text: str) -> str:
    """The docstrings' reST roles and literals as Markdown code spans."""
    text = re.sub(r":(?:mod|class|func|data|meth|attr):`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


# --------------------------------------------------------------------------------------------
# formatting


def fmt_value(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "(required)"
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float) and math.isinf(value):
        text = "inf"
    elif isinstance(value, list):
        text = "[" + ", ".join(fmt_value(v).strip("`") for v in value) + "]"
    elif isinstance(value, dict):
        text = "{...}"
    else:
        text = str(value)
    return f"`{text}`"


def yaml_type(value: Any) -> str:
    """The YAML value's type, as the table shows it."""
    if isinstance(value, str) and value.startswith("${"):
        return "interpolation"
    names = {type(None): "null", bool: "bool", int: "int", float: "float", list: "list"}
    return names.get(type(value), "str")


def cell(text: str) -> str:
    """Text for a Markdown table cell: one line, pipes escaped outside code spans (inside them
    Python-Markdown's tables do not split, and an escape would show)."""
    parts = re.split(r"(`[^`]*`)", " ".join(str(text).split()))
    return "".join(p if p.startswith("`") else p.replace("|", "\\|") for p in parts)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return [*out, ""]


class Missing:
    """Keys no source gives a meaning for."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def meaning(self, *candidates: str | None, key: str) -> str:
        for text in candidates:
            if text:
                return text
        self.keys.append(key)
        return ""


def lookup(group: str, key: str, option: str | None = None) -> str | None:
    """A :data:`MEANINGS` entry: ``group/option.key``, ``group.key`` or the bare key."""
    for name in (f"{group}/{option}.{key}" if option else None, f"{group}.{key}", key):
        if name and name in MEANINGS:
            return MEANINGS[name]
    return None


# --------------------------------------------------------------------------------------------
# sections


def load_yaml(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def flatten(mapping: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[tuple, Any]]:
    out: list[tuple[tuple, Any]] = []
    for key, value in mapping.items():
        if key == "defaults":
            continue
        if isinstance(value, dict) and value:
            out += flatten(value, (*prefix, key))
        else:
            out.append(((*prefix, key), value))
    return out


def typed_section(
    missing: Missing,
    settings: type,
    section: str,
    yaml_defaults: dict[str, Any],
    yaml_notes: dict[tuple[str, ...], str],
    code: dict[str, dict[str, dict[str, str]]],
) -> list[str]:
    """One table per dataclass: its fields, their types, YAML defaults and meanings."""
    notes = code.get(settings.__name__, {"doc": {}, "inline": {}, "docstring": {}})
    rows = []
    for field in dataclasses.fields(settings):
        if not field.init:
            continue
        key = f"{section}.{field.name}" if section != "run" else field.name
        default: Any = field.default
        if default is dataclasses.MISSING and field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        shown = (
            fmt_value(yaml_defaults[field.name])
            if field.name in yaml_defaults
            else (fmt_value(default) if not dataclasses.is_dataclass(default) else "(section)")
        )
        if (
            field.name in yaml_defaults
            and default is not dataclasses.MISSING
            and not (dataclasses.is_dataclass(default))
            and yaml_defaults[field.name] != default
        ):
            shown += f" (dataclass: {fmt_value(default)})"
        meaning = missing.meaning(
            notes["doc"].get(field.name),
            yaml_notes.get((section, field.name)) if section != "run" else None,
            notes["docstring"].get(field.name),
            notes["inline"].get(field.name),
            lookup(section, field.name),
            key=key,
        )
        rows.append([f"`{key}`", f"`{field.type}`", shown, _rst_to_md(meaning)])
    return table(["key", "type", "default", "meaning"], rows)


def yaml_section(
    missing: Missing,
    group: str,
    path: Path,
    option: str | None = None,
    skip: tuple[str, ...] = (),
    prefix: str | None = None,
) -> list[str]:
    """One table of a YAML file's keys: type, default, meaning."""
    data = load_yaml(path)
    _, notes = yaml_comments(path)
    rows = []
    for key_path, value in flatten(data):
        if key_path[0] in skip:
            continue
        dotted = ".".join(key_path)
        base = group if prefix is None else prefix
        full = f"{base}.{dotted}" if base else dotted
        kind = TYPES.get(f"{group}.{dotted}") or yaml_type(value)
        specific = MEANINGS.get(f"{group}/{option}.{dotted}") if option else None
        meaning = missing.meaning(
            specific,
            notes.get(key_path),
            lookup(group, dotted, option),
            key=f"{path.relative_to(ROOT)}: {dotted}",
        )
        rows.append([f"`{full}`", kind, fmt_value(value), meaning])
    return table(["key", "type", "default", "meaning"], rows)


def header_text(path: Path) -> str:
    """The file's header comment up to its first command line."""
    header, _ = yaml_comments(path)
    prose = []
    for line in header:
        if line.startswith("python -m"):
            break
        prose.append(line)
    return _join(prose)


def raw_header(path: Path) -> list[str]:
    """The file's leading comment lines as written (inner spacing kept)."""
    out = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line[2:] if line.startswith("# ") else line[1:]
        if not text.startswith("@package"):
            out.append(text.rstrip())
    return out


def header_commands(path: Path) -> list[str]:
    """The command lines of a file's header comment (continuations joined)."""
    header, _ = yaml_comments(path)
    commands: list[str] = []
    for line in header:
        if line.startswith("python -m"):
            commands.append(line)
        elif commands and commands[-1].endswith("\\"):
            commands[-1] = commands[-1][:-1].rstrip() + " " + line
    return commands


def defaults_list(path: Path) -> list[str]:
    data = load_yaml(path)
    out = []
    for entry in data.get("defaults", []):
        if isinstance(entry, dict):
            ((group, option),) = entry.items()
            out.append(f"{group}: {option}")
        elif entry != "_self_":
            out.append(str(entry))
    return out


def presets_table(missing: Missing, group: str, spec: type | None) -> list[str]:
    """Every preset of a group side by side: one row per key (in the order of the dataclass
    that reads it, with its type and default), one column per preset."""
    files = sorted((CONFIGS / group).glob("*.yaml"))
    data = {f.stem: load_yaml(f) for f in files}
    specs = {f.name: f for f in dataclasses.fields(spec) if f.init} if spec else {}
    keys = [k for k in specs if any(k in d for d in data.values())]
    keys += sorted({k for d in data.values() for k in d} - set(keys))
    rows = []
    for key in keys:
        meaning = missing.meaning(lookup(group, key), key=f"{group}.{key}")
        field = specs.get(key)
        kind = f"`{field.type}`" if field else TYPES.get(f"{group}.{key}", "str")
        default = "-" if field is None else fmt_value(field.default)
        values = [fmt_value(d[key]) if key in d else "-" for d in data.values()]
        rows.append([f"`{key}`", kind, default, meaning, *values])
    return table(["key", "type", "default", "meaning", *(f"`{name}`" for name in data)], rows)


def import_first(*names: str) -> Any:
    """The first of ``module:attribute`` names that imports (module paths move)."""
    for name in names:
        module, attribute = name.split(":")
        try:
            return getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError):
            continue
    return None


def options_list(group: str, default: str | None = None, flag: str = "") -> list[str]:
    out = []
    for path in sorted((CONFIGS / group).glob("*.yaml")):
        mark = " (default)" if path.stem == default else ""
        text = header_text(path) or "-"
        commands = "; ".join(f"`{c}`" for c in header_commands(path))
        text += f" Run: {commands}" if commands else ""
        out.append(f"- `{flag}{group}={path.stem}`{mark}: {text}")
    return [*out, ""]


INTRO = [
    "# Configuration reference",
    "",
    "<!-- Generated by docs/gen_config_reference.py (run by docs/hooks.py at every mkdocs "
    "build). Do not edit by hand: edit the comments in simlab/config.py and configs/. -->",
    "",
    "Every key of a run's configuration, with its type, default and meaning. The typed "
    "sections come from the dataclasses of `simlab.config` (what the engine reads, validated "
    "before any work); the config groups from the YAML files under `configs/`. Override any "
    "key on the command line (`python -m simlab cache.size_gb=5 engine.tp=2`); pick a group "
    "option with `group=NAME` (`trace=swebench`), a policy with `+policy=NAME`. The guides "
    "explain what the settings do together: start at the [command line](../guides/"
    "command-line.md).",
    "",
]


def top_section(missing: Missing) -> list[str]:
    """The defaults list and the top-level keys of ``configs/config.yaml``."""
    top = load_yaml(CONFIGS / "config.yaml")
    _, notes = yaml_comments(CONFIGS / "config.yaml")
    out = [
        "## Top level (`configs/config.yaml`)",
        "",
        "The defaults list picks one option per config group:",
        "",
    ]
    rows = []
    for entry in defaults_list(CONFIGS / "config.yaml"):
        group, option = entry.split(": ")
        target = group.split("@")[1] if "@" in group else group
        name = "compare" if target.startswith("compare.") else target
        rows.append([f"`{group}`", f"`{option}`", MEANINGS.get(f"defaults.{name}", "")])
    out += table(["group", "option", "role"], rows)
    rows = []
    for key in ("seed", "data_dir", "output_dir", "overwrite", "reuse_breakdown", "report"):
        meaning = missing.meaning(notes.get((key,)), lookup("top", key), key=key)
        kind = TYPES.get(key) or yaml_type(top[key])
        rows.append([f"`{key}`", kind, fmt_value(top[key]), meaning])
    bounds = top["bounds"]["enabled"]
    rows.append(["`bounds.enabled`", "bool", fmt_value(bounds), notes[("bounds", "enabled")]])
    return out + table(["key", "type", "default", "meaning"], rows)


def typed_sections(missing: Missing, settings: Any) -> list[str]:
    """The dataclasses of :mod:`simlab.config`, one table each."""
    code = code_comments(Path(settings.__file__))
    top = load_yaml(CONFIGS / "config.yaml")
    _, notes = yaml_comments(CONFIGS / "config.yaml")
    sections = [
        ("cache", settings.CacheSettings, "The prefix cache's capacity and layout."),
        ("arrivals", settings.ArrivalSettings, "When requests arrive (timed engines)."),
        ("metrics", settings.MetricSettings, "What counts as a request hit."),
        (
            "cluster",
            settings.ClusterSettings,
            "Replicas behind a router, optionally disaggregated ([replicas and routing]"
            "(../guides/replicas-and-routing.md)).",
        ),
    ]
    out: list[str] = []
    for section, cls, intro in sections:
        out += [f"## `{section}` (`simlab.config.{cls.__name__}`)", "", intro, ""]
        out += typed_section(missing, cls, section, top.get(section) or {}, notes, code)
    out += [
        "## The validated run (`simlab.config.RunSettings`)",
        "",
        "What `simlab.config.run_settings` returns from the composed config; an unknown key in a "
        "typed section is an error naming it. `simlab.run.plan.plan_run` holds it in the run's "
        "plan (`RunPlan`) with the selected policies, the bound, the engine, the trace and the "
        "output directory, every check done.",
        "",
    ]
    return out + typed_section(missing, settings.RunSettings, "run", {}, {}, code)


def engine_section(missing: Missing) -> list[str]:
    """``configs/engine/`` and the offline schedulers."""
    out = [
        "## `engine` (`configs/engine/`)",
        "",
        *options_list("engine", "timed"),
        "### `engine=timed` (the default)",
        "",
    ]
    out += yaml_section(missing, "engine", CONFIGS / "engine" / "timed.yaml", "timed")
    out += ["### `engine=offline`", "", "Every `engine=timed` key, plus or overriding:", ""]
    out += yaml_section(missing, "engine", CONFIGS / "engine" / "offline.yaml", "offline")
    out += [
        "The offline engine's scheduler (`configs/offline/`): "
        + ", ".join(
            f"`{s}`"
            for s in defaults_list(CONFIGS / "engine" / "offline.yaml")
            if s.startswith("/offline")
        ),
        "",
        *options_list("offline", "batchllm"),
    ]
    for path in sorted((CONFIGS / "offline").glob("*.yaml")):
        out += [f"#### `offline@engine.scheduler={path.stem}`", ""]
        out += yaml_section(missing, "offline", path, path.stem, prefix="engine.scheduler")
    out += ["### `engine=replay`", ""]
    out += yaml_section(missing, "engine", CONFIGS / "engine" / "replay.yaml", "replay")

    return out


def preset_sections(missing: Missing) -> list[str]:
    """``configs/hardware/`` and ``configs/model/``, every preset side by side."""
    out = [
        "## `hardware` (`configs/hardware/`)",
        "",
        *options_list("hardware", "a100_40gb"),
        "Every preset:",
        "",
        *presets_table(
            missing,
            "hardware",
            import_first("simlab.cost.hardware:Hardware", "simlab.costmodel:Hardware"),
        ),
    ]
    out += [
        "## `model` (`configs/model/`)",
        "",
        *options_list("model", "marconi_7b"),
        "Every preset (`-`: not set, the spec's default):",
        "",
        *presets_table(
            missing, "model", import_first("simlab.model.spec:ModelSpec", "simlab.model:ModelSpec")
        ),
    ]
    return out


def trace_section(missing: Missing) -> list[str]:
    """``configs/trace/``: one table per option."""
    out = ["## `trace` (`configs/trace/`)", "", *options_list("trace", "sharegpt")]
    for path in sorted((CONFIGS / "trace").glob("*.yaml")):
        out += [f"### `trace={path.stem}`", ""]
        parents = [s for s in defaults_list(path) if s != "_self_"]
        if parents:
            out += [f"Extends `trace={parents[0]}`; sets:", ""]
        out += yaml_section(missing, "trace", path, path.stem)

    return out


def policy_sections(missing: Missing) -> list[str]:
    """``configs/policy/``, ``admission/``, ``eviction/`` and ``tuning/``."""
    out = [
        "## `policy` (`configs/policy/`)",
        "",
        "A policy composes an admission and an eviction plug-in (and, for the tuned policies, "
        "the `tuning` group); its keys live under `policy.` (`policy.admission.*`, "
        "`policy.eviction.*`, `policy.tuning.*`).",
        "",
        *options_list("policy", flag="+"),
    ]
    for path in sorted((CONFIGS / "policy").glob("*.yaml")):
        parts = ", ".join(f"`{s.lstrip('/')}`" for s in defaults_list(path))
        out += [f"### `+policy={path.stem}`", "", f"Composes {parts}.", ""]
        out += yaml_section(missing, "policy", path, path.stem)
    for group, intro in (
        ("admission", "What a policy caches: which checkpoints of a sequence it admits."),
        ("eviction", "What a policy evicts first when the cache is full."),
    ):
        out += [
            f"## `{group}` (`configs/{group}/`)",
            "",
            intro,
            "",
            f"Pick one inside a policy with `{group}@policy.{group}=NAME`.",
            "",
            *options_list(group),
        ]
        for path in sorted((CONFIGS / group).glob("*.yaml")):
            out += [f"### `{group}={path.stem}`", ""]
            out += yaml_section(missing, group, path, path.stem, prefix=f"policy.{group}")
    out += [
        "## `tuning` (`configs/tuning/alpha.yaml`)",
        "",
        "Marconi's alpha tuning ([alpha tuning](../guides/alpha-tuning.md)), under "
        "`policy.tuning.*`. The file's own notes:",
        "",
        "```text",
        *raw_header(CONFIGS / "tuning" / "alpha.yaml"),
        "```",
        "",
    ]
    out += yaml_section(
        missing, "tuning", CONFIGS / "tuning" / "alpha.yaml", prefix="policy.tuning"
    )
    return out


def tail_sections(missing: Missing) -> list[str]:
    """Sweeps, experiments and ``python -m simlab.predict``."""
    out = [
        "## Sweeps and experiments",
        "",
        "Run with `python -m simlab -m +sweep=NAME` or `+experiment=NAME` ([sweeps]"
        "(../guides/sweeps.md)).",
        "",
        *options_list("sweep", flag="+"),
        *options_list("experiment", flag="+"),
        "## `python -m simlab.predict` (`configs/predict.yaml`)",
        "",
        "Its own defaults list: "
        + ", ".join(f"`{s}`" for s in defaults_list(CONFIGS / "predict.yaml"))
        + " ([predicting a prefill](../guides/predicting-a-prefill.md)).",
        "",
    ]
    out += yaml_section(missing, "predict", CONFIGS / "predict.yaml", skip=("hydra",), prefix="")
    return out


def generate() -> tuple[str, list[str]]:
    """The page's text and the keys no source gives a meaning for."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # this checkout's simlab, not an installed one
    settings = importlib.import_module("simlab.config")
    missing = Missing()
    out = [*INTRO, *top_section(missing), *typed_sections(missing, settings)]
    for section in (engine_section, preset_sections, trace_section, policy_sections, tail_sections):
        out += section(missing)
    return "\n".join(out).rstrip() + "\n", missing.keys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args(argv)
    text, missing = generate()
    for key in missing:
        sys.stderr.write(f"warning: no meaning for {key}\n")
    if args.check:
        stale = not OUT.exists() or OUT.read_text() != text
        if stale:
            sys.stderr.write(f"{OUT.relative_to(ROOT)} is stale: run {Path(__file__).name}\n")
        return 1 if stale or missing else 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    if not OUT.exists() or OUT.read_text() != text:
        OUT.write_text(text)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
