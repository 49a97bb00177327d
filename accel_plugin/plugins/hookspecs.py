"""Every hook of accel-plugin, declared here and only here.

Plugins implement these with ``@accel_plugin.hookimpl``. Our own kernels, proposers
and adapters register through the same hooks as a third-party plugin would (see
:data:`accel_plugin.plugins.manager.DEFAULT_PLUGINS`). A third-party package exposes its
plugin module with an entry point in the group ``accel_plugin``::

    [project.entry-points.accel_plugin]
    my_kernels = "my_pkg.accel_hooks"

Each hook is documented for users in docs/hooks.md (a test checks it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .registry import BackendRegistry, BackendSpec, ProposerRegistry

PROJECT_NAME = "accel_plugin"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@dataclass(frozen=True)
class SelectionContext:
    """What a framework knows when it chooses an attention backend.

    Fields left as ``None`` are unknown at that point (e.g. ``accel doctor`` knows the
    device but not the model's head size).
    """

    framework: str
    device: str
    requested: str | None = None  #: the ACCEL_ATTENTION_BACKEND value (flash/paged/auto)
    dtype: str | None = None
    head_size: int | None = None
    block_size: int | None = None
    cuda_capability: tuple[int, int] | None = None
    features: tuple[str, ...] = ()


@dataclass
class AdapterComponents:
    """What an adapter should install into its framework, filled by plugins.

    ``attention_backends`` and ``proposers`` hold registry names, best first: the
    adapter installs those backends it has framework classes for, and drives the
    first proposer through the registry. ``notes`` are free text the adapter logs
    at DEBUG level when it loads.
    """

    framework: str
    attention_backends: list[str] = field(default_factory=list)
    proposers: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@hookspec
def accel_register_attention_backends(registry: BackendRegistry) -> None:
    """Add attention backends to ``registry`` (``registry.register(BackendSpec(...))``).

    Called once per plugin manager, when :func:`accel_plugin.plugins.manager.get_registries`
    first builds the registries. Return value is ignored. Registering a name that
    another plugin registered already raises ``DuplicateNameError``.
    """


@hookspec
def accel_register_proposers(registry: ProposerRegistry) -> None:
    """Add speculative-decoding proposers to ``registry`` (``ProposerSpec``).

    Called once per plugin manager, like ``accel_register_attention_backends``.
    """


@hookspec(firstresult=True)
def accel_select_attention_backend(
    context: SelectionContext, candidates: list[BackendSpec]
) -> str | None:
    """Choose the backend for ``ACCEL_ATTENTION_BACKEND=auto``.

    ``candidates`` are the registered backends whose capabilities accept ``context``,
    highest ``priority`` first. Return one candidate's name, or ``None`` to let the
    next plugin decide. firstresult: the first non-``None`` answer wins; when every
    plugin returns ``None`` the first candidate is used. Plugins registered later are
    asked first (pluggy's LIFO order), so a third-party plugin can override ours.
    """


@hookspec
def accel_adapter_components(components: AdapterComponents) -> None:
    """Tell an adapter what to install into ``components.framework`` ("vllm", "tgi").

    Called by an adapter when it is loaded by its framework. Append registry names
    to ``components.attention_backends`` / ``components.proposers``. Names must
    exist in the registries; the adapter raises ``UnknownNameError`` otherwise.
    """


@hookspec(firstresult=True)
def accel_demo_harness(framework: str) -> Callable[..., Any] | None:
    """The side-by-side runner behind ``accel demo`` for ``framework`` ("vllm").

    Implemented by a framework adapter's hook module (``accel_plugin.adapters.vllm.hooks``,
    loaded through its ``accel_plugin`` entry point), so the core never imports an
    adapter. Return a callable with the signature of
    ``accel_plugin.adapters.vllm.demo.run_side_by_side``, or ``None`` for another
    framework. firstresult: the first non-``None`` answer wins.
    """


@hookspec
def accel_doctor_report(environ: Mapping[str, str] | None) -> dict[str, Any] | None:
    """A framework adapter's section of the ``accel doctor`` report.

    Called once per ``accel doctor`` run (and by ``accel demo``'s doctor step), after the
    environment variables are reported, with the environment the doctor reports on
    (``None``: ``os.environ``). Implemented by a framework adapter's hook module
    (``accel_plugin.adapters.tgi.hooks``), so the core never imports an adapter. Return
    ``{section_key: data}`` (plain, JSON-serialisable data; e.g. ``{"tgi_adapter":
    {...}}``), added to the report under those keys, or ``None`` when the adapter has
    nothing to report (its framework is not installed). Every answer is used.
    """
