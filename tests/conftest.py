"""Unit tests run on CPU: Triton kernels through the interpreter.

TRITON_INTERPRET is read when a kernel module is imported, so it is set here, before
any test module imports accel_plugin.kernels. Set TRITON_INTERPRET=0 explicitly to
compile kernels on a GPU machine.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import importlib  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

import pytest  # noqa: E402

THIRD_PARTY_SOURCE = '''
"""A third-party accel plugin, as another package would ship it."""
from accel_plugin import BackendSpec, Capabilities, hookimpl

@hookimpl
def accel_register_attention_backends(registry):
    registry.register(BackendSpec(
        name="THIRD_PARTY_ATTN",
        class_path="collections:OrderedDict",
        capabilities=Capabilities(devices=("cuda",)),
        description="registered by a third-party plugin",
        priority=100,
    ))
'''


def install_fake_distribution(root, dist_name, module_name, source, entry_points):
    """Write a module plus a real ``*.dist-info`` (METADATA, entry_points.txt) under ``root``.

    ``importlib.metadata`` then finds the distribution and its entry points exactly
    as it finds a pip-installed package, once ``root`` is on sys.path.
    """
    (root / f"{module_name}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist_name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    return root


@pytest.fixture
def plugin_distribution(tmp_path, monkeypatch):
    """Factory: ``plugin_distribution(module_name, source, ep_name)`` installs a plugin
    module with a real ``accel_plugin`` entry point on a temporary sys.path entry and
    returns that folder (for PYTHONPATH of subprocesses)."""
    created = []

    def make(module_name: str, source: str, ep_name: str):
        root = tmp_path / module_name
        root.mkdir()
        install_fake_distribution(
            root, module_name.replace("_", "-"), module_name, source,
            f"[accel_plugin]\n{ep_name} = {module_name}\n",
        )
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()
        created.append(module_name)
        return root

    yield make
    for name in created:
        sys.modules.pop(name, None)


@pytest.fixture
def third_party_plugin(plugin_distribution):
    """A third-party plugin registering backend THIRD_PARTY_ATTN (CUDA only)."""
    return plugin_distribution("third_party_accel", THIRD_PARTY_SOURCE, "third_party")
