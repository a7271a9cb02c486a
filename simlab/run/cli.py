"""The command lines' shared front: user errors as one line, unknown config choices and unusable
launchers caught before Hydra starts, and Hydra's first composition skipped."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.util import find_spec
from pathlib import Path

from omegaconf import OmegaConf

from simlab.config import ConfigError
from traces.format import TraceFormatError
from traces.paths import TraceFileError

# ``hydra.run.dir`` is ``output_dir`` when one is given, so Hydra's own files (``.hydra/``, the
# log) go where the results go and nothing is written to ``./outputs`` (configs/config.yaml).
OmegaConf.register_new_resolver(
    "simlab_run_dir", lambda output_dir, default: output_dir or default, replace=True
)

#: Errors of the user's making: reported as one clear line, without a traceback.
USER_ERRORS = (ConfigError, TraceFileError, TraceFormatError, FileNotFoundError)


@contextmanager
def reported_as_one_line() -> Iterator[None]:
    """A user error becomes one line on stderr and exit status 2, Ctrl-C one line and 130
    (the shell's convention for SIGINT); neither prints a traceback."""
    try:
        yield
    except USER_ERRORS as err:
        print(f"simlab: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("simlab: interrupted", file=sys.stderr)
        raise SystemExit(130) from None


CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def unknown_choice(args: list[str]) -> str | None:
    """The first command-line override that picks a config file simlab does not have, as an
    error line (Hydra's own message is a multi-line search-path dump); None if all exist.
    Hydra's groups (``hydra/...``, launchers from plugins) and sweep expressions are left to
    Hydra."""
    for arg in args:
        key, sep, value = arg.lstrip("+~").partition("=")
        group = key.split("@")[0]
        if group == "compare":
            group, value = "policy", value.strip("[]")
        folder = CONFIGS / group
        if not sep or group.startswith("hydra") or not folder.is_dir() or "(" in value:
            continue
        options = sorted(p.stem for p in folder.glob("*.yaml"))
        for choice in value.split(","):
            if choice not in ("", "null") and choice not in options:
                return f"{group}: no config {choice!r} (available: {', '.join(options)})"
    return None


#: launcher -> (what it needs on this machine, the check, the advice)
LAUNCHER_NEEDS = {
    "slurm": ("srun (a SLURM cluster)", lambda: shutil.which("srun") is not None),
    "ray": ("the ray package (pip install -e '.[ray]')", lambda: find_spec("ray") is not None),
    "ray_local": (
        "the ray package (pip install -e '.[ray]')",
        lambda: find_spec("ray") is not None,
    ),
}


def unusable_launcher(args: list[str]) -> str | None:
    """``hydra/launcher=NAME`` whose prerequisites this machine lacks, as an error line (the
    launcher would fail with a traceback only once the sweep starts)."""
    for arg in args:
        key, _, value = arg.partition("=")
        if key.lstrip("+") == "hydra/launcher" and value in LAUNCHER_NEEDS:
            needs, present = LAUNCHER_NEEDS[value]
            if not present():
                return (
                    f"hydra/launcher={value}: needs {needs}, not found here; the default "
                    "launcher (joblib) runs a sweep on this machine"
                )
    return None


def standard_set() -> list[str]:
    """The policies ``python -m simlab`` compares by default (``configs/config.yaml``)."""
    config = OmegaConf.to_container(OmegaConf.load(CONFIGS / "config.yaml"))
    defaults = config.get("defaults", []) if isinstance(config, dict) else []
    entries = (key for entry in defaults if isinstance(entry, dict) for key in entry)
    return [key.split("@compare.")[1] for key in entries if key.startswith("policy@compare.")]


def expand_compare(args: list[str]) -> list[str]:
    """``compare=[vllm,sglang]`` picks the compared policy set: the standard set's entries not
    named are dropped and each other named policy config added under ``compare``, as Hydra's
    own overrides
    (``~policy@compare.NAME``, ``+policy@compare.NAME=NAME``). Other arguments pass unchanged; an
    unknown name is left for :func:`unknown_choice` to report."""
    out: list[str] = []
    for arg in args:
        key, sep, value = arg.partition("=")
        if key != "compare" or not sep:
            out.append(arg)
            continue
        names = [n.strip() for n in value.strip("[]").split(",") if n.strip()]
        standard = standard_set()
        out += [f"~policy@compare.{name}" for name in standard if name not in names]
        out += [f"+policy@compare.{name}={name}" for name in names if name not in standard]
    return out


def compose_once(args: list[str]) -> None:
    """Hydra 1.3 composes the whole config a first time only to read ``hydra.mode`` (0.1-0.15 s
    of a short run's start-up), then again to run. simlab's configs never set it
    (``tests/test_cli.py``), so unless the command line does, the mode is what Hydra falls
    back to without one: ``-m`` / ``--multirun`` runs a sweep, anything else one run."""
    if not any("hydra.mode" in arg for arg in args):
        from hydra._internal.hydra import Hydra

        Hydra.get_mode = lambda self, config_name, overrides: None  # type: ignore[method-assign]
