"""Launch-config tables and the split-K heuristic (pure Python, no launch)."""

import pytest
import torch

from accel_plugin.kernels import SUPPORTED_DTYPES, SUPPORTED_HEAD_SIZES, _configs

DEVICES = {
    "h100": _configs.DeviceInfo(90, 132, 227 * 1024),
    "a100": _configs.DeviceInfo(80, 108, 163 * 1024),
    "l40": _configs.DeviceInfo(89, 142, 99 * 1024),
}


@pytest.mark.parametrize("gpu", DEVICES)
@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", SUPPORTED_HEAD_SIZES)
def test_every_supported_shape_gets_a_fitting_config(monkeypatch, gpu, dtype, head_dim):
    info = DEVICES[gpu]
    monkeypatch.setattr(_configs, "device_info", lambda index: info)
    block_d = 1 << (head_dim - 1).bit_length()
    device = torch.device("cuda", 0)
    flash = _configs.flash_config(block_d, dtype, device, interpreted=False)
    assert _configs.fits_device(flash.block_m, flash.block_n, flash.num_warps, flash.num_stages, block_d,
                                dtype.itemsize, info)
    paged = _configs.paged_config(block_d, dtype, device, interpreted=False)
    assert _configs.fits_device(paged.block_m, paged.tile_n, paged.num_warps, paged.num_stages, block_d,
                                dtype.itemsize, info)
    # tl.dot needs at least 16 rows, columns and reduction length.
    assert min(flash.block_m, flash.block_n, paged.tile_n) >= 16


def test_interpreter_uses_one_config():
    cpu = torch.device("cpu")
    assert {_configs.flash_config(d, t, cpu, True) for d in (32, 128, 256) for t in SUPPORTED_DTYPES} == {
        _configs.INTERPRETER_FLASH}
    assert _configs.paged_config(128, torch.bfloat16, cpu, True) == _configs.INTERPRETER_PAGED
    assert _configs.num_sms(cpu, True) == 1


@pytest.mark.parametrize("work,max_seq_len,expected", [
    (8, 32768, 33),  # batch 1, 8 kv heads, long context: split to fill 2 x 132 programs
    (8, 1024, 4),  # short context caps the split: 4 tiles of 64 keys per split
    (8, 64, 1),  # too short to split
    (32 * 8, 32768, 2),  # batch 32 x 8 kv heads: one program per SM and a bit; two pieces each
    (64 * 8, 32768, 1),  # batch 64 x 8 kv heads fills the GPU twice over
    (100, 4096, 3),
    (1, 1 << 20, _configs.MAX_SPLITS),
])
def test_choose_num_splits(work, max_seq_len, expected):
    assert _configs.choose_num_splits(work, max_seq_len, 64, 132) == expected


def test_no_split_under_the_interpreter():
    assert _configs.choose_num_splits(2, 4096, 32, _configs.num_sms(torch.device("cpu"), True)) == 1
