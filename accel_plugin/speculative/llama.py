"""A lean Llama forward for draft models, with a preallocated per-request KV cache.

Why not ``transformers``' model: a draft forward runs k times per target step, and
a generic Hugging Face forward (module hooks, cache objects, mask building) costs
1-3 ms even for a tiny model, which eats the whole gain of speculation (measured,
see docs/speculative.md). This module loads the Llama weights from safetensors
itself (:mod:`.llama_weights`: q/k/v and gate/up projections fused) and runs a
plain torch forward.

Supported: ``LlamaForCausalLM`` / ``MistralForCausalLM`` checkpoints without a
sliding window (RMSNorm, RoPE with the config's ``rope_theta`` and static
``rope_scaling`` types, GQA/MQA, SiLU MLP, optional attention/MLP bias, tied
embeddings), and drafts that borrow tensors from their target and prune their LM
head to a token subset (:mod:`.draft_format`): :meth:`LlamaDraftModel.forward`
then returns logits over that subset, and :meth:`LlamaDraftModel.greedy` maps the
argmax back to token ids.

Precision per batch size (:func:`resolve_precision`): on a CPU without native
bfloat16 (no AVX512-BF16 or AMX), bfloat16 matrix products are slower than float32
ones except where reading the weights is the whole cost, at a few rows (measured by
``benchmarks/draft_forward.py``: at 1 row bf16 weights take half the time of fp32
ones, at 8 rows they take more, at 32 rows twice as long). A model built with
``small_batch_weights=torch.bfloat16`` and ``dtype=torch.float32`` keeps both: its
forwards of at most ``small_batch_rows`` rows (batch x new tokens) multiply by the
bfloat16 copies of the matrices (activations cast at each product, results back to
float32), larger ones by the float32 ones; norms, RoPE, attention and the KV cache
stay float32.

On a CPU with native bfloat16 the same arguments keep the bfloat16 matrices only:
forwards of at most ``small_batch_rows`` (default :data:`NATIVE_BF16_ROWS`) rows
multiply by the native few-row product of bfloat16 matrices
(:mod:`accel_plugin.kernels.cpu_linear`; half the time of torch's at 1-4 rows), larger
ones by torch's bfloat16 (AMX) product; everything else stays float32, which torch's
elementwise CPU ops and SDPA run faster than bfloat16.

Larger forwards on a CPU multiply by oneDNN's prepacked matrices
(:func:`packed_linear`: ``torch.ops.mkldnn``, the kernels torch's own inductor uses
for frozen CPU linears) where this torch has them and they agree with
``F.linear`` on a probe: the packed layout saves the per-call reorder that
``F.linear`` pays, 20% of a draft forward at 8 rows on the 2-core AVX2 machine
(11.0 -> 8.7 ms, SmolLM2's support draft, one thread). At one row packing loses, so
the small path keeps plain (or bfloat16) matrices. The packed copies replace the
float32 ones where the small path has bfloat16 copies of its own (``dtype:
bfloat16`` on such a CPU); in a float32 draft both are kept (the matrices' bytes
twice in host memory, not in bytes read per forward).

KV cache: a slot per request (:meth:`LlamaDraftModel.alloc_slot`, given back with
:meth:`LlamaDraftModel.free_slot` when it finishes), held by :mod:`.draft_kv`,
which grows and shrinks it with the live requests;
:attr:`LlamaDraftModel.kv_bytes` says what it holds now.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from .draft_kv import DraftKVCache
from .llama_weights import (
    DraftModelError,
    cast_matrices,
    load_llama_weights,
    map_matrices,
    rope_tables,
    weight_bytes,
)

__all__ = [
    "NATIVE_BF16_ROWS", "SMALL_BATCH_ROWS", "LlamaDraftModel", "native_bf16", "native_bf16_product", "packed_linear",
    "resolve_precision",
]

#: forwards of at most this many rows (batch x new tokens) use the small-batch weights;
#: bf16 weights won at 1, 2 and 4 rows and lost at 8 on the 2-core AVX2 machine
SMALL_BATCH_ROWS = 4

#: on a CPU with native bfloat16: forwards of at most this many rows use the native few-row
#: product of the bfloat16 matrices, larger ones torch's (AMX) product. SmolLM2's support
#: draft's 13 matrices, 2 threads, the 2-core AVX-512/AMX machine, with the matrices read from
#: memory as in a server (``benchmarks/draft_linears.py --cold 600``): the native one took 0.55x
#: torch's time at 1 row, 0.68x at 8, 0.81x at 12, 0.96x at 16 and 1.16x at 24 (back to back,
#: the matrices in cache, it loses from about 12 rows on: 1.1x at 12, 1.4x at 16)
NATIVE_BF16_ROWS = 16


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX tiles)."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def native_bf16_product(device: torch.device | str = "cpu"):
    """``(pack, linear)`` of the native few-row product of bfloat16 matrices
    (:mod:`accel_plugin.kernels.cpu_linear`, AVX512-BF16), or ``None``."""
    from ..kernels import cpu_linear

    return cpu_linear.ops(torch.bfloat16, device)


def resolve_precision(dtype: torch.dtype, device: torch.device) -> tuple[torch.dtype, torch.dtype | None]:
    """The (compute dtype, small-batch weight dtype) a draft asked to run in ``dtype`` runs in.

    bfloat16 on a CPU becomes float32 compute (norms, RoPE, attention, KV) with bfloat16
    weights: without native bfloat16, bfloat16 weights for small batches only (the
    fastest of the three on such a CPU at every batch size); with native bfloat16 and
    the native few-row product of bfloat16 matrices, bfloat16 weights for every forward
    (see the module's docstring). Everything else runs as asked (small-batch weights ``None``).
    """
    if dtype == torch.bfloat16 and torch.device(device).type == "cpu":
        if not native_bf16() or native_bf16_product(device) is not None:
            return torch.float32, torch.bfloat16
    return dtype, None


#: rows the prepacked matrices are laid out for (oneDNN's batch-size hint)
_PACK_ROWS = 8


def _mkldnn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    shape = x.shape
    out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, shape[-1]), weight, bias, "none", [], "")
    return out.view(*shape[:-1], out.shape[-1])


def packed_linear(dtype: torch.dtype, device: torch.device):
    """(pack, linear) for oneDNN's prepacked float32 CPU matrices, or ``None``: not a
    CPU, not float32, no mkldnn in this torch, or a probe product that disagrees with
    ``F.linear`` (then the plain path serves; nothing else changes)."""
    if torch.device(device).type != "cpu" or dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return None
    try:
        def pack(t: torch.Tensor) -> torch.Tensor:
            return torch.ops.mkldnn._reorder_linear_weight(t.contiguous(), _PACK_ROWS) if t.dim() == 2 else t

        gen = torch.Generator().manual_seed(0)
        w, b = torch.randn(48, 64, generator=gen), torch.randn(48, generator=gen)
        x = torch.randn(2, 5, 64, generator=gen)
        if not torch.allclose(_mkldnn_linear(x, pack(w), b), F.linear(x, w, b), rtol=1e-4, atol=1e-4):
            return None
    except Exception:  # noqa: BLE001 - a torch without these ops: the plain path
        return None
    return pack, _mkldnn_linear


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _first_of_run(rows: torch.Tensor) -> int | None:
    """``r0`` if ``rows`` (a CPU tensor) is ``r0, r0 + 1, ...``, else ``None``."""
    first = int(rows[0])
    if len(rows) == 1 or bool((rows[1:] - rows[:-1] == 1).all()):
        return first
    return None


class LlamaDraftModel:
    """A Llama checkpoint loaded for drafting.

    ``max_len`` bounds the positions a request can reach (the framework's
    ``max_model_len``); the RoPE tables are built for it once. ``target_dir`` is
    the target model's directory, needed by drafts that borrow its tensors.
    """

    def __init__(self, model_dir: str | Path, *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", max_len: int = 2048, initial_slots: int = 8,
                 target_dir: str | Path | None = None, small_batch_weights: torch.dtype | None = None,
                 small_batch_rows: int | None = None):
        self.model_dir = Path(model_dir)
        self.target_dir = None if target_dir is None else Path(target_dir)
        cfg = json.loads((self.model_dir / "config.json").read_text())
        self.dtype, self.device = dtype, torch.device(device)
        if cfg.get("sliding_window") and cfg.get("use_sliding_window", True) and cfg.get("model_type") == "mistral":
            raise DraftModelError(f"{self.model_dir}: sliding_window attention is not supported by the draft engine")
        if cfg.get("hidden_act", "silu") != "silu":
            raise DraftModelError(f"{self.model_dir}: hidden_act {cfg.get('hidden_act')!r} is not supported (only silu)")
        self.num_layers = cfg["num_hidden_layers"]
        self.num_heads = cfg["num_attention_heads"]
        self.num_kv_heads = cfg.get("num_key_value_heads") or self.num_heads
        self.hidden_size = cfg["hidden_size"]
        self.head_dim = cfg.get("head_dim") or self.hidden_size // self.num_heads
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.vocab_size = cfg["vocab_size"]
        self.max_len = max_len
        self.scale = self.head_dim ** -0.5
        cos, sin = rope_tables(self.model_dir, cfg, self.head_dim, max_len)
        self._cos, self._sin = cos.to(self.device, dtype), sin.to(self.device, dtype)
        weights = load_llama_weights(
            self.model_dir, self.target_dir, dtype=self.dtype, device=self.device, vocab_size=self.vocab_size,
            hidden_size=self.hidden_size, num_layers=self.num_layers, num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, tied=bool(cfg.get("tie_word_embeddings", False)),
        )
        self.embed, self.norm, self.lm_head = weights.embed, weights.norm, weights.lm_head
        #: token ids of the head's rows (``None``: the whole vocabulary)
        self.head_vocab: torch.Tensor | None = weights.head_vocab
        self.layers = weights.layers
        #: bytes of weights one forward reads (see :class:`.llama_weights.LlamaWeights`)
        self.forward_bytes = weights.forward_bytes
        self._choose_products(small_batch_weights, small_batch_rows)
        self.kv = DraftKVCache(num_layers=self.num_layers, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                               dtype=self.dtype, device=self.device, max_len=max_len, initial_slots=initial_slots)

    def _choose_products(self, small: torch.dtype | None, small_rows: int | None) -> None:
        """The matrices (and product) of forwards of at most ``small_batch_rows`` rows and of larger ones."""
        #: forwards of at most this many rows multiply by ``small_layers`` / ``small_lm_head``
        self.small_batch_rows = 0
        self.small_layers, self.small_lm_head, self._small_linear = self.layers, self.lm_head, F.linear
        self.large_layers, self.large_lm_head, self._large_linear = self.layers, self.lm_head, F.linear
        self._small_bytes = self.forward_bytes
        if small == torch.bfloat16 and self.dtype == torch.float32 and native_bf16():
            # this CPU multiplies bfloat16 natively: every forward by the bfloat16 matrices, up to
            # small_rows rows by the native few-row product, larger ones by torch's (AMX) product
            copies, head = cast_matrices(self.layers, small), self.lm_head.to(small).contiguous()
            self.layers = self.large_layers = self.small_layers = copies
            self.lm_head = self.large_lm_head = self.small_lm_head = head
            self._large_linear = self._small_linear = self._cast_linear
            self.forward_bytes = self._small_bytes = weight_bytes(copies, self.norm, head)
            skinny = native_bf16_product(self.device)
            rows = NATIVE_BF16_ROWS if small_rows is None else small_rows
            if skinny is not None and rows > 0:
                pack, self._small_linear = skinny
                self.small_batch_rows = rows
                self.small_layers = map_matrices(copies, lambda t: pack(t) if t.dim() == 2 else t.float())
                self.small_lm_head = pack(head)
            return
        if small is not None and small != self.dtype and (small_rows is None or small_rows > 0):
            self.small_batch_rows = SMALL_BATCH_ROWS if small_rows is None else small_rows
            self.small_layers = cast_matrices(self.layers, small)
            self.small_lm_head = self.lm_head.to(small).contiguous()
            self._small_linear = self._cast_linear
            self._small_bytes = weight_bytes(self.small_layers, self.norm, self.small_lm_head)
        packed = packed_linear(self.dtype, self.device)
        if packed is not None:
            pack, self._large_linear = packed
            self.large_layers, self.large_lm_head = map_matrices(self.layers, pack), pack(self.lm_head)
            if self.small_layers is not self.layers:  # the plain matrices serve no forward now: drop them
                self.layers, self.lm_head = self.large_layers, self.large_lm_head

    def forward_bytes_at(self, rows: int) -> int:
        """Bytes of weights a forward of ``rows`` rows (batch x new tokens) reads."""
        return self._small_bytes if rows <= self.small_batch_rows else self.forward_bytes

    def greedy(self, logits: torch.Tensor) -> torch.Tensor:
        """Token ids of the argmax of :meth:`forward`'s logits (through ``head_vocab``)."""
        best = logits.argmax(dim=-1)
        return best if self.head_vocab is None else self.head_vocab[best]

    # --------------------------------------------------------------- KV slots

    def alloc_slot(self) -> int:
        """A free slot handle for a new request (:meth:`.draft_kv.DraftKVCache.alloc`)."""
        return self.kv.alloc()

    def free_slot(self, slot: int) -> None:
        """Give a request's slot back (:meth:`.draft_kv.DraftKVCache.free`)."""
        self.kv.free(slot)

    @property
    def num_free_slots(self) -> int:
        return self.kv.num_free_slots

    @property
    def num_slots(self) -> int:
        """Rows of the KV cache (live + free)."""
        return self.kv.num_slots

    @property
    def capacity(self) -> int:
        """Positions per row of the KV cache."""
        return self.kv.capacity

    @property
    def kv_bytes(self) -> int:
        """Bytes the draft KV cache holds now (K and V, every layer); O(1)."""
        return self.kv.nbytes

    def cache_bytes(self) -> int:
        return self.kv_bytes

    # ---------------------------------------------------------------- forward

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # in float32 and scaled after the cast back, as transformers' LlamaRMSNorm does
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return weight * normed.to(self.dtype)

    def _cast_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        # the small-batch weights' product, back in the model's dtype
        return F.linear(x.to(weight.dtype), weight, bias).to(self.dtype)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, start: torch.Tensor, q_lens: torch.Tensor,
                slots: torch.Tensor) -> torch.Tensor:
        """Run new tokens of ``B`` requests; return the logits of each one's last token.

        tokens: ``[B, T]`` int64, row ``b`` valid in ``[:q_lens[b]]`` (rest is padding)
        start: ``[B]`` int64, position of each row's first new token (= its cached length)
        q_lens: ``[B]`` int64, 1..T
        slots: ``[B]`` int64, the rows' KV slots
        returns: ``[B, V]`` float32, ``V`` = vocab_size, or the pruned head's size
        (map an argmax with :meth:`greedy`)

        K/V of the new tokens are written at positions ``start..start+q_len-1``; what a
        slot held beyond ``start`` is overwritten (that is how rejected drafts are dropped).
        Rows of different lengths run ragged: the products, norms and RoPE on the
        ``sum(q_lens)`` real tokens only (no padding), attention on the ``[B, T]`` layout.
        """
        B, T = tokens.shape
        device = self.device
        arange_t = torch.arange(T, device=device)
        pos = start[:, None] + arange_t[None, :]
        kv_len = int((start + q_lens).max())
        if kv_len > self.max_len:
            raise DraftModelError(f"context of {kv_len} tokens exceeds the draft engine's max_len {self.max_len}")
        if kv_len > self.kv.capacity:
            self.kv.grow(capacity=max(kv_len, 2 * self.kv.capacity))
        slots = self.kv.claim(slots, start + q_lens)  # handles -> rows (after any growth: it may move rows)
        # rows r0..r0+B-1 in order (requests of one draft arriving in order): attention
        # reads the cache in place instead of gathering every layer's K and V
        first = _first_of_run(slots) if device.type == "cpu" else None
        ragged = False  # rows of different lengths: only their real tokens go through the products
        if T == 1:
            w_slot, w_pos, w_b, w_t = slots, start, torch.arange(B, device=device), None
        else:
            valid = arange_t[None, :] < q_lens[:, None]
            w_b, w_t = valid.nonzero(as_tuple=True)
            w_slot, w_pos = slots[w_b], pos[w_b, w_t]
            ragged = len(w_b) < B * T
        pos_c = (w_pos if ragged else pos).clamp(max=self.max_len - 1)
        cos = self._cos[pos_c][..., None, :]  # [B, T, 1, D], ragged [N, 1, D]
        sin = self._sin[pos_c][..., None, :]
        # key j is visible to query (b, t) iff j <= pos[b, t]; padded queries see
        # zeros or stale keys of their own slot and are discarded
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        G = H // Hkv
        mask = None  # one row, one token: every cached key is visible
        if B > 1 or T > 1:  # [B, 1, G x T, L], in the order of the grouped queries below
            mask = torch.arange(kv_len, device=device)[None, None, None, :] <= pos[:, None, :, None]
            mask = mask.repeat(1, 1, G, 1)
        small = (len(w_b) if ragged else B * T) <= self.small_batch_rows
        layers, lm_head = (self.small_layers, self.small_lm_head) if small else (self.large_layers, self.large_lm_head)
        lin = self._small_linear if small else self._large_linear
        x = F.embedding(tokens[w_b, w_t] if ragged else tokens, self.embed)  # [B, T, E], ragged [N, E]
        lead = x.shape[:-1]
        for i, layer in enumerate(layers):
            h = self._rms_norm(x, layer.ln_in)
            qkv = lin(h, layer.qkv, layer.qkv_b)
            # q and k rotated together: one set of RoPE ops per layer
            qk = qkv[..., : (H + Hkv) * D].view(*lead, H + Hkv, D)
            qk = qk * cos + _rotate_half(qk) * sin
            q, k = qk.split((H, Hkv), dim=-2)
            v = qkv[..., (H + Hkv) * D :].view(*lead, Hkv, D)
            kc, vc = self.kv.k_cache[i], self.kv.v_cache[i]
            if ragged:
                kc[w_slot, :, w_pos], vc[w_slot, :, w_pos] = k, v
                q = q.new_zeros(B, T, H, D).index_put_((w_b, w_t), q)  # padded queries: zeros, discarded
            elif w_t is None:
                kc[w_slot, :, w_pos] = k[:, 0]
                vc[w_slot, :, w_pos] = v[:, 0]
            else:
                kc[w_slot, :, w_pos] = k[w_b, w_t]
                vc[w_slot, :, w_pos] = v[w_b, w_t]
            # [B, Hkv, L, D]; index_select of the sliced view copies only L positions
            # (4-5x faster than advanced indexing kc[slots, :, :kv_len] on CPU at batch 8)
            if first is None:
                keys = kc[:, :, :kv_len].index_select(0, slots)
                values = vc[:, :, :kv_len].index_select(0, slots)
            else:
                keys, values = kc[first : first + B, :, :kv_len], vc[first : first + B, :, :kv_len]
            # the G query heads of a KV head as G x T queries of one head: SDPA's fused CPU
            # kernel, where enable_gqa falls back to its unfused math (5x slower in torch 2.7)
            q = q.view(B, T, Hkv, G, D).permute(0, 2, 3, 1, 4).reshape(B, Hkv, G * T, D)
            attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale)
            attn = attn.view(B, Hkv, G, T, D).permute(0, 3, 1, 2, 4).reshape(B, T, H * D)
            x = x + lin(attn[w_b, w_t] if ragged else attn, layer.o, layer.o_b)
            h = self._rms_norm(x, layer.ln_post)
            gate, up = lin(h, layer.gate_up, layer.gate_up_b).chunk(2, dim=-1)
            x = x + lin(F.silu(gate) * up, layer.down, layer.down_b)
        last = x[q_lens.cumsum(0) - 1] if ragged else x[torch.arange(B, device=device), q_lens - 1]
        return lin(self._rms_norm(last, self.norm), lm_head).float()
