"""The measured kernels of one GPU x engine backend x version x dtype (:class:`Kernels`): each
op family's table as a :class:`~simlab.cost.measured.interpolate.Grid`, queried per shape.

Tables and their axes (latency in ms per call, one layer):

* GEMM (``gemm_perf``): ``n, k`` and the rows ``m``;
* context attention (``context_attention_perf``, causal, no cached prefix): per head
  dimension and sliding window (0: none), query heads, KV heads, batch and the sequence length
  ``isl``;
* generation attention (``generation_attention_perf``): per head dimension and window, query
  heads, KV heads, batch and the context (``isl + step``);
* MLA attention (``context_mla_perf``, ``generation_mla_perf``: the attention kernel alone,
  without its projections): query heads per GPU, batch and the sequence length or context;
* fused MoE (``moe_perf``): per (hidden, intermediate, top-k, experts, TP, EP), the tokens;
* all-reduce (``custom_allreduce_perf``, the CUDA-graph kernel): per GPU count, the message's
  elements;
* the delta-rule recurrent layers (``gdn_perf``: GDN; ``kda_perf``: KDA), per kernel (the causal
  conv1d, the chunked prefill scan, the recurrent decode step), key heads and value heads (per
  GPU, 128 wide), batch and sequence length (prefill) or batch (decode, length 1).

Attention runs with BF16 compute on the KV cache's dtype (BF16 or FP8 rows); MoE with the
``power_law_1.01``
routing distribution where the table has it (skewed, as real routers are), else ``balanced``.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from simlab.cost.measured import (
    delta_lend,
    head_width,
    moe_gating,
    moe_kernel,
    noise,
    reference,
    tables,
    transfer,
)
from simlab.cost.measured.interpolate import Curve, Grid
from simlab.cost.measured.moe_kernel import MOE_COLUMNS
from simlab.cost.measured.reference import Roofline
from simlab.cost.measured.sources import INTERPOLATED

log = logging.getLogger(__name__)

#: preferred attention kernels by name (the engines' defaults: FlashAttention 3 on Hopper, 2 on
#: Ampere / Ada / consumer Blackwell), before the kernel with most rows
ATTENTION_KERNELS = ("fa3", "flash_attn_fa2", "vllm_flash_attn", "fa2", "flash", "fmha")
#: the KV cache's dtype -> the attention tables' ``kv_cache_dtype`` rows
KV_ROWS = {"bf16": "bfloat16", "fp8": "fp8"}
#: the tables and their op family folder
TABLES = {
    "gemm": ("gemm", "gemm_perf"),
    "context": ("attention", "context_attention_perf"),
    "generation": ("attention", "generation_attention_perf"),
    "mla_context": ("mla", "context_mla_perf"),
    "mla_generation": ("mla", "generation_mla_perf"),
    "moe": ("moe", "moe_perf"),
    "allreduce": ("comm", "custom_allreduce_perf"),
    "gdn": ("linear_attention", "gdn_perf"),
    "kda": ("kda", "kda_perf"),
    "mamba2_scan": ("ssm", "mamba2_scan_perf"),
    "mamba2_step": ("ssm", "mamba2_step_perf"),
}
Timed = tuple[float, str] | None  # (ms, source) or no measurement

#: the MoE rows an FP8 model's experts take where a table has no per-tensor FP8 rows of its shape
#: (SGLang's tables measure its FP8 fused MoE with block-scaled weights only, and every table
#: measures DeepSeek-V3/R1's that way: the FP8 checkpoints they serve; the same work, scales read
#: per 128 x 128 block)
FP8_MOE_FALLBACK = "fp8_block"
#: the lines :meth:`Kernels.warn_once` logged
_WARNED: set[str] = set()


@dataclass(frozen=True, eq=False)  # hashed by identity: the lru caches below key on it
class Kernels:
    """Measured kernels of ``system`` (an aiconfigurator GPU name) for ``backend`` at
    ``version`` and ``dtype`` (a key of :data:`~simlab.cost.measured.tables.DTYPES`)."""

    system: str
    backend: str
    version: str
    dtype: str = "bf16"
    local: Path | None = None  # tables gpu_validate wrote (``engine.kernel_tables``)
    kv_dtype: str = "bf16"  # the KV cache's: the attention rows (:data:`KV_ROWS`)
    moe_kernel: str | None = None  # the fused MoE's kernel (:mod:`.moe_kernel`; None: the table's)
    #: GEMM spikes taken at their fit (:func:`.noise.despike_gemm`); the held-out check reads
    #: the tables as measured
    despike: bool = True
    _grids: dict[Any, Grid | None] = field(default_factory=dict, init=False, repr=False)
    #: another engine's delta-rule grid and its name, per kernel these tables lack (found once:
    #: :func:`.delta_lend.elsewhere` reads the tables' directories)
    _lenders: dict[Any, Any] = field(default_factory=dict, init=False, repr=False)
    #: the MoE shapes the table lacks, timed so far: each with the version whose table has it,
    #: else the measured shape that timed it (:meth:`lent`)
    moe_versions: dict[tuple[int, ...], str] = field(default_factory=dict, init=False, repr=False)
    transfers: dict[tuple[int, ...], tuple[int, ...]] = field(
        default_factory=dict, init=False, repr=False
    )
    #: the GEMM table's spikes taken at their fit: ``{"<dtype> <version>": rows}``; the MoE and
    #: attention rows over the same kernel's time at a larger shape, taken at it (:mod:`.noise`)
    gemm_spikes: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    spikes: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    #: the MoE shapes whose ``moe_kernel`` the table lacks: where that kernel's rows came from
    moe_kernels: dict[tuple[int, ...], str] = field(default_factory=dict, init=False, repr=False)
    #: the delta-rule kernels these tables lack: where each came from (:mod:`.delta_lend`)
    delta_lent: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    #: the prefill attention widths these tables lack: the width each was timed from
    #: (:mod:`.head_width`)
    head_widths: dict[int, int] = field(default_factory=dict, init=False, repr=False)
    #: a non-gated model's MoE shapes: how the table's rows were taken (:mod:`.moe_gating`)
    moe_gating: dict[tuple[int, ...], str] = field(default_factory=dict, init=False, repr=False)

    def path(self, kind: str, backend: str | None = None, version: str | None = None) -> Any:
        """The file of ``kind``'s table (of another ``backend`` / ``version`` if given)."""
        family, table = TABLES[kind]
        return tables.table_path(
            self.system, family, backend or self.backend, version or self.version, table, self.local
        )

    def used_versions(self) -> dict[str, str]:
        """The version each table comes from (the newest at or below :attr:`version`)."""
        out = {}
        for kind in TABLES:
            path = self.path(kind)
            if path is not None:
                out[kind] = path.parent.name
        return out

    # ------------------------------------------------------------------ grids
    def grid(self, key: tuple[Any, ...]) -> Grid | None:
        """The grid of one table (``(kind, *its key)``), built once (None: no table)."""
        if key not in self._grids:
            self._grids[key] = self._build(key)
        return self._grids[key]

    def _build(self, key: tuple[Any, ...]) -> Grid | None:
        if key[0] == "moe_at":  # another version's MoE table (:meth:`_moe_elsewhere`)
            return self._moe_grid(Path(key[1]), ("moe", *key[2:]))
        if key[0] == "delta_at":  # another engine's delta-rule table (:mod:`.delta_lend`)
            phase, part, d_model = key[2:]
            return delta_lend.grid(Path(key[1]), phase, part, d_model, lent=True)
        path = self.path(key[0])
        if path is None:
            return None
        builders = {
            "gemm": self._gemm_grid,
            "context": self._attention_grid,
            "generation": self._attention_grid,
            "mla_context": self._mla_grid,
            "mla_generation": self._mla_grid,
            "moe": self._moe_grid,
            "gdn": _delta_rule_grid,
            "kda": _delta_rule_grid,
            "mamba2_scan": _mamba2_grid,
            "mamba2_step": _mamba2_grid,
            "allreduce": _allreduce_grid,
        }
        return builders[key[0]](path, key)

    def _gemm_grid(self, path: Path, key: tuple[Any, ...]) -> Grid | None:
        dtype = tables.DTYPES[self.dtype]["gemm"]
        frame = tables.kernel_rows(tables.rows(path, (("gemm_dtype", dtype),)))
        if self.despike:
            frame, spikes = noise.despike_gemm(frame)
            if spikes:
                self.gemm_spikes[f"{dtype} {path.parent.name}"] = spikes
                self.warn_once(
                    f"{spikes} weight-bound rows of the {dtype} GEMM table "
                    f"({path.parent.name}) are over {noise.SPIKE:g}x their line's fit, "
                    "measurement spikes: taken at the fit (summary.json kernels.gemm_spikes)"
                )
        roofline = self._roofline(reference.gemm(self.dtype), self.dtype)
        return Grid.from_frame(frame, ["n", "k", "m"], 1.0, roofline)

    def _attention_grid(self, path: Path, key: tuple[Any, ...]) -> Grid | None:
        kind, head_dim, window = key
        filters = (
            ("attn_dtype", "bfloat16"),
            ("kv_cache_dtype", KV_ROWS[self.kv_dtype]),
            ("window_size", window),
            ("head_dim", head_dim),
        )
        frame = tables.kernel_rows(tables.rows(path, filters), ATTENTION_KERNELS)
        if frame.empty:
            return None
        frame = frame.assign(length=frame["isl"] + frame["step"])
        axes = ["num_heads", "num_key_value_heads", "batch_size", "length"]
        what = f"{kind} attention, head dim {head_dim}" + (f", window {window}" if window else "")
        frame = noise.despiked(self, frame, what, "length", tuple(axes[:3]))
        if kind == "generation":  # launch- and split-bound: no roofline to follow (see reference)
            return Grid.from_frame(frame, axes, 1.0)
        if window:  # linear past the window, not the causal reference's square
            return Grid.from_frame(frame, axes, 1.0)
        return Grid.from_frame(frame, axes, 2.0, self._roofline(reference.context(head_dim)))

    def _mla_grid(self, path: Path, key: tuple[Any, ...]) -> Grid | None:
        filters = (("mla_dtype", "bfloat16"), ("kv_cache_dtype", KV_ROWS[self.kv_dtype]))
        frame = tables.kernel_rows(tables.rows(path, filters))
        if frame.empty:
            return None
        frame = frame.assign(length=frame["isl"] + frame["step"])
        axes = ["num_heads", "batch_size", "length"]
        # a shape measured twice (the tables hold re-measurements): its first row, as
        # aiconfigurator reads it
        frame = noise.despiked(self, frame.drop_duplicates(axes), key[0], "length", tuple(axes[:2]))
        return Grid.from_frame(frame, axes, 2.0 if key[0] == "mla_context" else 1.0)

    def moe_dtypes(self) -> tuple[str, ...]:
        """The MoE rows' dtypes a shape is looked up in, in order: an FP8 model's per-tensor
        rows, then the block-scaled ones (:data:`FP8_MOE_FALLBACK`)."""
        dtype = tables.DTYPES[self.dtype]["moe"]
        return (dtype, FP8_MOE_FALLBACK) if dtype == "fp8" else (dtype,)

    def _moe_grid(self, path: Path, key: tuple[Any, ...]) -> Grid | None:
        frame, dtype = moe_kernel.shape_rows(path, self.moe_dtypes(), key[1:])
        if dtype == FP8_MOE_FALLBACK and not frame.empty:
            log.info(
                "%s %s %s: fused MoE %s has no per-tensor FP8 rows; its block-scaled FP8 (%s) "
                "rows time it",
                self.system,
                self.backend,
                path.parent.name,
                transfer.label(key[1:]),
                FP8_MOE_FALLBACK,
            )
        roofline = self._roofline(reference.moe(key[1:], self.dtype), self.dtype)
        rows = moe_kernel.chosen_rows(self, frame, key[1:])
        rows = noise.despiked(self, rows, f"fused MoE {transfer.label(key[1:])}", "num_tokens")
        return Grid.from_frame(rows, ["num_tokens"], 1.0, roofline)

    @functools.lru_cache(maxsize=1)  # noqa: B019
    def moe_shapes(self) -> tuple[transfer.Shape, ...]:
        """The fused-MoE shapes the table measured at this dtype (:data:`MOE_COLUMNS`)."""
        path = self.path("moe")
        if path is None:
            return ()
        shapes: set[transfer.Shape] = set()
        for dtype in self.moe_dtypes():
            frame = tables.rows(path, (("moe_dtype", dtype),))
            rows = frame[list(MOE_COLUMNS)].drop_duplicates().to_numpy()
            shapes |= {tuple(int(v) for v in row) for row in rows}
        return tuple(sorted(shapes))

    def _roofline(self, work: reference.Work, dtype: str = "bf16") -> Roofline | None:
        """The reference a table is interpolated against (None: no peaks for the GPU)."""
        return reference.roofline(tables.peaks(self.system), work, dtype)

    # ------------------------------------------------------------------ queries
    @functools.lru_cache(maxsize=65536)  # noqa: B019 (Kernels are few and live for the run)
    def gemm(self, m: int, n: int, k: int) -> Timed:
        """One ``m x k`` by ``k x n`` GEMM."""
        grid = self.grid(("gemm",))
        return None if grid is None else grid.at((n, k, m))

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def context(
        self, batch: int, length: float, heads: int, kv: int, head_dim: int, window: int = 0
    ) -> Timed:
        """Causal attention of ``batch`` sequences of ``length`` tokens (one layer), each
        query over at most ``window`` keys (0: all)."""
        grid = self.grid(("context", head_dim, window))
        if grid is None:  # a full-attention width the tables lack: from the nearest they hold
            return (
                head_width.context(self, batch, length, heads, kv, head_dim) if not window else None
            )
        return grid.at((heads, kv, batch, length))

    def generation(
        self, batch: int, heads: int, kv: int, head_dim: int, window: int = 0
    ) -> Curve | None:
        """Decode attention of ``batch`` requests against their context (the curve's axis)."""
        grid = self.grid(("generation", head_dim, window))
        return None if grid is None else grid.curve((heads, kv, batch))

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def mla_context(self, batch: int, length: float, heads: int) -> Timed:
        """MLA's causal prefill attention of ``batch`` sequences of ``length`` tokens at
        ``heads`` query heads (one layer)."""
        grid = self.grid(("mla_context",))
        return None if grid is None else grid.at((heads, batch, length))

    def mla_generation(self, batch: int, heads: int) -> Curve | None:
        """MLA's decode attention of ``batch`` requests against their context (the curve's
        axis) over the latent cache."""
        grid = self.grid(("mla_generation",))
        return None if grid is None else grid.curve((heads, batch))

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def moe(self, tokens: int, shape: tuple[int, ...], gated: bool = True) -> Timed:
        """The fused MoE of ``tokens`` tokens; ``shape``: (hidden, intermediate, top-k,
        experts, MoE TP, MoE EP); ``gated``: its experts' (three GEMMs, else two). A shape the
        table lacks is taken from the nearest other version's table that has it (older first:
        some versions' tables add a few models only), else timed from the nearest measured
        shape (:mod:`.transfer`); each is logged once and listed by :meth:`lent`."""
        grid = self.grid(("moe", *shape)) or self._moe_elsewhere(shape)
        if grid is not None:
            return moe_gating.as_run(self, tokens, shape, gated, grid.at((tokens,)))
        source = transfer.nearest(self.moe_shapes(), shape)
        timed = None if source is None else self.moe_from(tokens, shape, source, gated)
        if timed is not None and source is not None and shape not in self.transfers:
            self.transfers[shape] = source
            self.warn_once(
                f"fused MoE {transfer.label(shape)} not measured; timed from the measured "
                f"{transfer.label(source)} at equal tokens per expert (summary.json "
                "kernels.moe_shapes)"
            )
        return timed

    def _moe_elsewhere(self, shape: tuple[int, ...]) -> Grid | None:
        """``shape``'s MoE grid from the nearest other version's table that measured it."""
        chosen = self.path("moe")
        if chosen is None:
            return None
        key = tables.version_key(chosen.parent.name)
        have = tables.versions(self.system, self.backend, self.local)
        older = [v for v in reversed(have) if tables.version_key(v) < key]
        for version in older + [v for v in have if tables.version_key(v) > key]:
            path = tables.table_path(*self._moe_at(version))
            if path is None or path.parent.name != version:
                continue
            grid = self.grid(("moe_at", str(path), *shape))
            if grid is not None:
                if shape not in self.moe_versions:
                    self.moe_versions[shape] = version
                    self.warn_once(
                        f"fused MoE {transfer.label(shape)} not in the {chosen.parent.name} "
                        f"table; taken from {version}'s (summary.json kernels.moe_versions)"
                    )
                return grid
        return None

    def warn_once(self, what: str) -> None:
        """Log ``what`` of these kernels once per process (runs build kernels per point)."""
        line = f"{self.system} {self.backend} {self.version}: {what}"
        if line not in _WARNED:
            _WARNED.add(line)
            log.warning("%s", line)

    def _moe_at(self, version: str) -> tuple[Any, ...]:
        family, table = TABLES["moe"]
        return (self.system, family, self.backend, version, table, self.local)

    def lent(self) -> dict[str, dict[str, Any]]:
        """``moe_versions`` (a MoE shape the table lacks: the version whose table timed it),
        ``moe_shapes`` (one no version has: the measured shape that timed it) and
        ``gemm_spikes`` / ``spikes`` (the rows taken at their bound), where any."""
        out: dict[str, Any] = {}
        if self.gemm_spikes:
            out["gemm_spikes"] = dict(self.gemm_spikes)
        if self.spikes:
            out["spikes"] = dict(sorted(self.spikes.items()))
        if self.moe_versions:
            out["moe_versions"] = {
                transfer.label(s): v for s, v in sorted(self.moe_versions.items())
            }
        if self.transfers:
            out["moe_shapes"] = transfer.record(self.transfers)
        if self.moe_kernels:
            out["moe_kernels"] = {transfer.label(s): w for s, w in sorted(self.moe_kernels.items())}
        if self.delta_lent:
            out["delta_rule_lent"] = dict(sorted(self.delta_lent.items()))
        if self.head_widths:
            out["head_widths"] = {
                f"{w}-wide prefill attention": f"from {s}-wide" for w, s in self.head_widths.items()
            }
        if self.moe_gating:
            out["moe_gating"] = {transfer.label(s): w for s, w in sorted(self.moe_gating.items())}
        return out

    def record_width(self, head_dim: int, source: int) -> None:
        """Note (once, warned) that ``head_dim``-wide prefill attention came from ``source``."""
        if head_dim not in self.head_widths:
            self.head_widths[head_dim] = source
            self.warn_once(
                f"{head_dim}-wide prefill attention: not in these tables, from the measured "
                f"{source}-wide heads scaled by their references (summary.json kernels.head_widths)"
            )

    def record_lent(self, kernel: str, where: str) -> None:
        """Note (once, logged) that ``kernel`` is not in these tables and came from ``where``."""
        if kernel not in self.delta_lent:
            self.delta_lent[kernel] = where
            self.warn_once(
                f"{kernel}: not in these tables, taken from {where} "
                "(summary.json kernels.delta_rule_lent)"
            )

    @functools.lru_cache(maxsize=8)  # noqa: B019
    def moe_transfer_p90(self) -> float | None:
        """The P90 of :func:`~.transfer.held_out_errors` on the tables as measured (or None)."""
        errors = transfer.held_out_errors(replace(self, despike=False) if self.despike else self)
        return float(np.quantile(errors, 0.9)) if errors.size else None

    def moe_from(
        self, tokens: float, shape: tuple[int, ...], source: tuple[int, ...], gated: bool = True
    ) -> Timed:
        """``shape``'s fused MoE at ``tokens`` (``gated`` experts or not) from the measured
        ``source`` shape's (:func:`~.transfer.moe_ms`)."""
        grid = self.grid(("moe", *source))
        refs = [self.moe_reference(shape, gated), self.moe_reference(source)]
        at = transfer.source_tokens(tokens, shape, source)
        timed = None if grid is None else grid.at((at,))
        if timed is None or refs[0] is None or refs[1] is None:
            return None
        return transfer.moe_ms(tokens, timed[0], at, refs[0], refs[1]), INTERPOLATED

    def moe_reference(self, shape: tuple[int, ...], gated: bool = True) -> Roofline | None:
        """The roofline reference of ``shape``'s fused MoE on its tokens (three expert GEMMs
        when ``gated``, else two)."""
        return self._roofline(reference.moe(shape, self.dtype, 3 if gated else 2), self.dtype)

    def gdn(self, phase: str, batch: int, length: int, k_heads: int, v_heads: int) -> Timed:
        """The GDN (gated delta rule) scan of ``batch`` sequences of ``length`` tokens
        (``context``: the chunked prefill scan; ``generation``: one recurrent decode step,
        ``length`` 1) at 128-wide key and value heads."""
        return self.delta_rule("gdn", phase, "scan", batch, length, (k_heads, v_heads))

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def delta_rule(
        self,
        family: str,
        phase: str,
        part: str,
        batch: int,
        length: float,
        heads: tuple[int, int],
        d_model: int = 0,
        from_class: bool = True,
    ) -> Timed:
        """One ``part`` (``scan`` or ``conv``) of a ``family`` (``gdn`` or ``kda``) layer over
        ``batch`` sequences of ``length`` tokens in ``phase`` (``context``: a prefill;
        ``generation``: one decode step, ``length`` 1) at ``heads`` (key heads, value heads)
        per GPU, measured for a model of ``d_model`` where the table has one. A kernel these
        tables lack comes from another engine's table on the GPU, and GDN's chunked scan where
        no engine measured its shape here from other GPUs of its class (:mod:`.delta_lend`;
        ``from_class`` False: not, as a lending GPU is asked)."""
        grid, lender = self.grid((family, phase, part, d_model)), None
        if grid is None and family == "gdn":  # KDA's engines run different kernels
            key = (family, phase, part, d_model)
            if key not in self._lenders:
                self._lenders[key] = delta_lend.elsewhere(self, *key)
            grid, lender = self._lenders[key] or (None, None)
        timed = None if grid is None else grid.at((*heads, batch, length))
        if timed is not None and lender is not None:
            self.record_lent(f"{family} {phase} {part}", lender)
        if timed is None and from_class and (family, phase, part) == ("gdn", *delta_lend.SCAN):
            return delta_lend.gdn_scan(self, (heads, batch, length), d_model)
        return timed

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def mamba2(self, batch: int, tokens: int, shape: tuple[int, ...]) -> Timed:
        """A Mamba2 layer's conv1d + SSD scan of ``batch`` sequences of ``tokens`` tokens each
        (``tokens`` 0: its recurrent decode step), from ``gpu_validate tables``; ``shape``:
        (heads, head dim, state dim, groups)."""
        if tokens:
            grid = self.grid(("mamba2_scan", *shape))
            return None if grid is None else grid.at((batch, tokens))
        grid = self.grid(("mamba2_step", *shape))
        return None if grid is None else grid.at((batch,))

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def allreduce(self, elements: int, gpus: int) -> Timed:
        """One all-reduce of ``elements`` BF16 values over ``gpus`` GPUs."""
        grid = self.grid(("allreduce", gpus))
        return None if grid is None else grid.at((elements,))


def _mamba2_grid(path: Path, key: tuple[Any, ...]) -> Grid | None:
    frame = tables.rows(path, ())
    columns = ("nheads", "head_dim", "d_state", "n_groups")
    for column, value in zip(columns, key[1:], strict=True):
        frame = frame[frame[column] == value]
    axes = ["batch_size", "seq_len"] if key[0] == "mamba2_scan" else ["batch_size"]
    return Grid.from_frame(frame, axes, 1.0)


def _allreduce_grid(path: Path, key: tuple[Any, ...]) -> Grid | None:
    frame = tables.kernel_rows(tables.rows(path, ()), ("graph",))
    return Grid.from_frame(frame[frame["num_gpus"] == key[1]], ["message_size"], 1.0)


def _delta_rule_grid(path: Path, key: tuple[Any, ...]) -> Grid | None:
    """``key``: (family, phase, part, d_model) (:func:`.delta_lend.grid`)."""
    return delta_lend.grid(path, *key[1:])
