#!/usr/bin/env bash
# A TGI environment for the TGI adapter's tests (`make tgi-env`), outside the repo and
# cached between runs: TGI v3.3.7's Python server from the wheel in $TGI_WHEELS,
# installed under its own CPU constraints (torch 2.7.0 + IPEX 2.7.0, about 6 GB, about
# 5 minutes cold), then this checkout installed into it as a user would: a normal
# (non-editable) pip install under the same constraints, so that none of TGI's pins
# moves and the wheel's accel_plugin_tgi.pth activation file is installed.
#
# Without the wheel (a user's machine) it prints why and exits 0: the TGI tests skip
# (in CI too: integration/required_suites.py requires them only where the wheel is).
# With the wheel it succeeds only with an environment that has TGI, IPEX and this
# checkout; anything less (the constraints file missing, an install that failed, a
# broken cached environment) exits 1 naming what is missing, so CI cannot go on to a
# run where every TGI test skips.
set -euo pipefail
WHEELS=${TGI_WHEELS:-../shared/wheels}
VENV=${TGI_VENV:-$HOME/.cache/accel-plugin/venvs/tgi-3.3.7}
PYTHON=${TGI_BASE_PYTHON:-python3.11}
WHEEL="$WHEELS/text_generation_server-2.0.5.dev0-py3-none-any.whl"
CONSTRAINTS="$WHEELS/tgi-3.3.7-cpu-constraints.txt"

if [ -f "$WHEEL" ] && [ ! -f "$CONSTRAINTS" ]; then
    echo "tgi-env: the TGI wheel is in $WHEELS but its constraints file $(basename "$CONSTRAINTS") is not;" \
         "cannot build TGI's environment" >&2
    exit 1
fi
if [ ! -f "$WHEEL" ]; then
    if [ -x "$VENV/bin/python" ]; then
        # a TGI environment built before: it must run this checkout, not an older one
        echo "tgi-env: no TGI wheel in $WHEELS; reinstalling this checkout into the existing $VENV"
        "$VENV/bin/pip" install --quiet .
        exit 0
    fi
    echo "tgi-env: no TGI wheel in $WHEELS: the TGI tests will skip"
    exit 0
fi
WHEEL=$(realpath "$WHEEL"); CONSTRAINTS=$(realpath "$CONSTRAINTS")
key=$(cat "$WHEEL" "$CONSTRAINTS" | sha256sum | cut -c1-16)
stamp="$VENV/.accel-tgi-stamp"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$key" ]; then
    echo "tgi-env: installing TGI v3.3.7 (CPU) into $VENV (about 5 minutes, 6 GB)"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet -c "$CONSTRAINTS" torch==2.7.0 intel-extension-for-pytorch==2.7.0 \
        "text-generation-server[accelerate,compressed-tensors,peft,outlines] @ file://$WHEEL"
    echo "$key" > "$stamp"
fi
# this checkout, as a user installs it next to TGI (TGI's pins are constraints: they must hold)
# (a local folder is always rebuilt and reinstalled; its dependencies must already fit)
"$VENV/bin/pip" install --quiet -c "$CONSTRAINTS" .
"$VENV/bin/pip" check >/dev/null || { "$VENV/bin/pip" check; exit 1; }
# what the TGI tests need (integration/test_tgi_attention.py): a failure here must stop make
if ! versions=$("$VENV/bin/python" -c 'import importlib.util as u, torch, triton
missing = [m for m in ("text_generation_server", "intel_extension_for_pytorch", "accel_plugin") if u.find_spec(m) is None]
assert not missing, f"missing: {missing}"
print(f"torch {torch.__version__}, triton {triton.__version__}")'); then
    echo "tgi-env: $VENV/bin/python lacks what the TGI tests need (above); remove $VENV to rebuild it" >&2
    exit 1
fi
echo "tgi-env: $VENV/bin/python ($versions)"
