"""Self-test: run each kernel once on this machine against the float64 reference.

``accel doctor --self-test`` (and ``python -m accel_plugin.diagnostics.selftest``) runs a small
fixed grid of cases (:func:`default_cases`): the varlen flash prefill, the paged
kernel (decode, speculative verification and chunked prefill in one batch over a
shuffled block table, plus a long decode through split-K) and the KV-cache write,
for every supported dtype, with head sizes 64, 128 and 80, block sizes 16 and 32
and GQA ratios 1 and 4. Attention cases pass under the tests' accuracy rule
(:mod:`accel_plugin.kernels.tolerance`: twice torch's own error in the dtype plus
the derived floor); the cache write must be exact.

Where the cases run: compiled on CUDA tensors when torch sees a GPU; otherwise in
the Triton interpreter on CPU. Triton fixes the interpreter choice when the
kernels are imported, so when this process imported them without
``TRITON_INTERPRET=1`` (as ``accel doctor`` does, to report the real setting) the
cases run in a subprocess with it set, and the report says so.

Imports :mod:`accel_plugin.kernels` (torch and triton) and, for the matrix row,
:mod:`accel_plugin.diagnostics.compat_environment`; never a framework. This module is
the ``python -m`` entry; the cases, running them and the report live in
``selftest_cases``, ``selftest_run`` and ``selftest_report``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ..kernels import limits
from .selftest_cases import KERNELS
from .selftest_report import render
from .selftest_run import run_self_test

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """``python -m accel_plugin.diagnostics.selftest [--json]``: the self-test alone."""
    parser = argparse.ArgumentParser(prog="python -m accel_plugin.diagnostics.selftest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--kernel", action="append", choices=KERNELS, help="only this kernel (repeatable)")
    parser.add_argument("--dtype", action="append", choices=limits.DTYPE_NAMES, help="only this dtype (repeatable)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if torch sees a GPU)")
    parser.add_argument("--no-compatibility", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available() or args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
    report = run_self_test(args.device,kernels=tuple(args.kernel) if args.kernel else None,
                           dtypes=tuple(args.dtype) if args.dtype else None,
                           with_compatibility=not args.no_compatibility)
    data = report.to_dict()
    print(json.dumps(data, indent=2) if args.json else "\n".join(render(data)))
    return 0 if report.passed else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
