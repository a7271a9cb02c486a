"""Import-time stand-ins for two packages the engines' cache code never uses.

* ``torchvision``: PyPI's wheels are built against CUDA torch, and with the CPU torch 2.13.0 they
  fail to load (``operator torchvision::nms does not exist``). Only SGLang's multimodal configs
  import it, at module level, through ``sglang.srt.configs``.
* ``datasets``: imported only by ``sglang.benchmark``, which SGLang's test kit (the hybrid
  fixture builder of ``crosscheck.sglang_mamba``) pulls in.

:func:`install` first lets ``transformers`` cache that torchvision is absent (so it never takes
the vision code paths), then serves any ``torchvision.*`` / ``datasets.*`` import with a module
whose every attribute is an inert placeholder. Nothing on the cache code paths touches one.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

STUBBED = ("torchvision", "datasets")


class _AnyMeta(type):
    """Placeholder classes: any attribute is another placeholder class."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _AnyMeta(name, (), {})


class _StubModule(types.ModuleType):
    """A module whose missing attributes are placeholder classes."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _AnyMeta(name, (), {})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves every module under :data:`STUBBED` as a :class:`_StubModule` package."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.split(".")[0] not in STUBBED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install() -> None:
    """Install the stand-ins (idempotent); call before importing sglang or vllm."""
    if any(isinstance(f, _StubFinder) for f in sys.meta_path):
        return
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()  # cached False before the stub exists
    sys.meta_path.insert(0, _StubFinder())
