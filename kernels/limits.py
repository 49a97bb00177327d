"""What the kernels accept, as plain data (no imports).

The one place these numbers live: :mod:`._validation` enforces them, and
``accel_plugin.plugins.builtin`` declares them as the backends' capabilities, reading
this module without importing torch or triton.
"""

#: Head dimensions the kernels are instantiated for.
HEAD_SIZES: tuple[int, ...] = (32, 64, 80, 96, 128, 256)
#: Tensor dtypes, by torch name (``torch.float16`` -> ``"float16"``).
DTYPE_NAMES: tuple[str, ...] = ("float16", "bfloat16", "float32")
#: KV-cache block sizes (tokens per block) the paged kernels read: any in this range.
MIN_BLOCK_SIZE = 16
MAX_BLOCK_SIZE = 256
#: The block sizes offered to a framework: the powers of two in the range.
BLOCK_SIZES: tuple[int, ...] = tuple(
    1 << n for n in range(MIN_BLOCK_SIZE.bit_length() - 1, MAX_BLOCK_SIZE.bit_length())
)
#: bf16 ``tl.dot`` needs Ampere (sm_80); nothing older has been tested.
MIN_CUDA_CAPABILITY: tuple[int, int] = (8, 0)
