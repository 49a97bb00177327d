"""Benchmark: what the TGI activation file costs every Python process of an environment.

    .venv/bin/python -m benchmarks.startup_overhead                 # the TGI environment if built, else this Python
    .venv/bin/python -m benchmarks.startup_overhead --runs 50 --python ~/.cache/accel-plugin/venvs/tgi-3.3.7/bin/python
    .venv/bin/python -m benchmarks.startup_overhead --no-scratch    # only the interpreter given

``accel_plugin_tgi.pth`` runs in every interpreter of the environment it is installed
in (adapters/tgi/_startup.py). This times a bare ``python -c pass``, wall clock of the
whole process, ``--runs`` times per row, the rows taken in turn (each round in a
rotated order), so that every row sees the same machine load:

1. in ``--python`` (default ``$ACCEL_TGI_PYTHON``, else the TGI environment of
   ``make tgi-env`` if it exists, else this interpreter), whose site-packages holds
   the ``.pth`` file or not (the header says which): ``ACCEL_*`` unset, and
   ``ACCEL_ATTENTION_BACKEND`` and ``ACCEL_DRAFT_CONFIG`` set; then, as a yardstick,
   ``python -c "import accel_plugin.adapters.tgi"``, which is what every process of
   the environment paid with a variable set before the trigger (the old line imported
   the adapter, accel_plugin and pluggy);
2. in a scratch venv made from the same interpreter (``python -m venv
   --without-pip``, removed afterwards): without the ``.pth`` file, and with this
   checkout's line, variables unset and set.

Each row also says what the process had imported at its end (any ``accel_plugin``
module, ``pluggy``) and whether the trigger was waiting on ``sys.meta_path``.
Printed: median, interquartile range and p90 in milliseconds, and the median's
difference to the first row of its group.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

TGI_PYTHON = Path(os.environ.get("ACCEL_TGI_PYTHON", "~/.cache/accel-plugin/venvs/tgi-3.3.7/bin/python")).expanduser()
VARIABLES = {"ACCEL_ATTENTION_BACKEND": "flash", "ACCEL_DRAFT_CONFIG": "/srv/drafts.yaml"}
PROBE = (
    "import sys; "
    "print(int(any(m == 'accel_plugin' or m.startswith('accel_plugin.') for m in sys.modules)), "
    "int('pluggy' in sys.modules), "
    "int(any(type(f).__name__ == 'ImportTrigger' for f in sys.meta_path)))"
)


@dataclass
class Row:
    group: str
    pth: str
    variables: str
    python: str
    code: str
    env: dict
    seconds: list[float] = field(default_factory=list)
    probe: tuple[str, str, str] = ("?", "?", "?")


def _clean_env(set_variables: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_") and k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    if set_variables:
        env.update(VARIABLES)
    return env


def _purelib(python: str) -> Path:
    """``python``'s site-packages (``site`` must run: it is what sets a venv's prefix)."""
    out = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         env=_clean_env(False), check=True, capture_output=True, text=True, cwd="/").stdout
    return Path(out.strip())


def _probe(row: Row) -> tuple[str, str, str]:
    code = PROBE if row.code == "pass" else f"{row.code}; {PROBE}"
    proc = subprocess.run([row.python, "-c", code], env=row.env, check=False, capture_output=True, text=True, cwd="/")
    if proc.returncode != 0:
        raise SystemExit(f"{row.python} -c {code!r} failed:\n{proc.stderr}")
    accel, pluggy, trigger = proc.stdout.split()
    return ("yes" if accel == "1" else "no", "yes" if pluggy == "1" else "no", "yes" if trigger == "1" else "no")


def _time(rows: list[Row], runs: int) -> None:
    for r in range(runs):
        for i in range(len(rows)):
            row = rows[(i + r) % len(rows)]
            start = time.perf_counter()
            subprocess.run([row.python, "-c", row.code], env=row.env, check=True, cwd="/",
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            row.seconds.append(time.perf_counter() - start)


def _quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def format_table(rows: list[Row]) -> str:
    head = (f"{'environment':<24} {'.pth':<5} {'ACCEL_* variables':<18} {'command':<44} {'median ms':>9} "
            f"{'IQR ms':>13} {'p90 ms':>7} {'vs first':>9}  imported accel_plugin, pluggy  trigger waiting")
    lines = [head, "-" * len(head)]
    first: dict[str, float] = {}
    for row in rows:
        ms = [1e3 * s for s in row.seconds]
        median = statistics.median(ms)
        base = first.setdefault(row.group, median)
        command = "python -c pass" if row.code == "pass" else f"python -c \"{row.code}\""
        iqr = f"{_quantile(ms, 0.25):.1f}-{_quantile(ms, 0.75):.1f}"
        lines.append(f"{row.group:<24} {row.pth:<5} {row.variables:<18} {command:<44} {median:>9.1f} {iqr:>13} "
                     f"{_quantile(ms, 0.90):>7.1f} {median - base:>+9.1f}  {row.probe[0] + ', ' + row.probe[1]:<29} "
                     f"{row.probe[2]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.startup_overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--python", default=None,
                        help=f"the interpreter to time (default: $ACCEL_TGI_PYTHON or {TGI_PYTHON} if it exists, "
                             "else this one)")
    parser.add_argument("--runs", type=int, default=30, help="runs per row (default 30)")
    parser.add_argument("--no-scratch", action="store_true", help="skip the scratch venv (with and without the .pth)")
    args = parser.parse_args(argv)
    if args.runs < 4:
        parser.error(f"--runs must be at least 4 (quartiles need them); got {args.runs}")
    python = args.python or str(TGI_PYTHON if TGI_PYTHON.exists() else Path(sys.executable))
    if not Path(python).exists():
        parser.error(f"--python {python} does not exist")

    from accel_plugin.adapters.tgi._startup import PTH_LINE, PTH_NAME

    pth = _purelib(python) / PTH_NAME
    content = pth.read_text(encoding="utf-8") if pth.exists() else None
    state = "absent" if content is None else ("this checkout's line" if content == PTH_LINE else "another line")
    path = Path(python).absolute()
    group = (path.parents[1].name if path.parent.name == "bin" else path.name)[:24]
    rows = [
        Row(group, "yes" if content else "no", "unset", python, "pass", _clean_env(False)),
        Row(group, "yes" if content else "no", "both set", python, "pass", _clean_env(True)),
        Row(group, "yes" if content else "no", "unset", python, "import accel_plugin.adapters.tgi", _clean_env(False)),
    ]
    with tempfile.TemporaryDirectory(prefix="accel-startup-") as tmp:
        if not args.no_scratch:
            without, with_pth = Path(tmp) / "without-pth", Path(tmp) / "with-pth"
            for venv in (without, with_pth):
                subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True)
            site_dir = _purelib(str(with_pth / "bin" / "python"))
            if not site_dir.is_relative_to(with_pth):
                raise SystemExit(f"the scratch venv's site-packages is {site_dir}, outside {with_pth}: not writing there")
            (site_dir / PTH_NAME).write_text(PTH_LINE, encoding="utf-8")
            rows += [
                Row("scratch venv", "no", "both set", str(without / "bin" / "python"), "pass", _clean_env(True)),
                Row("scratch venv", "yes", "unset", str(with_pth / "bin" / "python"), "pass", _clean_env(False)),
                Row("scratch venv", "yes", "both set", str(with_pth / "bin" / "python"), "pass", _clean_env(True)),
            ]
        for row in rows:
            row.probe = _probe(row)
        _time(rows, args.runs)
        print(f"{python}: {PTH_NAME} {state} ({pth}); {args.runs} runs per row, rows in turn; "
              f"'both set': {' '.join(f'{k}={v}' for k, v in VARIABLES.items())}")
        print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
