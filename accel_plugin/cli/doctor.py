"""Report what accel-plugin sees on this machine: library versions, the device and the CPU, how
the Triton kernels would run, every registered backend and proposer (supported or
refused, and why) and the effective environment variables.

``--self-test`` then runs each kernel once against its float64 reference (compiled
on a GPU, in the Triton interpreter on CPU) for every supported dtype and a few head
sizes, block sizes and GQA ratios, prints a pass/fail table with each error against
its tolerance and time, and says which row of the compatibility matrix this
environment matches and whether it was tested (accel_plugin/diagnostics/selftest.py).

Exit status: 0 when the configuration is usable, 1 when an environment variable is
invalid, the requested attention backend is refused on this machine, the draft YAML
does not load, a plugin cannot be loaded or a self-test case fails (the report's
Errors section says why: what a framework adapter would stop start-up with).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
from importlib import metadata
from typing import Any

from .. import __version__, envs
from ..diagnostics.host import cpu_info, cpu_line

#: import name -> label shown
PACKAGES = ("torch", "triton", "vllm", "text_generation_server")
#: framework name (as adapters and ProposerSpec.frameworks say it) -> its import name
FRAMEWORK_PACKAGES = {"vllm": "vllm", "tgi": "text_generation_server"}


def package_version(import_name: str) -> str | None:
    """Installed version of the distribution providing ``import_name``, or None.

    Reads package metadata only: nothing is imported (vLLM takes seconds to import).
    """
    dists = metadata.packages_distributions().get(import_name, [])
    for dist in dists:
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        return version if dist.replace("-", "_") == import_name else f"{version} ({dist})"
    if importlib.util.find_spec(import_name) is not None:
        return "installed (version unknown)"
    return None


def _device_info() -> dict[str, Any]:
    try:
        import torch
    except ImportError as exc:  # torch is a dependency; report rather than crash
        return {"device": "unknown", "detail": f"torch cannot be imported: {exc}"}
    if torch.cuda.is_available():
        cap = torch.cuda.get_device_capability()
        return {
            "device": "cuda",
            "detail": f"{torch.cuda.get_device_name()} (capability {cap[0]}.{cap[1]})",
            "cuda_capability": list(cap),
        }
    return {"device": "cpu", "detail": f"CPU ({platform.machine()}), no CUDA device"}


def _kernel_mode(device: str) -> dict[str, str]:
    try:
        from accel_plugin.kernels import runtime_mode, runtime_mode_reason
    except Exception as exc:
        return {"mode": "unavailable", "reason": f"accel_plugin.kernels cannot be imported: {exc!r}"}
    return {"mode": runtime_mode(device), "reason": runtime_mode_reason(device)}


def _env_report(environ=None) -> tuple[dict[str, Any], list[str]]:
    """Effective value (or error) of every ACCEL_* variable (:data:`accel_plugin.envs.ENV_VARS`)."""
    import os

    environ = os.environ if environ is None else environ
    report: dict[str, Any] = {}
    errors: list[str] = []
    for var in envs.ENV_VARS:
        name, raw = var.name, environ.get(var.name)
        try:
            value = var.getter(environ)
        except envs.EnvVarError as exc:
            report[name] = {"raw": raw, "error": str(exc)}
            errors.append(str(exc))
            continue
        if isinstance(value, frozenset):
            value = sorted(value)
        report[name] = {"raw": raw, "value": value}
    return report, errors


def _check_draft_config(path: str) -> dict[str, Any]:
    """Load the draft YAML the way the proposer will (schema, paths, weights)."""
    from ..speculative.draft_config import DraftConfigError, load_draft_config

    try:
        config = load_draft_config(path)
    except DraftConfigError as exc:
        return {"path": path, "error": f"{envs.ACCEL_DRAFT_CONFIG}: {exc}"}
    return {"path": path, "domains": list(config.drafts())}


def _plugin_manager(environ=None):
    """(plugin manager, None), or (a manager of accel-plugin's own plugins only, the error)
    when the plugins of ``environ`` cannot be loaded (the adapters still report)."""
    import os

    from ..plugins.manager import PluginLoadError, get_plugin_manager

    try:
        return get_plugin_manager(environ), None
    except (PluginLoadError, envs.EnvVarError, ValueError) as exc:
        own_only = {k: v for k, v in (os.environ if environ is None else environ).items() if k != envs.ACCEL_TRACE}
        own_only[envs.ACCEL_PLUGINS] = ""
        try:
            return get_plugin_manager(own_only), exc
        except (PluginLoadError, envs.EnvVarError, ValueError):
            return None, exc


def _adapter_sections(pm, environ=None) -> dict[str, Any]:
    """The framework adapters' sections (hook ``accel_doctor_report``), in plugin order."""
    sections: dict[str, Any] = {}
    if pm is not None:
        for answer in reversed(pm.hook.accel_doctor_report(environ=environ)):
            sections.update(answer or {})
    return sections


def collect(environ=None) -> dict[str, Any]:
    """Everything the doctor reports, as plain data (also printed by ``--json``)."""
    from ..plugins.manager import PluginLoadError, get_registries, plugin_names
    from ..plugins.selection import SelectionContext, select_attention_backend

    report: dict[str, Any] = {"accel_plugin": __version__, "errors": []}
    report["versions"] = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        report["versions"][name] = package_version(name)
    device = _device_info()
    report["device"] = device
    report["cpu"] = cpu_info()
    report["kernels"] = _kernel_mode(device["device"])
    env, env_errors = _env_report(environ)
    report["env"] = env
    pm, plugin_error = _plugin_manager(environ)
    report.update(_adapter_sections(pm, environ))
    report["errors"].extend(env_errors)

    try:
        if plugin_error is not None:
            raise plugin_error
        registries = get_registries(pm)
    except (PluginLoadError, envs.EnvVarError, ValueError) as exc:
        report["errors"].append(str(exc))
        report["plugins"], report["backends"], report["proposers"] = [], [], []
        return report
    report["plugins"] = plugin_names(pm)
    cap = tuple(device["cuda_capability"]) if "cuda_capability" in device else None
    report["backends"] = []
    for spec in registries.backends:
        reasons = spec.capabilities.check(device=device["device"], cuda_capability=cap)
        report["backends"].append(
            {
                "name": spec.name,
                "class_path": spec.class_path,
                "description": spec.description,
                "supported": not reasons,
                "reasons": reasons,
            }
        )
    report["proposers"] = []
    for spec in registries.proposers:
        missing = [f for f in spec.frameworks if package_version(FRAMEWORK_PACKAGES.get(f, f)) is None]
        reasons = [f"{f} is not installed" for f in missing] if len(missing) == len(spec.frameworks) else []
        report["proposers"].append(
            {"name": spec.name, "class_path": spec.class_path, "frameworks": list(spec.frameworks),
             "supported": not reasons, "reasons": reasons}
        )
    draft_config = env.get(envs.ACCEL_DRAFT_CONFIG, {}).get("value")
    if draft_config is not None:
        report["draft_config"] = _check_draft_config(draft_config)
        if "error" in report["draft_config"]:
            report["errors"].append(report["draft_config"]["error"])
    if not env_errors:
        context = SelectionContext(framework="doctor", device=device["device"], cuda_capability=cap)
        selection = select_attention_backend(context, pm=pm, registries=registries, environ=environ)
        report["selection"] = {
            "setting": selection.setting,
            "backend": selection.backend,
            "reasons": list(selection.reasons),
            "summary": selection.describe(),
        }
        if selection.refused:  # a framework adapter would refuse to start with it
            report["errors"].append(f"{selection.describe()}; unset {envs.ACCEL_ATTENTION_BACKEND} to keep the "
                                    "framework's own attention backend")
    return report


def render(report: dict[str, Any]) -> str:
    lines = [f"accel-plugin {report['accel_plugin']} doctor", "", "Software"]
    for name, version in report["versions"].items():
        lines.append(f"  {name:<24} {version or 'not installed'}")
    lines += ["", "Device", f"  {'device':<24} {report['device']['detail']}"]
    if report.get("cpu"):
        lines.append(f"  {'cpu':<24} {cpu_line(report['cpu'])}")
    kernels = report["kernels"]
    lines.append(f"  {'triton kernels':<24} {kernels['mode']}: {kernels['reason']}")
    if "tgi_adapter" in report:
        tgi = report["tgi_adapter"]
        hook = "installed" if tgi["hook_file_installed"] else (
            "MISSING (editable install? run: python -m accel_plugin.adapters.tgi install-hook)")
        mode = tgi["attention_env"]
        attention = "unset (TGI's launcher sets it)" if mode is None else (
            f"{mode}: {'supported' if tgi['attention_env_supported'] else 'NOT supported'}")
        lines += ["", "TGI adapter", f"  {'import hook':<24} {hook}: {tgi['hook_file']}",
                  f"  {'ATTENTION':<24} {attention} (supported: {', '.join(tgi['supported_attention'])})"]
    lines += ["", "Plugins"]
    lines += [f"  {name}" for name in report["plugins"]] or ["  (none loaded)"]
    lines += ["", "Attention backends"]
    for b in report["backends"]:
        state = "supported" if b["supported"] else "refused: " + "; ".join(b["reasons"])
        lines.append(f"  {b['name']:<24} {state}")
        lines.append(f"  {'':<24} {b['class_path']}")
    if not report["backends"]:
        lines.append("  (none registered)")
    lines += ["", "Proposers"]
    for p in report["proposers"]:
        state = "supported" if p["supported"] else "refused: " + "; ".join(p["reasons"])
        lines.append(f"  {p['name']:<24} {state}")
        lines.append(f"  {'':<24} {p['class_path']} ({', '.join(p['frameworks'])})")
    if "draft_config" in report and "domains" in report["draft_config"]:
        lines.append(f"  {'draft config':<24} {report['draft_config']['path']}: domains "
                     + ", ".join(report["draft_config"]["domains"]))
    if not report["proposers"]:
        lines.append("  (none registered)")
    lines += ["", "Environment"]
    for name, entry in report["env"].items():
        if "error" in entry:
            shown = f"INVALID: {entry['error']}"
        elif entry["raw"] is None:
            shown = "unset"
        else:
            shown = f"{entry['raw']!r} -> {entry['value']!r}"
        lines.append(f"  {name:<24} {shown}")
    if "selection" in report:
        lines += ["", "Selection", f"  {report['selection']['summary']}"]
    if "self_test" in report:
        from ..diagnostics.selftest_report import render as render_self_test

        lines += ["", *render_self_test(report["self_test"])]
    if report["errors"]:
        lines += ["", "Errors"] + [f"  {e}" for e in report["errors"]]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--self-test", action="store_true",
                        help="also run each kernel once against its reference (under a minute on CPU)")


def run(args: argparse.Namespace) -> int:
    report = collect()
    if args.self_test:
        from ..diagnostics.selftest_run import run_self_test

        self_test = run_self_test()
        report["self_test"] = self_test.to_dict()
        if not self_test.passed:
            report["errors"].append(f"self-test: {self_test.summary()}")
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 1 if report["errors"] else 0
