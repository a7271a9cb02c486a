"""Where the study reads its configs and what it writes into its output directory."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "configs"
MANIFEST = "paper.json"
DONE = "paper_done.json"
PAPER_MD = "paper.md"
PAPER_PDF = "paper.pdf"


def experiment_file(name: str) -> Path:
    return CONFIGS / "experiment" / f"{name}.yaml"
