#!/usr/bin/env bash
# vLLM's suffix decoding for `accel demo`'s "suffix" peer (`make suffix-env`), cached
# outside the repo. vLLM 0.32's method "suffix" needs arctic-inference==0.1.1, which
# PyPI ships only as source here. Its package registers a `vllm.general_plugins` entry
# point that patches every vLLM process, and its build pins torch 2.7.0, so it is NOT
# pip-installed into .venv: this script builds only its C++ suffix tree
# (csrc/suffix_decoding, nanobind, C++20; about one CPU minute) from the PyPI sdist and
# stages `arctic_inference.suffix_decoding` in $SUFFIX_DIR without any dist-info (no
# entry point, no plugin). The demo puts that folder on the suffix worker's PYTHONPATH
# only (ACCEL_DEMO_SUFFIX_PATH). Idempotent: a staged build is reused. Prints the folder.
# Needs g++ (C++20), cmake and PyPI. Exits non-zero naming what failed; `make demo` then
# runs without the suffix peer and says why.
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
VERSION=0.1.1
SUFFIX_DIR=${SUFFIX_DIR:-$HOME/.cache/accel-plugin/arctic-inference-$VERSION}
PKG="$SUFFIX_DIR/arctic_inference/suffix_decoding"

if compgen -G "$PKG/_C*.so" > /dev/null; then
    echo "$SUFFIX_DIR"
    exit 0
fi
for tool in g++ cmake; do
    command -v "$tool" > /dev/null || { echo "suffix-env: $tool not found (needed to build arctic-inference's suffix tree)" >&2; exit 1; }
done
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "suffix-env: building arctic-inference $VERSION's suffix tree into $SUFFIX_DIR" >&2
"$PYTHON" -m pip download --quiet --no-deps --no-binary arctic-inference "arctic-inference==$VERSION" -d "$WORK" >&2
tar -xzf "$WORK/arctic_inference-$VERSION.tar.gz" -C "$WORK"
SRC="$WORK/arctic_inference-$VERSION"
"$PYTHON" -m pip install --quiet --target "$WORK/nb" "nanobind==2.9.2" >&2
PYTHONPATH="$WORK/nb" cmake -S "$SRC/csrc/suffix_decoding" -B "$WORK/build" \
    -DPython_EXECUTABLE="$(realpath "$PYTHON")" -DCMAKE_BUILD_TYPE=Release > "$WORK/cmake.log" 2>&1 \
    || { tail -20 "$WORK/cmake.log" >&2; echo "suffix-env: cmake configure failed" >&2; exit 1; }
cmake --build "$WORK/build" -j "${MAX_JOBS:-2}" >> "$WORK/cmake.log" 2>&1 \
    || { tail -20 "$WORK/cmake.log" >&2; echo "suffix-env: build failed" >&2; exit 1; }
mkdir -p "$PKG.tmp"
cp "$SRC"/arctic_inference/suffix_decoding/*.py "$PKG.tmp/"
cp "$WORK"/build/_C*.so "$PKG.tmp/"
: > "$SUFFIX_DIR/arctic_inference/__init__.py"
rm -rf "$PKG" && mv "$PKG.tmp" "$PKG"
PYTHONPATH="$SUFFIX_DIR" "$PYTHON" -c "from arctic_inference.suffix_decoding import SuffixDecodingCache" \
    || { echo "suffix-env: the staged module does not import" >&2; exit 1; }
echo "$SUFFIX_DIR"
