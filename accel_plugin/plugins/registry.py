"""Attention backends and speculative proposers, described as data.

A backend or proposer is registered as a frozen spec: a name, the dotted path of
the class that implements it (imported only when asked for), and what it supports.
Whether a backend can run in a given setting is decided once, by
:meth:`Capabilities.check`, which returns readable reasons instead of a bare bool.

Registries are filled through the hooks in :mod:`accel_plugin.plugins.hookspecs`; our own
backends and proposers use the same hooks as a third-party plugin would.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = [
    "BackendRegistry",
    "BackendSpec",
    "Capabilities",
    "DuplicateNameError",
    "ProposerRegistry",
    "ProposerSpec",
    "UnknownNameError",
    "import_object",
]

class UnknownNameError(KeyError):
    """A backend or proposer name that no plugin registered."""

    def __init__(self, kind: str, name: str, known: list[str]):
        self.kind, self.name, self.known = kind, name, known
        super().__init__(name)

    def __str__(self) -> str:
        known = ", ".join(self.known) if self.known else "(none registered)"
        return f"unknown {self.kind} {self.name!r}; known {self.kind}s: {known}"


class DuplicateNameError(ValueError):
    """Two plugins registered the same name."""


def import_object(path: str) -> object:
    """Import ``"pkg.module:Attr"`` (or ``"pkg.module.Attr"``) and return the attribute."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"class path must look like 'package.module:Class'; got {path!r}")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"module {module_name!r} has no attribute {attr!r} (from {path!r})") from None


@dataclass(frozen=True)
class Capabilities:
    """What an attention backend supports; a backend declares its own numbers.

    ``dtypes`` are torch dtype names (``"bfloat16"``); ``block_sizes`` lists the
    KV-cache block sizes (tokens per block) it accepts; ``min_cuda_capability`` is
    ``(major, minor)``. A field left as ``None`` declares no restriction.
    ``features`` names optional abilities, e.g. ``prefix_caching``,
    ``chunked_prefill``, ``spec_decode``, ``sliding_window``, ``softcap``.
    """

    dtypes: tuple[str, ...] | None = None
    head_sizes: tuple[int, ...] | None = None
    block_sizes: tuple[int, ...] | None = None
    devices: tuple[str, ...] | None = None
    min_cuda_capability: tuple[int, int] | None = None
    features: frozenset[str] = field(default_factory=frozenset)

    def check(
        self,
        *,
        device: str | None = None,
        dtype: str | None = None,
        head_size: int | None = None,
        block_size: int | None = None,
        cuda_capability: tuple[int, int] | None = None,
        features: tuple[str, ...] = (),
    ) -> list[str]:
        """Reasons why this backend cannot run with the given settings ([] = it can).

        Arguments left as ``None`` are not checked.
        """
        reasons: list[str] = []
        if device is not None and self.devices is not None and device not in self.devices:
            reasons.append(f"device {device!r} not supported (supported: {', '.join(self.devices)})")
        if dtype is not None and self.dtypes is not None:
            name = str(dtype).removeprefix("torch.")
            if name not in self.dtypes:
                reasons.append(f"dtype {name} not supported (supported: {', '.join(self.dtypes)})")
        if head_size is not None and self.head_sizes is not None and head_size not in self.head_sizes:
            sizes = ", ".join(map(str, self.head_sizes))
            reasons.append(f"head size {head_size} not supported (supported: {sizes})")
        if block_size is not None and self.block_sizes is not None and block_size not in self.block_sizes:
            sizes = ", ".join(map(str, self.block_sizes))
            reasons.append(f"block size {block_size} not supported (supported: {sizes})")
        if (
            device == "cuda"
            and cuda_capability is not None
            and self.min_cuda_capability is not None
            and tuple(cuda_capability) < tuple(self.min_cuda_capability)
        ):
            have = ".".join(map(str, cuda_capability))
            need = ".".join(map(str, self.min_cuda_capability))
            reasons.append(f"CUDA capability {have} is below the required {need}")
        for feature in features:
            if feature not in self.features:
                reasons.append(f"feature {feature!r} not supported")
        return reasons


@dataclass(frozen=True)
class BackendSpec:
    """An attention backend: ``class_path`` names a framework-neutral implementation."""

    name: str
    class_path: str
    capabilities: Capabilities = field(default_factory=Capabilities)
    description: str = ""
    priority: int = 0  #: higher wins when ACCEL_ATTENTION_BACKEND=auto

    def load(self) -> type:
        return import_object(self.class_path)  # type: ignore[return-value]


@dataclass(frozen=True)
class ProposerSpec:
    """A speculative-decoding proposer.

    ``class_path`` names the framework-neutral implementation (for our own,
    :class:`accel_plugin.speculative.DomainProposer`); ``frameworks`` lists the
    frameworks whose adapters can drive it. An adapter resolves the proposer by
    name through the registry and wraps it in its framework's proposer interface.
    """

    name: str
    class_path: str
    description: str = ""
    frameworks: tuple[str, ...] = ("vllm",)

    def load(self) -> type:
        return import_object(self.class_path)  # type: ignore[return-value]


S = TypeVar("S", BackendSpec, ProposerSpec)


class _Registry(Generic[S]):
    kind = "entry"

    def __init__(self) -> None:
        self._specs: dict[str, S] = {}

    def register(self, spec: S) -> S:
        """Add ``spec``; a name registered twice raises :class:`DuplicateNameError`."""
        if spec.name in self._specs:
            raise DuplicateNameError(
                f"{self.kind} {spec.name!r} is registered twice; "
                f"one of the plugins must use another name (see `accel doctor`)"
            )
        self._specs[spec.name] = spec
        return spec

    def get(self, name: str) -> S:
        try:
            return self._specs[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self.names()) from None

    def names(self) -> list[str]:
        return list(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[S]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)


class BackendRegistry(_Registry[BackendSpec]):
    kind = "attention backend"


class ProposerRegistry(_Registry[ProposerSpec]):
    kind = "proposer"
