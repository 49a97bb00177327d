"""Launch configurations: a small table per kernel, filtered by a named predicate.

On a GPU, the first candidate (in preference order) that passes
:func:`fits_device` is used; candidates are keyed on the padded head dim and the
device's compute capability. Under the interpreter there is a single small
config per kernel: the interpreter's cost is (programs x loop iterations), and
register or shared-memory limits do not exist there.

No autotuning: a table needs no benchmark runs at first call, gives the same
config on every run (reproducible numbers, CUDA-graph friendly) and never
touches the driver at import. The numbers come from the Triton fused-attention
tutorial and flash-attention's Triton kernels; they are not yet tuned on our own
measurements (see docs/performance.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton


@dataclass(frozen=True)
class FlashConfig:
    block_m: int  # query rows per program
    block_n: int  # keys per inner-loop iteration
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class PagedConfig:
    block_m: int  # target rows per program: (queries x query heads of one kv head)
    tile_n: int  # keys per inner-loop iteration
    num_warps: int
    num_stages: int


INTERPRETER_FLASH = FlashConfig(block_m=32, block_n=32, num_warps=4, num_stages=1)
INTERPRETER_PAGED = PagedConfig(block_m=16, tile_n=32, num_warps=4, num_stages=1)

# (min compute capability, max padded head dim, element size) -> candidates, best first.
# First match wins, so capability-specific rows come before the generic (0) ones.
_FLASH_TABLE: tuple[tuple[int, int, int, tuple[FlashConfig, ...]], ...] = (
    (90, 64, 2, (FlashConfig(128, 128, 8, 3), FlashConfig(128, 64, 4, 3))),
    (90, 128, 2, (FlashConfig(128, 128, 8, 3), FlashConfig(128, 64, 8, 3), FlashConfig(64, 64, 4, 2))),
    (90, 256, 2, (FlashConfig(64, 64, 8, 2), FlashConfig(64, 32, 4, 2))),
    (0, 64, 2, (FlashConfig(128, 64, 4, 3), FlashConfig(64, 64, 4, 2))),
    (0, 128, 2, (FlashConfig(128, 64, 8, 3), FlashConfig(64, 64, 4, 2), FlashConfig(64, 32, 4, 2))),
    (0, 256, 2, (FlashConfig(64, 64, 8, 2), FlashConfig(64, 32, 4, 2), FlashConfig(32, 32, 4, 1))),
    (0, 128, 4, (FlashConfig(64, 32, 4, 2), FlashConfig(32, 32, 4, 2), FlashConfig(32, 16, 4, 1))),
    (0, 256, 4, (FlashConfig(32, 32, 4, 2), FlashConfig(32, 16, 4, 1))),
)

_PAGED_TABLE: tuple[tuple[int, int, int, tuple[PagedConfig, ...]], ...] = (
    (0, 128, 2, (PagedConfig(64, 64, 4, 3), PagedConfig(64, 32, 4, 2), PagedConfig(16, 32, 4, 2))),
    (0, 256, 2, (PagedConfig(32, 64, 4, 2), PagedConfig(32, 32, 4, 2), PagedConfig(16, 16, 4, 1))),
    (0, 256, 4, (PagedConfig(32, 32, 4, 2), PagedConfig(16, 32, 4, 2), PagedConfig(16, 16, 4, 1))),
)

# Fallback when the cuda properties do not report the opt-in limit.
_SMEM_BY_MAJOR = {9: 227 * 1024, 8: 163 * 1024, 7: 96 * 1024}
# fp32 accumulator and score registers per thread we allow before spills become likely.
_MAX_ACC_REGS_PER_THREAD = 160
# fp32 tiles use tf32x3 dots, which keep split copies of the operands in shared memory.
_FP32_SMEM_FACTOR = 1.5


@dataclass(frozen=True)
class DeviceInfo:
    capability: int  # 10 * major + minor
    num_sms: int
    shared_memory: int  # bytes per block, opt-in maximum


@functools.lru_cache(maxsize=None)
def device_info(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    smem = getattr(props, "shared_memory_per_block_optin", 0) or _SMEM_BY_MAJOR.get(props.major, 48 * 1024)
    return DeviceInfo(10 * props.major + props.minor, props.multi_processor_count, smem)


def _smem_bytes(rows: int, cols: int, block_d: int, elem: int, stages: int) -> float:
    # Q tile once, K and V tiles once per pipeline stage.
    size = rows * block_d * elem + 2 * cols * block_d * elem * max(stages, 1)
    return size * (_FP32_SMEM_FACTOR if elem == 4 else 1.0)


def fits_device(rows: int, cols: int, num_warps: int, num_stages: int, block_d: int, elem: int,
                info: DeviceInfo) -> bool:
    """The named predicate: shared memory fits and the accumulators fit in registers."""
    acc_regs = (rows * block_d + rows * cols) // (num_warps * 32)
    return (_smem_bytes(rows, cols, block_d, elem, num_stages) <= info.shared_memory
            and acc_regs <= _MAX_ACC_REGS_PER_THREAD)


def _pick(table, block_d: int, elem: int, info: DeviceInfo):
    elem = 4 if elem >= 4 else 2
    for min_cap, max_d, size, candidates in table:
        if info.capability >= min_cap and block_d <= max_d and size == elem:
            for cfg in candidates:
                rows = cfg.block_m
                cols = cfg.block_n if isinstance(cfg, FlashConfig) else cfg.tile_n
                if fits_device(rows, cols, cfg.num_warps, cfg.num_stages, block_d, elem, info):
                    return cfg
            return candidates[-1]
    raise LookupError(f"no launch config for padded head dim {block_d}, element size {elem}")


def _info(device: torch.device) -> DeviceInfo:
    return device_info(device.index if device.index is not None else torch.cuda.current_device())


def flash_config(block_d: int, dtype: torch.dtype, device: torch.device, interpreted: bool) -> FlashConfig:
    if interpreted:
        return INTERPRETER_FLASH
    return _pick(_FLASH_TABLE, block_d, dtype.itemsize, _info(device))


def paged_config(block_d: int, dtype: torch.dtype, device: torch.device, interpreted: bool) -> PagedConfig:
    if interpreted:
        return INTERPRETER_PAGED
    return _pick(_PAGED_TABLE, block_d, dtype.itemsize, _info(device))


def num_sms(device: torch.device, interpreted: bool) -> int:
    """Streaming multiprocessors to fill; 1 under the interpreter, where splitting only costs."""
    if interpreted:
        return 1
    return _info(device).num_sms


# Split-K (flash-decoding) heuristic.
MAX_SPLITS = 64
MIN_TILES_PER_SPLIT = 4
PROGRAMS_PER_SM = 2


def choose_num_splits(work_programs: int, max_seq_len: int, tile_n: int, sms: int) -> int:
    """How many pieces to cut each sequence's keys into so that the grid fills the GPU.

    ``work_programs`` is the number of programs that do work without splitting
    (query tiles x kv heads). No split when they already fill the device; else
    enough splits to reach ``PROGRAMS_PER_SM`` programs per SM, keeping at least
    ``MIN_TILES_PER_SPLIT`` key tiles per split (the reduce is not free) and at
    most ``MAX_SPLITS``.
    """
    target = PROGRAMS_PER_SM * sms
    if work_programs <= 0 or work_programs >= target:
        return 1
    by_length = max(1, triton.cdiv(max_seq_len, tile_n * MIN_TILES_PER_SPLIT))
    return max(1, min(triton.cdiv(target, work_programs), by_length, MAX_SPLITS))
