"""accel-plugin's own backends and proposer, registered through the public hooks.

The backends' capabilities are the kernels' own limits
(:mod:`accel_plugin.kernels.limits`, plain data: building the registry imports
neither torch nor triton). The proposer is the framework-neutral
:class:`accel_plugin.speculative.DomainProposer`; each framework adapter wraps it.
"""

from __future__ import annotations

from .hookspecs import AdapterComponents, hookimpl
from ..kernels import limits
from .registry import BackendRegistry, BackendSpec, Capabilities, ProposerRegistry, ProposerSpec

ACCEL_FLASH = "ACCEL_FLASH"
ACCEL_PAGED = "ACCEL_PAGED"
ACCEL_DOMAIN_DRAFT = "ACCEL_DOMAIN_DRAFT"

#: ACCEL_ATTENTION_BACKEND value -> backend name (``auto`` asks the hooks).
SETTING_TO_BACKEND = {"flash": ACCEL_FLASH, "paged": ACCEL_PAGED}

_FEATURES = frozenset(
    {"prefix_caching", "chunked_prefill", "spec_decode", "sliding_window", "softcap", "gqa"}
)
_CAPABILITIES = Capabilities(
    dtypes=limits.DTYPE_NAMES,
    head_sizes=limits.HEAD_SIZES,
    block_sizes=limits.BLOCK_SIZES,
    devices=("cuda", "cpu"),
    min_cuda_capability=limits.MIN_CUDA_CAPABILITY,
    features=_FEATURES,
)


@hookimpl
def accel_register_attention_backends(registry: BackendRegistry) -> None:
    registry.register(
        BackendSpec(
            name=ACCEL_FLASH,
            class_path="accel_plugin.attention:FlashPagedAttention",
            capabilities=_CAPABILITIES,
            description="Triton FlashAttention for prompts without cached context, "
            "Triton paged attention for everything that reads the KV cache",
            priority=10,
        )
    )
    registry.register(
        BackendSpec(
            name=ACCEL_PAGED,
            class_path="accel_plugin.attention:PagedAttention",
            capabilities=_CAPABILITIES,
            description="Triton paged attention (split-K) for every token",
            priority=5,
        )
    )


@hookimpl
def accel_register_proposers(registry: ProposerRegistry) -> None:
    registry.register(
        ProposerSpec(
            name=ACCEL_DOMAIN_DRAFT,
            class_path="accel_plugin.speculative:DomainProposer",
            description="domain-tuned draft-model proposer (YAML from ACCEL_DRAFT_CONFIG)",
            frameworks=("vllm", "tgi"),
        )
    )


@hookimpl
def accel_adapter_components(components: AdapterComponents) -> None:
    if components.framework in ("vllm", "tgi"):
        components.attention_backends.extend([ACCEL_FLASH, ACCEL_PAGED])
    if components.framework in ("vllm", "tgi"):
        components.proposers.append(ACCEL_DOMAIN_DRAFT)
