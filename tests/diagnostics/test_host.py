"""The CPU named beside every measurement (accel_plugin/diagnostics/host.py)."""

from accel_plugin.diagnostics.host import cpu_info, cpu_line

INTEL = """processor\t: 0
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw amx_bf16 amx_tile
processor\t: 1
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw amx_bf16 amx_tile
"""
EPYC = """processor\t: 0
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx avx2 fma
"""
ZEN4 = """processor\t: 0
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_bf16
"""
ARM = """processor\t: 0
Features\t: fp asimd evtstrm
"""


def test_cpu_info_reads_model_and_instruction_sets():
    intel = cpu_info(INTEL)
    assert intel["model"] == "Intel(R) Xeon(R) Processor" and intel["isa"] == ["AVX2", "AVX-512", "AMX"]
    epyc = cpu_info(EPYC)
    assert epyc["model"] == "AMD EPYC 7B13" and epyc["isa"] == ["AVX2"]
    assert cpu_info(ZEN4)["isa"] == ["AVX2", "AVX-512", "AVX512-BF16"]  # what the drafts' bfloat16 product uses
    assert cpu_info(ARM)["isa"] == [] and cpu_info("")["isa"] == []
    assert all(isinstance(info["cpus"], int) and info["cpus"] >= 1 for info in (intel, epyc))


def test_cpu_line_names_the_machine():
    line = cpu_line({"model": "AMD EPYC 7B13", "arch": "x86_64", "cpus": 2, "isa": ["AVX2"]})
    assert line == "AMD EPYC 7B13, 2 CPUs, x86_64 with AVX2"
    assert cpu_line({"model": None, "arch": "aarch64", "cpus": None, "isa": []}) == \
        "unknown CPU, ? CPUs, aarch64 with no AVX2"
    assert cpu_line().endswith(("AVX2", "AVX-512", "AVX512-BF16", "AMX", "no AVX2"))  # this machine's
