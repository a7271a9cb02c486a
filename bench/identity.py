"""Byte-identity harness: prove a refactor leaves every simulation output unchanged.

``write OUTDIR`` runs a fixed matrix of small simulations (:data:`CASES`) through the public
entry point only (``simlab.run.simulate.simulate`` on a config composed with Hydra's compose API from
this checkout's ``configs/``), each into ``OUTDIR/<case name>`` (``records.parquet``,
``occupancy.parquet``, ``summary.json``), plus ``OUTDIR/manifest.json`` saying which code ran.
``compare DIR_A DIR_B`` checks, for every case written in ``DIR_A``, that both parquet files are
byte-identical (on a mismatch the frames are loaded and the differing columns and first rows are
reported) and that ``summary.json`` agrees on ``policies`` (wall-clock keys such as ``wall_s``,
``requests_per_s`` or anything ending in ``_wall_s`` ignored), ``bounds`` and ``trace``. It prints
one line per case and exits 1 if any case differs or is missing; ``--accept-added`` lists B's
added columns and keys instead (:mod:`bench.identity_added`).

Before / after a refactor::

    git worktree add /tmp/base HEAD                    # the old code, never committed to
    cp bench/identity.py /tmp/base/bench/              # untracked there
    (cd /tmp/base && python -m bench.identity write /tmp/ident_before)
    python -m bench.identity write /tmp/ident_after    # from this checkout
    python -m bench.identity compare /tmp/ident_before /tmp/ident_after

``python -m`` puts the current directory first on ``sys.path``, so a run from ``/tmp/base`` uses
that checkout's ``simlab`` / ``policies`` / ``traces`` even though the virtual environment has an
editable install of another checkout; ``write`` refuses to run otherwise. Data are read from
``--data-dir`` (default ``$SIMLAB_DATA_DIR``, else ``../shared/data`` beside this checkout or
beside the main worktree of its git repository), passed as ``data_dir=`` to every case so both
checkouts read the same files. Tokenized traces are cached in a fresh temporary directory per
``write`` (``--trace-cache DIR`` to reuse one), so a changed loader cannot hide behind a cache entry
written by the other checkout. A case whose data file is missing is skipped with a warning.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.identity_added import is_added, print_added, without_added

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
OUTPUT_FILES = ("records.parquet", "occupancy.parquet")
SUMMARY_SECTIONS = ("policies", "bounds", "trace")
WALL_KEYS = frozenset({"wall_s", "requests_per_s", "tuning_wall_s", "snapshot_wall_s"})
MAX_REPORTED = 5

log = logging.getLogger("bench.identity")

Case = tuple[str, list[str]]


class ForeignCodeError(RuntimeError):
    """The simulator packages were imported from another checkout than this one."""


def policy_names() -> list[str]:
    """Every policy config in ``configs/policy`` (a policy added later joins automatically)."""
    return sorted(path.stem for path in (CONFIGS / "policy").glob("*.yaml"))


def offline_schedulers() -> list[str]:
    """Every offline batch scheduler config in ``configs/offline``."""
    return sorted(path.stem for path in (CONFIGS / "offline").glob("*.yaml"))


SHAREGPT_1GB = ["trace=sharegpt", "cache.size_gb=1"]
SWEBENCH_10 = ["trace=swebench", "trace.limit=10", "cache.size_gb=10"]
TUNING = ["+policy=marconi", "policy.tuning.enabled=true", "policy.tuning.workers=1"]


def policy_cases() -> list[Case]:
    """Each policy x {replay, timed} on ShareGPT (1 GB) and x replay on 10 SWE-bench instances."""
    cases: list[Case] = []
    for policy in policy_names():
        for engine in ("replay", "timed"):
            cases.append(
                (
                    f"{policy}-sharegpt-{engine}",
                    [f"+policy={policy}", f"engine={engine}", *SHAREGPT_1GB],
                )
            )
        cases.append(
            (f"{policy}-swebench10-replay", [f"+policy={policy}", "engine=replay", *SWEBENCH_10])
        )
    return cases


def offline_cases() -> list[Case]:
    """Each offline scheduler on the whole BatchLLM Table 3a batch (6400 prompts, ~2.5 s each)."""
    return [
        (
            f"offline-{scheduler}-batchllm3a",
            ["engine=offline", f"offline@engine.scheduler={scheduler}", "trace=batchllm_table3a",
             "+policy=sglang_plus", "model=llama3_8b"],
        )
        for scheduler in offline_schedulers()
    ]  # fmt: skip


FIXED_CASES: list[Case] = [
    ("sglang_plus-llama3_8b-sharegpt-replay",
     ["+policy=sglang_plus", "model=llama3_8b", "engine=replay", *SHAREGPT_1GB]),
    ("vllm_plus-llama3_8b-sharegpt-replay",
     ["+policy=vllm_plus", "model=llama3_8b", "engine=replay", *SHAREGPT_1GB]),
    ("sglang_plus-llama3_8b-page16-sharegpt-replay",
     ["+policy=sglang_plus", "model=llama3_8b", "cache.page_size=16", "engine=replay",
      *SHAREGPT_1GB]),
    ("marconi_tuning-sharegpt-replay", [*TUNING, "engine=replay", *SHAREGPT_1GB]),
    ("marconi_tuning-sharegpt-timed", [*TUNING, "engine=timed", *SHAREGPT_1GB]),
    ("compare_default-sharegpt-timed", ["engine=timed", "trace=sharegpt", "cache.size_gb=2"]),
    # the whole synthetic Mooncake trace (3993 requests) takes ~1.5 s, so no trace.limit
    ("sglang_plus-mooncake-replay",
     ["+policy=sglang_plus", "trace=mooncake", "model=llama3_8b", "arrivals.mode=timestamps",
      "engine=replay", "cache.size_gb=20"]),
    # an LRU over whole blocks (vLLM's block pool): computed from stack distances since the
    # stack pass took scalar runs too, so its records must stay the replay's
    ("vllm-llama3_8b-mooncake-replay",
     ["+policy=vllm", "policy.block_size=512", "trace=mooncake", "model=llama3_8b",
      "arrivals.mode=timestamps", "engine=replay", "cache.size_gb=20"]),
    ("vllm-whole_input-llama3_8b-sharegpt-replay",
     ["+policy=vllm", "+policy.semantics.whole_input_hit=true", "model=llama3_8b",
      "engine=replay", *SHAREGPT_1GB]),
    # FIFO and Belady over whole blocks: computed on block ids (simlab/fastpaths/blocks/heap.py), so their
    # records must stay the request-by-request replay's
    ("vllm_fifo-llama3_8b-mooncake-replay",
     ["+policy=vllm", "eviction@policy.eviction=fifo", "policy.block_size=512",
      "trace=mooncake", "model=llama3_8b", "arrivals.mode=timestamps", "engine=replay",
      "cache.size_gb=20"]),
    ("clairvoyant_blocks-llama3_8b-mooncake-replay",
     ["+policy=clairvoyant_blocks", "policy.block_size=512", "trace=mooncake",
      "model=llama3_8b", "arrivals.mode=timestamps", "engine=replay", "cache.size_gb=20"]),
    ("clairvoyant_blocks-llama3_8b-sharegpt-replay",
     ["+policy=clairvoyant_blocks", "model=llama3_8b", "engine=replay", *SHAREGPT_1GB]),
    # a hybrid on a hash-id trace: the admission's token parameters (here the scan chunk that
    # round_down aligns checkpoints to) are converted to blocks
    ("marconi-rounddown-mooncake-replay",
     ["+policy=marconi", "policy.admission.alignment=round_down", "trace=mooncake",
      "arrivals.mode=timestamps", "engine=replay", "cache.size_gb=5"]),
    # SGLang's two pools under load: running requests hold Mamba slots in the SSM pool, capped
    # at slots // 5 with extra_buffer (simlab/engines/timed/kv_pool.py _open_state_pool)
    ("sglang_extra_buffer-shared_ssm_pool-chat-timed",
     ["+policy=sglang", "policy.admission.mamba=extra_buffer", "model=nemotron_h_8b",
      "trace=chat", "trace.n_sessions=30", "arrivals.session_rate=1", "engine=timed",
      "cache.size_gb=4", "cache.ssm_gb=2", "engine.running_memory_gb=1",
      "engine.kv_pool=shared"]),
    # SGLang's scheduler on the shared pool under a saturating load: its admission (the new
    # token ratio, simlab/engines/timed/new_token_ratio.py) and its retraction
    ("sglang_plus-sglang_scheduler-chat-timed",
     ["+policy=sglang_plus", "model=llama3_8b", "trace=chat", "trace.n_sessions=60",
      "arrivals.session_rate=4", "engine=timed", "cache.size_gb=0.5",
      "engine.running_memory_gb=0.5", "engine.kv_pool=shared", "engine.preemption=sglang",
      "engine.request_admission=sglang"]),
]  # fmt: skip

#: The matrix ``write`` runs: (stable case name, Hydra overrides).
CASES: list[Case] = [*policy_cases(), *FIXED_CASES, *offline_cases()]


# ---------------------------------------------------------------------------------------- write


def default_data_dir() -> Path | None:
    """``$SIMLAB_DATA_DIR``, else ``../shared/data`` beside this checkout or its main worktree."""
    if os.environ.get("SIMLAB_DATA_DIR"):
        return Path(os.environ["SIMLAB_DATA_DIR"]).expanduser().resolve()
    candidates = [ROOT.parent / "shared" / "data"]
    common = git(["rev-parse", "--path-format=absolute", "--git-common-dir"])
    if common:
        candidates.append(Path(common).parent.parent / "shared" / "data")
    return next((path for path in candidates if path.is_dir()), None)


def git(args: list[str]) -> str:
    """Output of a git command in this checkout ('' when git fails)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()


def code_origin() -> dict[str, str]:
    """Where the simulator packages were imported from; raises if not from this checkout."""
    import policies
    import simlab
    import traces

    origin = {
        mod.__name__: str(Path(mod.__file__ or "").resolve()) for mod in (simlab, policies, traces)
    }
    strays = {name: path for name, path in origin.items() if not Path(path).is_relative_to(ROOT)}
    if strays:
        raise ForeignCodeError(
            f"packages imported from outside {ROOT}: {strays}; run `python -m bench.identity` "
            "with the checkout as the current directory"
        )
    return origin


@contextmanager
def trace_cache(directory: Path | None) -> Iterator[Path]:
    """Point ``$SIMLAB_CACHE_DIR`` at ``directory`` (or a fresh temporary one) while running."""
    previous = os.environ.get("SIMLAB_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="identity-trace-cache-") as fresh:
        chosen = directory if directory is not None else Path(fresh)
        os.environ["SIMLAB_CACHE_DIR"] = str(chosen)
        try:
            yield chosen
        finally:
            if previous is None:
                os.environ.pop("SIMLAB_CACHE_DIR", None)
            else:
                os.environ["SIMLAB_CACHE_DIR"] = previous


def run_case(overrides: list[str], out_dir: Path, data_dir: Path | None) -> None:
    """Compose the config for one case and simulate it into ``out_dir`` (emptied first: a
    case's earlier records are this bench's own output, and the simulator refuses to write
    over results of other code)."""
    from hydra import compose, initialize_config_dir

    from simlab.run.simulate import simulate

    shutil.rmtree(out_dir, ignore_errors=True)

    extra = [f"data_dir={data_dir}"] if data_dir is not None else []
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[*overrides, *extra, "report=false", f"output_dir={out_dir}"],
        )
    simulate(cfg)


def write(
    out_root: Path,
    data_dir: Path | None,
    cache_dir: Path | None = None,
    only: list[str] | None = None,
    extra: list[str] | None = None,
) -> dict[str, Any]:
    """Run every case (or those named in ``only``) into ``out_root``, with the ``extra``
    overrides after each case's own (e.g. ``cache.compiled=true``); returns the manifest."""
    from traces.paths import DataFileMissingError

    manifest: dict[str, Any] = {
        "root": str(ROOT),
        "git_head": git(["rev-parse", "HEAD"]),
        "git_dirty": bool(git(["status", "--porcelain", "--untracked-files=no"])),
        "modules": code_origin(),
        "data_dir": str(data_dir),
        "extra_overrides": list(extra or ()),
        "cases": {},
        "skipped": {},
    }
    log.info("code from %s (HEAD %s)", ROOT, manifest["git_head"][:12])
    started = time.perf_counter()
    with trace_cache(cache_dir):
        for name, overrides in CASES:
            if only and name not in only:
                continue
            t0 = time.perf_counter()
            try:
                run_case([*overrides, *(extra or ())], out_root / name, data_dir)
            except DataFileMissingError as err:
                log.warning("%s skipped: data file missing (%s)", name, err)
                manifest["skipped"][name] = str(err)
                continue
            elapsed = time.perf_counter() - t0
            manifest["cases"][name] = {"overrides": overrides, "elapsed_s": round(elapsed, 2)}
            log.info("%-48s %6.1f s", name, elapsed)
    manifest["total_s"] = round(time.perf_counter() - started, 1)
    log.info("all cases in %.1f s", manifest["total_s"])
    (out_root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


# -------------------------------------------------------------------------------------- compare


def is_wall_key(key: str) -> bool:
    return key in WALL_KEYS or key.endswith("_wall_s")


def strip_wall(value: Any) -> Any:
    """``value`` with wall-clock keys removed at every nesting level."""
    if isinstance(value, dict):
        return {k: strip_wall(v) for k, v in value.items() if not is_wall_key(str(k))}
    if isinstance(value, list):
        return [strip_wall(v) for v in value]
    return value


def json_diffs(a: Any, b: Any, path: str = "") -> Iterator[str]:
    """Paths where two JSON values differ (NaN equals NaN; ints and floats compare by value)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in a or key not in b:
                yield f"{where}: only in {'B' if key not in a else 'A'}"
            else:
                yield from json_diffs(a[key], b[key], where)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield f"{path}: length {len(a)} != {len(b)}"
        for index, (x, y) in enumerate(zip(a, b, strict=False)):
            yield from json_diffs(x, y, f"{path}[{index}]")
    elif not same_scalar(a, b):
        yield f"{path}: {a!r} != {b!r}"


def same_scalar(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def summary_diffs(path_a: Path, path_b: Path) -> list[str]:
    """Differences of the compared sections of two ``summary.json`` files."""
    a, b = json.loads(path_a.read_text()), json.loads(path_b.read_text())
    return [
        f"summary.json {diff}"
        for section in SUMMARY_SECTIONS
        for diff in json_diffs(strip_wall(a.get(section)), strip_wall(b.get(section)), section)
    ]


def frame_diffs(path_a: Path, path_b: Path, accept_added: bool = False) -> list[str]:
    """Why two parquet files with different bytes differ (``accept_added``: B's added apart)."""
    import pandas as pd

    a, b = pd.read_parquet(path_a), pd.read_parquet(path_b)
    name = path_a.name
    added = accept_added and len(b.columns) > len(a.columns)
    b = without_added(a, b) if added else b
    if list(a.columns) != list(b.columns):
        return [f"{name}: columns {list(a.columns)} != {list(b.columns)}"]
    if len(a) != len(b):
        return [f"{name}: {len(a)} rows != {len(b)} rows"]
    out = []
    for column in a.columns:
        if a[column].dtype != b[column].dtype:
            out.append(f"{name}: column {column} dtype {a[column].dtype} != {b[column].dtype}")
            continue
        left, right = a[column], b[column]
        differ = ~((left == right) | (left.isna() & right.isna()))
        if differ.any():
            rows = list(differ[differ].index[:MAX_REPORTED])
            sample = ", ".join(f"row {r}: {plain(left[r])!r} != {plain(right[r])!r}" for r in rows)
            out.append(f"{name}: column {column} differs in {int(differ.sum())} rows ({sample})")
    if not out and not added:
        out.append(f"{name}: bytes differ but the loaded frames are equal (file metadata?)")
    return out


def plain(value: Any) -> Any:
    """A numpy scalar as the Python value (for readable reports)."""
    item = getattr(value, "item", None)
    return item() if callable(item) else value


def case_diffs(dir_a: Path, dir_b: Path, accept_added: bool = False) -> list[str]:
    """Every difference between one case's outputs in two directories (empty: identical);
    ``accept_added``: B's added columns and keys are none (:mod:`bench.identity_added`)."""
    if not dir_b.is_dir():
        return [f"missing in {dir_b.parent}"]
    diffs: list[str] = []
    for filename in (*OUTPUT_FILES, "summary.json"):
        if not (dir_b / filename).is_file():
            diffs.append(f"{filename} missing in B")
        elif not (dir_a / filename).is_file():
            diffs.append(f"{filename} missing in A")
    if diffs:
        return diffs
    for filename in OUTPUT_FILES:
        if (dir_a / filename).read_bytes() != (dir_b / filename).read_bytes():
            diffs.extend(frame_diffs(dir_a / filename, dir_b / filename, accept_added))
    summary = summary_diffs(dir_a / "summary.json", dir_b / "summary.json")
    diffs.extend(d for d in summary if not (accept_added and is_added(d)))
    return diffs


def case_dirs(root: Path) -> list[str]:
    """Names of the case directories written under ``root`` (those holding a summary.json)."""
    return sorted(path.parent.name for path in root.glob("*/summary.json"))


def compare(dir_a: Path, dir_b: Path, accept_added: bool = False) -> dict[str, list[str]]:
    """Differences per case present in ``dir_a`` (``accept_added``: see :func:`case_diffs`)."""
    return {name: case_diffs(dir_a / name, dir_b / name, accept_added) for name in case_dirs(dir_a)}


# ------------------------------------------------------------------------------------------ CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    write_cmd = commands.add_parser("write", help="run every case into OUTDIR")
    write_cmd.add_argument("outdir", type=Path)
    write_cmd.add_argument("--data-dir", type=Path, default=None)
    write_cmd.add_argument("--trace-cache", type=Path, default=None)
    write_cmd.add_argument("--only", nargs="*", help="run only these case names")
    write_cmd.add_argument("--overwrite", action="store_true", help="write into a non-empty OUTDIR")
    write_cmd.add_argument(
        "--override",
        action="append",
        default=[],
        help="an override added to every case (repeatable), e.g. cache.compiled=true",
    )
    compare_cmd = commands.add_parser("compare", help="compare the cases of DIR_A with DIR_B")
    compare_cmd.add_argument("dir_a", type=Path)
    compare_cmd.add_argument("dir_b", type=Path)
    added = "columns and summary keys only DIR_B has are listed, not counted as differences"
    compare_cmd.add_argument("--accept-added", action="store_true", help=added)
    commands.add_parser("list", help="print the case names and overrides")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)

    if args.command == "list":
        return cmd_list()
    if args.command == "write":
        return cmd_write(
            args.outdir, args.data_dir, args.trace_cache, args.only, args.overwrite, args.override
        )
    return cmd_compare(args.dir_a, args.dir_b, args.accept_added)


def cmd_list() -> int:
    for name, overrides in CASES:
        print(f"{name:48s} {' '.join(overrides)}")
    return 0


def cmd_write(
    outdir: Path,
    data_dir: Path | None,
    cache: Path | None,
    only: list[str] | None,
    overwrite: bool,
    extra: list[str] | None = None,
) -> int:
    unknown = sorted(set(only or ()) - {name for name, _ in CASES})
    if unknown:
        print(f"unknown case names: {unknown} (see `python -m bench.identity list`)")
        return 2
    if outdir.is_dir() and any(outdir.iterdir()) and not overwrite:
        print(f"{outdir} is not empty: choose a fresh directory (or --overwrite)")
        return 2
    data = data_dir.resolve() if data_dir else default_data_dir()
    try:
        manifest = write(outdir.resolve(), data, cache, only, extra)
    except ForeignCodeError as err:
        print(err)
        return 2
    print(
        f"{len(manifest['cases'])} cases written to {outdir} in {manifest['total_s']} s"
        f" ({len(manifest['skipped'])} skipped) by the code in {manifest['root']}"
        f" (HEAD {manifest['git_head'][:12]}{' + uncommitted changes' * manifest['git_dirty']})"
    )
    return 0


def cmd_compare(dir_a: Path, dir_b: Path, accept_added: bool = False) -> int:
    results = compare(dir_a, dir_b, accept_added)
    if not results:
        print(f"no cases found in {dir_a}")
        return 1
    for name, diffs in results.items():
        print(f"{name:48s} {'DIFFERENT' if diffs else 'identical'}")
        for diff in diffs:
            print(f"    {diff}")
    if accept_added:
        print_added(dir_a, dir_b, results, OUTPUT_FILES, summary_diffs)
    extra = sorted(set(case_dirs(dir_b)) - set(results))
    if extra:
        print(f"(cases only in {dir_b}, not compared: {', '.join(extra)})")
    differing = sum(1 for diffs in results.values() if diffs)
    print(f"{len(results) - differing}/{len(results)} cases identical")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
