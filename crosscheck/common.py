"""What every driver shares: the exported requests, capacities, the fixture files, the CLI.

Runs in ``.venv-crosscheck`` (NumPy only here; no simlab, no engine).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import logging
import math
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "crosscheck"
COLUMNS = ("position", "request_id", "input_len", "output_len", "hit_tokens")
GB = 1e9


@dataclass(frozen=True)
class Export:
    """The requests of one ``crosscheck.export`` file, in simlab's replay order."""

    path: Path
    request_id: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    input_ids: np.ndarray
    output_ids: np.ndarray
    input_offsets: np.ndarray
    output_offsets: np.ndarray
    overrides: list[str]
    model: str
    kv_bytes_per_token: int
    ssm_state_bytes: int

    @classmethod
    def load(cls, path: Path) -> Export:
        with np.load(path) as d:
            return cls(
                path=path,
                request_id=d["request_id"],
                input_len=d["input_len"],
                output_len=d["output_len"],
                input_ids=d["input_ids"],
                output_ids=d["output_ids"],
                input_offsets=d["input_offsets"],
                output_offsets=d["output_offsets"],
                overrides=[str(o) for o in d["overrides"]],
                model=str(d["model"]),
                kv_bytes_per_token=int(d["kv_bytes_per_token"]),
                ssm_state_bytes=int(d["ssm_state_bytes"]),
            )

    def __len__(self) -> int:
        return len(self.request_id)

    def requests(self) -> Iterator[tuple[list[int], list[int]]]:
        """``(input token ids, output token ids)`` per request, as Python ints."""
        for i in range(len(self)):
            a, b = self.input_offsets[i], self.input_offsets[i + 1]
            c, d = self.output_offsets[i], self.output_offsets[i + 1]
            yield self.input_ids[a:b].tolist(), self.output_ids[c:d].tolist()

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens of all requests: an upper bound of any cache's content."""
        return int(self.input_len.sum() + self.output_len.sum())

    @property
    def max_sequence(self) -> int:
        return int((self.input_len + self.output_len).max())


def parse_size(text: str) -> float:
    """A ``--size-gb`` value: a number of GB or ``inf``."""
    return math.inf if text == "inf" else float(text)


def size_label(size_gb: float) -> str:
    """``inf``, ``2``, ``0.5``: the size as it appears in case names and the manifest."""
    if math.isinf(size_gb):
        return "inf"
    return str(int(size_gb)) if float(size_gb).is_integer() else str(size_gb)


def manifest_size(size_gb: float) -> float | int | str:
    return "inf" if math.isinf(size_gb) else (int(size_gb) if size_gb.is_integer() else size_gb)


def capacity_tokens(size_gb: float, kv_bytes_per_token: int, export: Export) -> int:
    """KV tokens in ``size_gb`` (``floor(size_gb·1e9 / kv_bytes_per_token)``); ``inf`` gives a
    pool larger than the whole trace (every input and output token, plus one sequence)."""
    if math.isinf(size_gb):
        return export.total_tokens + export.max_sequence + 1
    return math.floor(size_gb * GB / kv_bytes_per_token)


def versions() -> dict[str, str]:
    """Installed versions of the engines and torch."""
    out = {}
    for name in ("torch", "sglang", "vllm"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def write_case(
    case: dict[str, Any], export: Export, hits: list[int], fixtures: Path = FIXTURES
) -> dict[str, Any]:
    """Write ``case``'s CSV (every request's hit tokens) and put its entry into
    ``manifest.json`` (replacing one of the same name); returns the completed entry."""
    entry = write_table(case, export, len(export), {"hit_tokens": hits}, fixtures)
    entry.pop("hit_rate")
    return entry


def write_table(
    case: dict[str, Any],
    export: Export,
    n: int,
    columns: dict[str, list[Any]],
    fixtures: Path,
) -> dict[str, Any]:
    """Write ``case``'s CSV, the first ``n`` requests' ids and lengths then ``columns`` (one
    of them ``hit_tokens``), and put its entry into ``fixtures/manifest.json`` (replacing one
    of the same name); returns the completed entry, with the token hit rate."""
    fixtures.mkdir(parents=True, exist_ok=True)
    file = f"{case['case']}.csv"
    with (fixtures / file).open("w", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow((*COLUMNS[:-1], *columns))
        for pos in range(n):
            ids = (pos, export.request_id[pos], export.input_len[pos], export.output_len[pos])
            writer.writerow((*ids, *(column[pos] for column in columns.values())))
    hits = int(sum(columns["hit_tokens"]))
    entry = {
        "case": case["case"],
        "file": file,
        **{k: v for k, v in case.items() if k != "case"},
        "overrides": export.overrides,
        "requests": n,
        "hit_tokens_total": hits,
        "command": command(),
    }
    manifest_path = fixtures / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"cases": []}
    cases = [c for c in manifest["cases"] if c["case"] != entry["case"]] + [entry]
    manifest = {
        "generated": {**versions(), "date": dt.date.today().isoformat()},
        "cases": sorted(cases, key=lambda c: c["case"]),
    }
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return entry | {"hit_rate": hits / int(export.input_len[:n].sum())}


def command() -> str:
    """The driver's command line, as run from the repository root."""
    module = f"crosscheck.{Path(sys.argv[0]).stem}"
    return shlex.join([".venv-crosscheck/bin/python", "-m", module, *sys.argv[1:]])


def base_parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The options every driver takes."""
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    parser.add_argument("--export", type=Path, required=True, help="crosscheck.export's .npz")
    parser.add_argument("--name", required=True, help="case-name prefix, e.g. sharegpt_llama3_8b")
    parser.add_argument(
        "--size-gb", type=parse_size, nargs="+", default=[math.inf], help="GB each, or inf"
    )
    parser.add_argument("--fixtures", type=Path, default=FIXTURES)
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def run_case(
    case: dict[str, Any],
    export: Export,
    replay: Callable[[], list[int]],
    fixtures: Path,
) -> list[int]:
    """Run one driver case, write its fixture, print the one-line summary; returns the hits."""
    start = time.perf_counter()
    hits = replay()
    elapsed = time.perf_counter() - start
    entry = write_case(case, export, hits, fixtures)
    rate = entry["hit_tokens_total"] / int(export.input_len.sum())
    print(f"{entry['case']}: {len(hits)} requests, token hit rate {rate:.4f}, {elapsed:.1f} s")  # noqa: T201
    return hits


def replay_each(
    request: Callable[[list[int], list[int]], int], requests: Iterable[tuple[list[int], list[int]]]
) -> list[int]:
    """Hit tokens of every ``(input_ids, output_ids)``, run one after the other by ``request``."""
    hits = []
    for i, (inp, out) in enumerate(requests):
        hits.append(request(inp, out))
        if i % 200 == 0:
            log.info("request %d: hit %d / %d", i, hits[-1], len(inp))
    return hits


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
