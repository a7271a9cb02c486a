"""simlab side by side with peer simulators on one Mooncake-format trace (``make bench-peers``).

Installs each peer into a throwaway virtual environment under ``.bench-peers/`` (git-ignored;
never a dependency of simlab) and skips a peer, with a message and exit status 0, when it cannot
be installed (no network, a failed install or import):

* ``kvcache-simulator==0.1.3`` (PyPI, KVCache.AI): ``pip install kvcache-simulator==0.1.3``;
  its C++ backend compiles a bundled source with ``c++`` on first use (into
  ``.bench-peers/tmp``, outside the timed runs), its Python backend needs nothing.
* DynoSim, ``ai-dynamo-runtime==1.6.1`` installed with ``--no-deps`` (the offline mocker
  replay, ``dynamo._core.run_mocker_trace_replay``; the ``ai-dynamo`` package around it is not
  needed and its dependencies are not installed).

Every tool runs in its own process (``bench/peer_driver.py`` for the peers, ``python -m
simlab`` for simlab) on the same trace file and the same capacities, after one untimed warm-up
round (simlab's trace cache, the C++ build, the page cache) and with simlab's sources compiled to
bytecode first (:func:`compile_simlab`), as pip compiles the peers' at install. Each case then runs ``--repeat``
rounds, alternating the order of the tools every round (simlab, peer, ... then peer, ...,
simlab), and reports the median process wall time (the subprocess, start to exit), the median
simulation time each tool reports (simlab: the replay / timed loop, ``summary.json`` ``wall_s``;
kvcache-simulator: ``run_sweep``; DynoSim: its ``wall_time_ms``), the ratios simlab / peer and
the token hit rates.

Capacities: blocks of 512 tokens (the trace's hash-id block). kvcache-simulator sizes its cache
in GiB with the model catalog's bytes per block (``llama-3.1-8b``, ``bf16_fp16``: 131,072 B per
token, 64 MiB per block, so 1 GiB = 16 blocks exactly); simlab runs ``model=llama3_8b`` (the same
131,072 B per token) with ``cache.size_gb = (blocks + 1/2) * 64 MiB / 1e9``, which holds exactly
``blocks`` blocks; DynoSim gets ``num_gpu_blocks = blocks``. Both mappings are checked at run time.

Four capacities x three policies in one call: kvcache-simulator's one ``run_sweep`` call beside one
``python -m simlab`` call with ``cache.size_gb`` a list of the four capacities and the three
policies as the ``compare`` set (:func:`compare_overrides`): on the block pool's fast paths (one
walk of the trace shared by the policies; LRU in one stack-distance pass, ``simlab/fastpaths/stack.py``;
FIFO and optimal on block ids, ``simlab/fastpaths/blocks/heap.py``), and again with ``cache.one_pass=false``
(every capacity and policy replayed request by request). ``--case TEXT`` runs only the matching
cases.

Hit rates are kvcache-simulator's: hit tokens over input tokens of the last 50% of requests (its
measurement window; simlab's and DynoSim's from their per-request records). Same semantics must
agree within 0.1 point (exit status 1 otherwise):

* LRU: simlab ``+policy=vllm policy.block_size=512 +policy.semantics.whole_input_hit=true
  policy.admission.whole_last_id=true`` (one tree node per block, LRU over leaves, the matched
  path refreshed on a hit, the prompt admitted after the lookup) is kvcache-simulator's ``lru``.
  kvcache-simulator takes every hash id for a whole block, a prompt's partial last one too
  (``whole_last_id``; vLLM never caches a partial block), and credits a fully cached prompt
  whole (``whole_input_hit``; vLLM leaves the last block, ``len(input) - 1``, to recompute).
* FIFO and optimal are reported beside simlab's nearest policies, not required to agree:
  kvcache-simulator's ``fifo`` evicts any block in insertion order (inner blocks too), simlab's
  FIFO evicts leaves only; its ``optimal`` is Belady that also refuses to admit a block used
  later than every cached leaf, simlab's ``clairvoyant_blocks`` always admits.
* DynoSim is vLLM: a hit within ``len(input) - 1`` tokens in full blocks and the partial tail
  block never cached. Its sequential replay is compared with simlab's ``vllm`` policy (default
  semantics, the same rules; simlab's are checked against vLLM's own ``KVCacheManager`` on this
  trace, ``tests/fixtures/crosscheck/mooncake_*``): the hit rates agree at an infinite cache;
  at a finite one DynoSim also caches the full blocks of its made-up replies, which take room
  from the prompts' (simlab admits no reply of a hash-id trace: its blocks are unknown). Its
  timed replay has its own timing model (polynomial) and
  simlab's timed engine the roofline model: the hit rates are reported, not compared. The
  timed engine runs twice: on the prefix tree with a separate running budget (the default
  ``engine.kv_pool=separate``), and on vLLM's block pool of exactly DynoSim's blocks for
  running requests and cache together (``engine.kv_pool=shared engine.running_memory_gb=0``),
  where a decode's full reply blocks are cached too, as in DynoSim.

Start-up floor (:func:`start_up_floor`): the process time of ``python -c "import numpy,
pyarrow.parquet, hydra.main"`` and of ``python -m simlab ... --cfg job`` (simlab's imports and its
config composed by Hydra, nothing simulated), printed beside each peer's one-capacity process: the
share of a simlab process that no simulation speed-up removes.

Writes ``bench/results/peers.json`` (atomically) and prints the table.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: simlab's own packages, imported from the source tree (an editable install)
SIMLAB_PACKAGES = ("simlab", "policies", "traces", "hydra_plugins")
CACHE_DIR = ROOT / ".bench-peers"
OUT_JSON = ROOT / "bench" / "results" / "peers.json"
DRIVER = Path(__file__).resolve().parent / "peer_driver.py"
TRACE_FILE = Path("mooncake") / "synthetic_trace.jsonl"

log = logging.getLogger("bench.peers")

BLOCK_TOKENS = 512
GIB = 2**30
SIMLAB_MODEL = "llama3_8b"
KVSIM_MODEL = "llama-3.1-8b"
KVSIM_PRECISION = "bf16_fp16"
#: bytes of one 512-token block of Llama-3-8B in BF16: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 B
BLOCK_BYTES = 2 * 32 * 8 * 128 * 2 * BLOCK_TOKENS
CAPACITIES = (256, 1024, 4096, 16384)
ONE_CAPACITY = 4096
#: "infinite": more blocks than the trace has (43,924 distinct), for DynoSim; simlab runs ``inf``
INF_BLOCKS = 1_000_000
POLICIES = ("fifo", "lru", "optimal")
#: same-semantics hit rates must agree within this (0.1 point)
TOLERANCE = 0.001
WARMUP_FRACTION = 0.5

_SIMLAB_BASE = [
    "trace=mooncake",
    f"model={SIMLAB_MODEL}",
    "arrivals.mode=timestamps",
    "bounds.enabled=false",
    "report=false",
    "overwrite=true",
]
_VLLM = ["+policy=vllm", f"policy.block_size={BLOCK_TOKENS}"]
_WHOLE = ["+policy.semantics.whole_input_hit=true", "policy.admission.whole_last_id=true"]
#: simlab's policy nearest to each kvcache-simulator policy (module docstring)
SIMLAB_POLICY = {
    "lru": [*_VLLM, *_WHOLE],
    "fifo": [*_VLLM, "eviction@policy.eviction=fifo", "policy.name=vllm_fifo", *_WHOLE],
    "optimal": ["+policy=clairvoyant_blocks", f"policy.block_size={BLOCK_TOKENS}", *_WHOLE],
    # the vLLM engine's own semantics (a hit within len(input) - 1), beside DynoSim
    "vllm": _VLLM,
}


#: one ``python -m simlab`` call running the three kvcache-simulator policies' counterparts
#: (the ``compare`` set replaced; each policy named as kvcache-simulator names it)
_COMPARE_DROP = [
    "~policy@compare.vllm_plus",
    "~policy@compare.sglang_plus",
    "~policy@compare.marconi",
]
_COMPARE_AS_PEER = {
    "lru": ["+policy@compare.lru=vllm"],
    "fifo": ["+policy@compare.fifo=vllm", "eviction@compare.fifo.eviction=fifo"],
    "optimal": ["+policy@compare.optimal=clairvoyant_blocks"],
}


def compare_overrides(policies: Sequence[str]) -> list[str]:
    """The ``compare`` set of :data:`SIMLAB_POLICY`'s policies for ``policies``
    (kvcache-simulator's names), named after them, with 512-token blocks, whole-input hits and
    every id a whole block."""
    out = list(_COMPARE_DROP)
    for name in policies:
        out += _COMPARE_AS_PEER[name]
        out += [
            f"compare.{name}.name={name}",
            f"compare.{name}.block_size={BLOCK_TOKENS}",
            f"+compare.{name}.semantics.whole_input_hit=true",
            f"compare.{name}.admission.whole_last_id=true",
        ]
    return out


# ---------------------------------------------------------------------------- capacities
def blocks_to_gib(blocks: int) -> float:
    """kvcache-simulator's budget holding exactly ``blocks`` blocks (it floors GiB / block)."""
    return blocks * BLOCK_BYTES / GIB


def blocks_to_size_gb(blocks: int) -> float:
    """simlab's ``cache.size_gb`` holding exactly ``blocks`` blocks (half a block of margin)."""
    if blocks >= INF_BLOCKS:
        return math.inf
    return (blocks + 0.5) * BLOCK_BYTES / 1e9


def point_key(policy: str, blocks: int) -> str:
    return f"{policy}@{'inf' if blocks >= INF_BLOCKS else blocks}"


def simlab_block_bytes() -> int:
    """KV bytes of one trace block in simlab's ``model=llama3_8b`` (checks :data:`BLOCK_BYTES`)."""
    from omegaconf import OmegaConf

    from simlab.model.spec import ModelSpec

    cfg = OmegaConf.load(ROOT / "configs" / "model" / f"{SIMLAB_MODEL}.yaml")
    values = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(values, dict)
    spec = ModelSpec.from_config({str(k): v for k, v in values.items()})
    return spec.kv_bytes_per_token * BLOCK_TOKENS


def budgets_arg(blocks: Sequence[int]) -> str:
    return ",".join(format(blocks_to_gib(b), "g") for b in blocks)


# ---------------------------------------------------------------------------- peers
class PeerUnavailable(RuntimeError):
    """A peer could not be installed or imported: the bench skips it."""


@dataclass(frozen=True)
class Peer:
    name: str
    env: str  # folder under the cache dir
    packages: tuple[str, ...]
    no_deps: bool
    imports: str  # module that must import after the install


KVSIM = Peer(
    "kvcache-simulator 0.1.3", "kvsim", ("kvcache-simulator==0.1.3",), False, "kvcache_sim"
)
DYNOSIM = Peer(
    "DynoSim (ai-dynamo-runtime 1.6.1)",
    "dynamo",
    ("ai-dynamo-runtime==1.6.1",),
    True,
    "dynamo._core",
)


def run_command(cmd: Sequence[str], timeout: float | None = None) -> None:
    """Run an install step; CalledProcessError / TimeoutExpired / OSError when it fails."""
    subprocess.run(list(cmd), check=True, capture_output=True, text=True, timeout=timeout)


def failure(err: BaseException) -> str:
    if isinstance(err, subprocess.CalledProcessError):
        tail = (err.stderr or err.stdout or "").strip().splitlines()[-3:]
        return f"exit {err.returncode}: " + " | ".join(tail)
    return f"{type(err).__name__}: {err}"


def ensure_env(peer: Peer, cache_dir: Path) -> Path:
    """The interpreter of ``peer``'s throwaway environment, installed on first use."""
    env = cache_dir / peer.env
    python = env / "bin" / "python"
    stamp = env / ".installed"
    spec = " ".join(["--no-deps"] * peer.no_deps + list(peer.packages))
    if stamp.is_file() and stamp.read_text() == spec and python.exists():
        return python
    print(f"bench.peers: installing {peer.name} into {env} ...", flush=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    try:
        run_command([sys.executable, "-m", "venv", "--clear", str(env)], timeout=300)
        run_command([*pip, *(["--no-deps"] if peer.no_deps else []), *peer.packages], timeout=1200)
        run_command([str(python), "-c", f"import {peer.imports}"], timeout=120)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as err:
        raise PeerUnavailable(f"{peer.name} cannot be installed ({failure(err)})") from err
    stamp.write_text(spec)
    return python


# ---------------------------------------------------------------------------- one run
@dataclass
class Run:
    process_s: float
    sim_s: float | None
    hits: dict[str, float]  # "policy@blocks" -> hit rate over the last half
    extra: dict[str, Any] = field(default_factory=dict)


def timed(cmd: Sequence[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    """Process wall time of ``cmd`` and its stdout; RuntimeError when it fails."""
    t0 = time.perf_counter()
    done = subprocess.run(list(cmd), cwd=ROOT, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed:\n{done.stderr[-3000:]}")
    return elapsed, done.stdout


def last_line_json(stdout: str) -> dict[str, Any]:
    import json

    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ValueError("no output")
    out: dict[str, Any] = json.loads(lines[-1])
    return out


def window_hit_rate(hit: Sequence[int], inputs: Sequence[int]) -> float:
    """Hit tokens over input tokens of the requests after the first ``floor(n / 2)``
    (kvcache-simulator's measurement window), requests in processing order."""
    start = math.floor(len(hit) * WARMUP_FRACTION)
    total = sum(inputs[start:])
    return sum(hit[start:]) / total if total else 0.0


def parse_kvsim(payload: dict[str, Any], blocks: Sequence[int]) -> dict[str, float]:
    """``{"policy@blocks": hit rate}`` from a kvcache-simulator JSON result, checking that its
    capacity mapping is ours (bytes per block, cache blocks of every point)."""
    meta = payload["metadata"]
    if meta["blockSize"] != BLOCK_TOKENS or meta["bytesPerBlock"] != BLOCK_BYTES:
        raise ValueError(
            f"kvcache-simulator sizes blocks as {meta['bytesPerBlock']} B of {meta['blockSize']} "
            f"tokens, expected {BLOCK_BYTES} B of {BLOCK_TOKENS}"
        )
    hits: dict[str, float] = {}
    for point in payload["points"]:
        if point["cacheBlocks"] not in blocks:
            raise ValueError(f"kvcache-simulator ran {point['cacheBlocks']} blocks, not {blocks}")
        for policy, result in point["results"].items():
            hits[f"{policy}@{point['cacheBlocks']}"] = float(result["hitRate"])
    return hits


def parse_dynosim(payload: dict[str, Any]) -> tuple[dict[str, float], dict[str, Any]]:
    """Hit rates (last half; all requests) and the extra figures of a DynoSim driver run."""
    half = payload["hit_tokens_last_half"] / payload["input_tokens_last_half"]
    whole = payload["hit_tokens"] / payload["input_tokens"]
    return {"last_half": half}, {"hit_rate_all": whole, "call_s": payload["call_s"]}


@dataclass
class Setup:
    trace: Path
    workdir: Path
    peers: dict[str, Path]  # env name -> python
    counter: int = 0

    def out_dir(self) -> Path:
        self.counter += 1
        return self.workdir / f"run{self.counter}"


def run_simlab(
    setup: Setup, points: Sequence[tuple[str, int]], engine: str = "replay", pool: bool = False
) -> Run:
    """One ``python -m simlab`` process per (policy, blocks) point, summed. ``pool``: the timed
    engine on vLLM's block pool of exactly ``blocks`` blocks for running requests and the
    cache together (``engine.kv_pool=shared``, no running memory besides), DynoSim's
    ``num_gpu_blocks``."""
    import json

    import pandas as pd

    process = sim = 0.0
    hits: dict[str, float] = {}
    extra: dict[str, Any] = {}
    for policy, blocks in points:
        out = setup.out_dir()
        overrides = [*_SIMLAB_BASE, f"trace.path={setup.trace}", f"engine={engine}"]
        overrides += SIMLAB_POLICY[policy]
        if engine == "timed":
            overrides += ["hardware=h200", "engine.memory_check=false"]
        if pool:
            overrides += ["engine.kv_pool=shared", "engine.running_memory_gb=0"]
        size = blocks_to_size_gb(blocks)
        overrides += [f"cache.size_gb={'inf' if math.isinf(size) else repr(size)}"]
        elapsed, _ = timed(
            [
                sys.executable,
                "-m",
                "simlab",
                *overrides,
                f"hydra.run.dir={out}",
                f"output_dir={out}",
            ]
        )
        summary = json.loads((out / "summary.json").read_text())
        (row,) = summary["policies"].values()
        records = pd.read_parquet(out / "records.parquet", columns=["hit_tokens", "input_tokens"])
        process += elapsed
        sim += float(row["wall_s"])
        key = point_key(policy, blocks)
        hits[key] = window_hit_rate(
            records["hit_tokens"].tolist(), records["input_tokens"].tolist()
        )
        extra[f"hit_rate_all {key}"] = float(row["token_hit_rate"])
        extra[f"sim_s {key}"] = float(row["wall_s"])
        extra[f"process_s {key}"] = elapsed
        shutil.rmtree(out, ignore_errors=True)
    return Run(process, sim, hits, extra)


def size_list(blocks: Sequence[int]) -> str:
    """``cache.size_gb=[...]`` holding exactly ``blocks`` blocks at each capacity."""
    sizes = [blocks_to_size_gb(b) for b in blocks]
    return "cache.size_gb=[" + ",".join("inf" if math.isinf(v) else repr(v) for v in sizes) + "]"


def run_simlab_list(
    setup: Setup, policies: Sequence[str], blocks: Sequence[int], one_pass: bool = True
) -> Run:
    """One ``python -m simlab`` process for every (policy, blocks) point: ``cache.size_gb`` a
    list, the policies as the ``compare`` set; ``cache.one_pass=false`` replays every point
    request by request instead of on the block pool's fast paths. ``sim_s``: the summed
    ``wall_s``."""
    import pandas as pd

    out = setup.out_dir()
    overrides = [*_SIMLAB_BASE, f"trace.path={setup.trace}", "engine=replay"]
    overrides += [*compare_overrides(policies), size_list(blocks)]
    overrides += [f"cache.one_pass={str(one_pass).lower()}"]
    elapsed, _ = timed(
        [sys.executable, "-m", "simlab", *overrides, f"hydra.run.dir={out}", f"output_dir={out}"]
    )
    table = pd.read_parquet(out / "capacities.parquet")
    hits: dict[str, float] = {}
    extra: dict[str, Any] = {"replay": {}}
    for b, run_dir in zip(blocks, table["run_dir"].unique().tolist(), strict=True):
        records = pd.read_parquet(out / run_dir / "records.parquet")
        for policy, rows in records.groupby("policy", sort=False):
            key = point_key(str(policy), b)
            hits[key] = window_hit_rate(rows["hit_tokens"].tolist(), rows["input_tokens"].tolist())
    for row in table.itertuples():
        extra["replay"][f"{row.policy}@{row.run_dir}"] = row.replay
        extra[f"sim_s {row.policy}@{row.run_dir}"] = float(row.wall_s)
    shutil.rmtree(out, ignore_errors=True)
    return Run(elapsed, float(table["wall_s"].sum()), hits, extra)


def peer_env(setup: Setup) -> dict[str, str]:
    env = dict(os.environ)
    tmp = CACHE_DIR / "tmp"  # the C++ backend's build goes to tempfile.gettempdir()
    tmp.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(tmp)
    return env


def run_kvsim(setup: Setup, backend: str, blocks: Sequence[int], policies: Sequence[str]) -> Run:
    cmd = [
        str(setup.peers["kvsim"]),
        str(DRIVER),
        "kvsim",
        f"--trace={setup.trace}",
        f"--block-size={BLOCK_TOKENS}",
        f"--model={KVSIM_MODEL}",
        f"--kv-precision={KVSIM_PRECISION}",
        f"--budgets-gib={budgets_arg(blocks)}",
        f"--policies={','.join(policies)}",
        f"--backend={backend}",
    ]
    elapsed, stdout = timed(cmd, peer_env(setup))
    payload = last_line_json(stdout)
    return Run(elapsed, payload["sim_s"], parse_kvsim(payload["result"], blocks))


def run_dynosim(setup: Setup, mode: str, blocks: int) -> Run:
    cmd = [
        str(setup.peers["dynamo"]),
        str(DRIVER),
        "dynosim",
        f"--trace={setup.trace}",
        f"--block-size={BLOCK_TOKENS}",
        f"--blocks={blocks}",
        f"--mode={mode}",
    ]
    elapsed, stdout = timed(cmd, peer_env(setup))
    payload = last_line_json(stdout)
    hits, extra = parse_dynosim(payload)
    return Run(elapsed, payload["sim_s"], {point_key("vllm", blocks): hits["last_half"]}, extra)


# ---------------------------------------------------------------------------- start-up floor
#: what every ``python -m simlab`` process loads before it reads a trace: numpy, pyarrow's parquet
#: (the trace cache, the records) and Hydra
STACK_IMPORTS = "import numpy, pyarrow.parquet, hydra.main"


def floor_commands(setup: Setup) -> dict[str, list[str]]:
    """The two start-up floors of a simlab process, simulating nothing: the stack's imports
    alone, and ``python -m simlab`` with the one-capacity case's overrides under Hydra's
    ``--cfg job`` (simlab's imports and the config composed, printed, then exit)."""
    overrides = [*_SIMLAB_BASE, f"trace.path={setup.trace}", "engine=replay"]
    overrides += [*SIMLAB_POLICY["lru"], f"cache.size_gb={blocks_to_size_gb(ONE_CAPACITY)!r}"]
    return {
        "python + numpy, pyarrow.parquet, hydra imports": [sys.executable, "-c", STACK_IMPORTS],
        "python -m simlab ... --cfg job (no simulation)": [
            sys.executable,
            "-m",
            "simlab",
            *overrides,
            "--cfg",
            "job",
        ],
    }


def start_up_floor(setup: Setup, repeat: int) -> dict[str, dict[str, Any]]:
    """Median process seconds of each :func:`floor_commands` over ``repeat`` alternating rounds
    (after one untimed round): the part of a simlab process that no simulation speed-up
    shortens, beside the peers' whole processes."""
    commands = floor_commands(setup)
    names = list(commands)
    for name in names:
        timed(commands[name])
    runs: dict[str, list[float]] = {name: [] for name in names}
    for index in range(repeat):
        for name in names if index % 2 == 0 else reversed(names):
            runs[name].append(timed(commands[name])[0])
    return {name: {"process_s": statistics.median(r), "runs_s": r} for name, r in runs.items()}


def format_floor(floor: dict[str, dict[str, Any]], results: list[dict[str, Any]]) -> str:
    """The floor's lines, each beside every peer's one-capacity process time (its ratio)."""
    peers = {
        row["tool"]: row["process_s"]
        for result in results
        if result["case"] == f"LRU, {ONE_CAPACITY} blocks"
        for row in result["rows"][1:]
    }
    lines = ["", "== start-up floor: simlab processes that simulate nothing"]
    for name, entry in floor.items():
        ratios = "".join(
            f"  {entry['process_s'] / s:.2f}x {peer}" for peer, s in peers.items() if s
        )
        lines.append(f"{name:50s} {entry['process_s']:6.2f} s{ratios}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- cases
Runner = Callable[[Setup], Run]


@dataclass
class Case:
    name: str
    tools: dict[str, Runner]  # the simlab tool first
    same_semantics: set[str]  # peers whose hit rates must agree with simlab's
    note: str
    hit_keys: Callable[[str], bool] = lambda key: True  # keys compared for agreement


def build_cases(peers: dict[str, Path]) -> list[Case]:
    one = [("lru", ONE_CAPACITY)]
    sweep = [(p, b) for b in CAPACITIES for p in POLICIES]
    cases: list[Case] = []
    if "kvsim" in peers:
        cpp = shutil.which("c++") is not None
        backends = ["cpp", "python"] if cpp else ["python"]
        one_tools: dict[str, Runner] = {"simlab replay (vllm LRU)": lambda s: run_simlab(s, one)}
        sweep_tools: dict[str, Runner] = {
            "simlab replay, 12 processes": lambda s: run_simlab(s, sweep)
        }
        for backend in backends:
            one_tools[f"kvcache-simulator {backend}"] = partial(
                run_kvsim, backend=backend, blocks=[ONE_CAPACITY], policies=["lru"]
            )
            sweep_tools[f"kvcache-simulator {backend}, one call"] = partial(
                run_kvsim, backend=backend, blocks=CAPACITIES, policies=POLICIES
            )
        calls: dict[str, Runner] = {
            "simlab, one call (block paths)": lambda s: run_simlab_list(s, POLICIES, CAPACITIES),
            "simlab, one call (request by request)": lambda s: run_simlab_list(
                s, POLICIES, CAPACITIES, one_pass=False
            ),
        }
        for backend in backends:
            calls[f"kvcache-simulator {backend}, one call"] = sweep_tools[
                f"kvcache-simulator {backend}, one call"
            ]
        note = "" if cpp else "no c++ compiler: the C++ backend is skipped"
        cases.append(Case(f"LRU, {ONE_CAPACITY} blocks", one_tools, set(one_tools), note))
        cases.append(
            Case(
                f"{len(POLICIES)} policies x {len(CAPACITIES)} capacities",
                sweep_tools,
                set(sweep_tools),
                "LRU must agree; FIFO and optimal differ in semantics (module docstring)",
                hit_keys=lambda key: key.startswith("lru@"),
            )
        )
        cases.append(
            Case(
                f"{len(CAPACITIES)} capacities x {len(POLICIES)} policies in one call",
                calls,
                set(calls),
                "cache.size_gb a list in one simlab process; LRU must agree",
                hit_keys=lambda key: key.startswith("lru@"),
            )
        )
    if "dynamo" in peers:
        vllm = [("vllm", ONE_CAPACITY)]
        cases.append(
            Case(
                f"vLLM engine replay, {ONE_CAPACITY} blocks",
                {
                    "simlab replay (vllm)": lambda s: run_simlab(s, vllm),
                    "DynoSim sequential": lambda s: run_dynosim(s, "sequential", ONE_CAPACITY),
                },
                set(),
                "DynoSim also caches its made-up replies' full blocks: not required to agree",
            )
        )
        inf = [("vllm", INF_BLOCKS)]
        cases.append(
            Case(
                "vLLM engine replay, infinite cache",
                {
                    "simlab replay (vllm)": lambda s: run_simlab(s, inf),
                    "DynoSim sequential": lambda s: run_dynosim(s, "sequential", INF_BLOCKS),
                },
                {"DynoSim sequential"},
                "same hit rule (whole blocks within len(input) - 1): must agree",
            )
        )
        cases.append(
            Case(
                f"timed engine, {ONE_CAPACITY} blocks",
                {
                    "simlab timed (vllm, h200)": lambda s: run_simlab(s, vllm, "timed"),
                    "DynoSim timed": lambda s: run_dynosim(s, "timed", ONE_CAPACITY),
                },
                set(),
                "different timing models (roofline vs polynomial): hit rates not comparable",
            )
        )
        cases.append(
            Case(
                f"timed engine on one pool of {ONE_CAPACITY} blocks",
                {
                    "simlab timed (vllm pool, h200)": lambda s: run_simlab(
                        s, vllm, "timed", pool=True
                    ),
                    "DynoSim timed": lambda s: run_dynosim(s, "timed", ONE_CAPACITY),
                },
                set(),
                "running requests and cache share the blocks in both; different timing models: "
                "hit rates not comparable",
            )
        )
    for case in cases:  # the simlab tool compares with itself: drop it
        case.same_semantics.discard(next(iter(case.tools)))
    return cases


def run_case(case: Case, setup: Setup, repeat: int) -> dict[str, list[Run]]:
    """``repeat`` rounds, the tools' order reversed every other round."""
    runs: dict[str, list[Run]] = {tool: [] for tool in case.tools}
    names = list(case.tools)
    for index in range(repeat):
        for tool in names if index % 2 == 0 else reversed(names):
            run = case.tools[tool](setup)
            runs[tool].append(run)
            log.info("%s | %s: %.2f s", case.name, tool, run.process_s)
    return runs


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(case: Case, runs: dict[str, list[Run]]) -> dict[str, Any]:
    """The case's rows: medians, ratios simlab / peer, hit rates and their agreement."""
    simlab = next(iter(case.tools))
    base = runs[simlab][-1].hits
    process = {t: median([r.process_s for r in rs]) for t, rs in runs.items()}
    sim = {t: median([r.sim_s for r in rs]) for t, rs in runs.items()}
    rows = []
    for tool, tool_runs in runs.items():
        hits = tool_runs[-1].hits
        common = sorted(k for k in hits.keys() & base.keys() if case.hit_keys(k))
        diff = max((abs(hits[k] - base[k]) for k in common), default=None)
        agree = None if tool not in case.same_semantics or diff is None else diff <= TOLERANCE
        rows.append(
            {
                "tool": tool,
                "process_s": process[tool],
                "sim_s": sim[tool],
                "process_runs_s": [r.process_s for r in tool_runs],
                "sim_runs_s": [r.sim_s for r in tool_runs],
                "simlab_over_peer_process": None
                if tool == simlab
                else ratio(process[simlab], process[tool]),
                "simlab_over_peer_sim": None if tool == simlab else ratio(sim[simlab], sim[tool]),
                "hit_rates": hits,
                "max_hit_diff_vs_simlab": diff,
                "hits_agree": agree,
                "extra": tool_runs[-1].extra,
            }
        )
    return {"case": case.name, "note": case.note, "rows": rows}


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_hits(hits: dict[str, float]) -> str:
    """``policy cap=rate cap=rate | policy ...``, capacities in increasing order."""
    by_policy: dict[str, list[tuple[float, str, float]]] = {}
    for key, rate in hits.items():
        policy, cap = key.split("@")
        order = math.inf if cap == "inf" else float(cap)
        by_policy.setdefault(policy, []).append((order, cap, rate))
    return " | ".join(
        f"{policy} " + " ".join(f"{cap}={rate:.4f}" for _, cap, rate in sorted(points))
        for policy, points in sorted(by_policy.items())
    )


def format_table(results: list[dict[str, Any]]) -> str:
    head = (
        f"{'tool':34s} {'process s':>9s} {'sim s':>8s} {'simlab/peer':>11s} {'(sim)':>7s}"
        "  hit rates, last 50% (blocks=rate)"
    )
    lines = []
    for result in results:
        lines += [
            "",
            f"== {result['case']}" + (f"  ({result['note']})" if result["note"] else ""),
            head,
        ]
        for row in result["rows"]:
            agree = {None: "", True: "  agree", False: "  DIFFER"}[row["hits_agree"]]
            ratios = "".rjust(19)
            if row["simlab_over_peer_process"] is not None:
                ratios = (
                    f"{fmt(row['simlab_over_peer_process'], '10.2f')}x "
                    f"{fmt(row['simlab_over_peer_sim'], '6.2f')}x"
                )
            lines.append(
                f"{row['tool']:34s} {fmt(row['process_s'], '9.2f')} {fmt(row['sim_s'], '8.3f')} "
                f"{ratios}  {format_hits(row['hit_rates'])}{agree}"
            )
    return "\n".join(lines)


# ---------------------------------------------------------------------------- main
def install_peers(cache_dir: Path, wanted: Sequence[str]) -> tuple[dict[str, Path], dict[str, str]]:
    """Interpreters of the peers that install; the reason for each that does not."""
    peers: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    for peer in (KVSIM, DYNOSIM):
        if peer.env not in wanted:
            continue
        try:
            peers[peer.env] = ensure_env(peer, cache_dir)
        except PeerUnavailable as err:
            skipped[peer.env] = str(err)
            print(f"bench.peers: skipping {err}", flush=True)
    return peers, skipped


def default_trace() -> Path | None:
    from bench.identity import default_data_dir

    data = default_data_dir()
    return data / TRACE_FILE if data is not None else None


def check_mapping() -> None:
    if simlab_block_bytes() != BLOCK_BYTES:
        raise SystemExit(f"simlab's {SIMLAB_MODEL} block is not {BLOCK_BYTES} B: fix BLOCK_BYTES")


def compile_simlab() -> None:
    """Compile simlab's packages to bytecode, as pip does for an installed package (the peers'
    are). An editable install runs from the source tree, and with ``PYTHONDONTWRITEBYTECODE``
    set every ``python -m simlab`` recompiled its ~50 modules: 0.84 s against 0.72 s for the
    one-capacity case."""
    import compileall

    for package in SIMLAB_PACKAGES:
        if not compileall.compile_dir(ROOT / package, quiet=1):
            raise RuntimeError(f"bench.peers: could not compile {ROOT / package}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds per case (median)")
    parser.add_argument("--trace", type=Path, default=None, help="Mooncake-format JSONL")
    parser.add_argument("--peers", nargs="*", default=["kvsim", "dynamo"], help="kvsim dynamo")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    parser.add_argument("--out", type=Path, default=OUT_JSON)
    parser.add_argument(
        "--case", default=None, help="run only the cases whose name contains this text"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)

    trace = args.trace or default_trace()
    if trace is None or not trace.is_file():
        print(f"bench.peers: skipped, no Mooncake-format trace at {trace} (--trace FILE)")
        return 0
    peers, skipped = install_peers(args.cache_dir, args.peers)
    if not peers:
        print("bench.peers: skipped, no peer simulator could be installed")
        return 0
    check_mapping()
    compile_simlab()
    cases = [c for c in build_cases(peers) if args.case is None or args.case in c.name]
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        setup = Setup(trace.resolve(), Path(tmp), peers)
        for case in cases:  # warm-up: trace cache, C++ build, page cache (untimed)
            if "12 processes" not in next(iter(case.tools)):
                run_case(case, setup, 1)
        results = [summarize(case, run_case(case, setup, args.repeat)) for case in cases]
        floor = start_up_floor(setup, args.repeat)
    print(format_table(results))
    print(format_floor(floor, results))
    report = {
        "trace": str(trace),
        "repeat": args.repeat,
        "cpus": os.cpu_count(),
        "block_tokens": BLOCK_TOKENS,
        "block_bytes": BLOCK_BYTES,
        "capacities_blocks": list(CAPACITIES),
        "mapping": {
            "kvcache-simulator": {b: f"--budgets-gib {blocks_to_gib(b):g}" for b in CAPACITIES},
            "simlab": {b: f"cache.size_gb={blocks_to_size_gb(b)!r}" for b in CAPACITIES},
            "dynosim": {b: f"num_gpu_blocks={b}" for b in CAPACITIES},
        },
        "skipped": skipped,
        "cases": results,
        "start_up_floor": floor,
    }
    from simlab.engines.records import write_json_atomic

    write_json_atomic(report, args.out)
    differ = [r["tool"] for c in results for r in c["rows"] if r["hits_agree"] is False]
    if differ:
        print(f"bench.peers: hit rates differ by more than 0.1 point: {differ}")
        return 1
    print(f"bench.peers: results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
