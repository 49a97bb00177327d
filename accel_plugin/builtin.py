"""accel-plugin's own backends, registered through the public hooks.

Capabilities are literal data here so that building the registry imports neither
torch nor triton; tests/test_builtin.py checks they match what the kernels accept
(``accel_plugin.kernels.SUPPORTED_HEAD_SIZES`` and friends).
"""

from __future__ import annotations

from .hookspecs import AdapterComponents, hookimpl
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
    dtypes=("float16", "bfloat16", "float32"),
    head_sizes=(32, 64, 80, 96, 128, 256),
    block_sizes=(16, 32, 64, 128, 256),
    devices=("cuda", "cpu"),
    # bf16 tl.dot needs Ampere; below that nothing here has been tested.
    min_cuda_capability=(8, 0),
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
            class_path="accel_plugin.adapters.vllm:DomainDraftProposer",
            description="domain-tuned draft-model proposer (YAML from ACCEL_DRAFT_CONFIG)",
            frameworks=("vllm",),
        )
    )


@hookimpl
def accel_adapter_components(components: AdapterComponents) -> None:
    if components.framework in ("vllm", "tgi"):
        components.attention_backends.extend([ACCEL_FLASH, ACCEL_PAGED])
    if components.framework == "vllm":
        components.proposers.append(ACCEL_DOMAIN_DRAFT)
