"""accel_plugin.speculative (the package): its names load lazily, and the router and
the speedup maths load without torch."""

from __future__ import annotations

import json
import subprocess
import sys

import accel_plugin.speculative as speculative


def test_router_and_speedup_load_without_torch():
    code = ("import json, sys; import accel_plugin.speculative.router, accel_plugin.speculative.speedup; "
            "print(json.dumps(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_every_public_name_resolves_and_is_listed():
    for name in speculative.__all__:
        value = getattr(speculative, name)
        assert value.__name__ == name
        assert value.__module__.startswith("accel_plugin.speculative.")
    assert set(speculative.__all__) <= set(dir(speculative))


def test_an_unknown_name_is_an_attribute_error():
    try:
        speculative.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")
