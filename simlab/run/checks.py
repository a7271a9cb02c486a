"""The checks of a run's settings against its model and trace, before any work: each names the
config key that fails (:class:`simlab.config.ConfigError`)."""

from __future__ import annotations

import inspect
import tempfile
import typing
from pathlib import Path

from hydra.utils import get_method
from omegaconf import DictConfig

from simlab.config import ConfigError, RunSettings
from simlab.model.spec import ModelSpec
from traces.format import Request


def page_tokens(settings: RunSettings, unit_tokens: int) -> int:
    """Tokens of the smallest KV page the cache can hold: ``cache.page_size`` in whole ids of
    ``unit_tokens`` tokens (a hash-id trace's id is a block: 512 tokens for Mooncake)."""
    return max(1, round(settings.cache.page_size / unit_tokens)) * unit_tokens


def check_capacity(settings: RunSettings, model: ModelSpec, unit_tokens: int = 1) -> None:
    """The cache must hold one KV page, plus one SSM checkpoint for a hybrid: a smaller one
    can never admit anything, and every hit rate would be a silent 0."""
    cache = settings.cache
    if cache.ssm_gb is not None:
        check_separate_pools(settings, model, unit_tokens)
        return
    need = page_tokens(settings, unit_tokens) * model.kv_bytes_per_token
    need += model.ssm_state_bytes if model.is_hybrid else 0
    if settings.cache.capacity_bytes < need:
        what = "one KV page plus one SSM checkpoint" if model.is_hybrid else "one KV page"
        raise ConfigError(
            f"cache.size_gb: smaller than {what} of {model.name} ({need / 1e9:.4g} GB), "
            f"so nothing could ever be cached (got {settings.cache.size_gb})"
        )


def check_separate_pools(settings: RunSettings, model: ModelSpec, unit_tokens: int = 1) -> None:
    """With ``cache.ssm_gb`` the model must have SSM states, the SSM pool must hold one and
    the KV pool one page."""
    cache = settings.cache
    if not model.is_hybrid:
        raise ConfigError(f"cache.ssm_gb: {model.name} has no SSM states; leave it null")
    if cache.ssm_bytes is not None and cache.ssm_bytes < model.ssm_state_bytes:
        raise ConfigError(
            f"cache.ssm_gb: smaller than one SSM state of {model.name} "
            f"({model.ssm_state_bytes / 1e9:.4g} GB), got {cache.ssm_gb}"
        )
    if cache.kv_bytes < page_tokens(settings, unit_tokens) * model.kv_bytes_per_token:
        raise ConfigError(
            f"cache.size_gb - cache.ssm_gb: the KV pool ({cache.kv_bytes / 1e9:.4g} GB) is "
            f"smaller than one KV page of {model.name}"
        )


def check_request_fits(settings: RunSettings, model: ModelSpec, requests: list[Request]) -> None:
    """With separate pools, the KV pool must hold the longest request: the engine could never
    run it (a shared budget only truncates what it caches)."""
    if settings.cache.ssm_gb is None or not requests:
        return
    longest = max(req.input_tokens + req.output_len for req in requests)
    if longest * model.kv_bytes_per_token > settings.cache.kv_bytes:
        raise ConfigError(
            f"cache.size_gb - cache.ssm_gb: the KV pool ({settings.cache.kv_bytes / 1e9:.4g} GB) "
            f"cannot hold the longest request ({longest} tokens, "
            f"{longest * model.kv_bytes_per_token / 1e9:.4g} GB)"
        )


def check_writable(out_dir: Path | None) -> None:
    """Fail before any work when results could not be written to ``out_dir``."""
    if out_dir is None:
        return
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as err:
        raise ConfigError(f"output_dir: cannot write to {out_dir} ({err.strerror or err})") from err


#: ``trace.*`` keys every loader takes that are not its parameters: ``name`` labels the results
TRACE_LABELS = frozenset({"_target_", "name"})


def check_loader_options(trace_cfg: DictConfig) -> None:
    """Each ``trace.*`` key must be a parameter of the loader (a misspelt ``+trace.limt=5``
    would be swallowed by its ``**_`` and the whole trace replayed), and each option typed
    ``int``, ``float`` or ``bool`` in its signature must be one (or null where the loader
    allows None): a loader's own ``int("abc")`` would name neither the key nor the value."""
    target = get_method(str(trace_cfg._target_))
    params = inspect.signature(target).parameters
    named = {p for p, spec in params.items() if spec.kind is not inspect.Parameter.VAR_KEYWORD}
    for key in trace_cfg:
        if str(key) not in named | TRACE_LABELS:
            raise ConfigError(
                f"trace.{key!s}: unknown key for {trace_cfg._target_} "
                f"(known: {', '.join(sorted(named))})"
            )
    hints = typing.get_type_hints(target)
    for key, value in trace_cfg.items():
        hint = hints.get(str(key))
        if hint is None or (value is None and type(None) in typing.get_args(hint)):
            continue
        kinds = {t for t in (*typing.get_args(hint), hint) if t in (int, float, bool)}
        if not kinds:
            continue
        numbers = tuple(kinds - {bool}) + ((int,) if float in kinds else ())
        ok = (
            isinstance(value, bool)
            if kinds == {bool}
            else (not isinstance(value, bool) and isinstance(value, numbers))
        )
        if not ok:
            wanted = " or ".join(sorted(k.__name__ for k in kinds))
            raise ConfigError(f"trace.{key!s}: must be {wanted} (got {value!r})")
