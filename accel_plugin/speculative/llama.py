"""A lean Llama forward for draft models, with a preallocated per-request KV cache.

Why not ``transformers``' model: a draft forward runs k times per target step, and
a generic Hugging Face forward (module hooks, cache objects, mask building) costs
1-3 ms even for a tiny model, which eats the whole gain of speculation (measured,
see docs/speculative.md). This module loads the Llama weights from safetensors
itself, fuses q/k/v and gate/up projections, and runs a plain torch forward.

Supported: ``LlamaForCausalLM`` / ``MistralForCausalLM`` checkpoints without a
sliding window (RMSNorm, RoPE with the config's ``rope_theta`` and static
``rope_scaling`` types, GQA/MQA, SiLU MLP, optional attention/MLP bias, tied
embeddings), and drafts that borrow tensors from their target and prune their LM
head to a token subset (:mod:`.draft_format`): :meth:`LlamaDraftModel.forward`
then returns logits over that subset, and :meth:`LlamaDraftModel.greedy` maps the
argmax back to token ids.

KV cache: one tensor per layer and K/V, ``[num_slots, num_kv_heads, capacity,
head_dim]``; a request owns one slot (:meth:`LlamaDraftModel.alloc_slot`), given
back with :meth:`LlamaDraftModel.free_slot` when it finishes. ``num_slots`` and
``capacity`` grow by doubling when needed and shrink when freeing leaves them at
most a quarter used, so memory follows the live slots and their longest cached
context (the bound is in docs/speculative.md, "Draft memory");
:attr:`LlamaDraftModel.kv_bytes` says what it holds now.
"""

from __future__ import annotations

import heapq
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from ..models.dirs import ModelDirError, check_model_dir
from .draft_format import DraftFormatError, load_tensors
from .host_memory import release_freed_memory

__all__ = ["DraftModelError", "LlamaDraftModel"]

_STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


class DraftModelError(ValueError):
    """A draft checkpoint the lean forward cannot run (names the setting and value)."""


def _rope_tables(model_dir: Path, cfg: dict, head_dim: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[length, head_dim]`` in float32, as transformers computes them."""
    params = dict(cfg.get("rope_parameters") or {})
    legacy = cfg.get("rope_scaling") or {}
    params = {**legacy, **params}
    rope_type = params.get("rope_type", params.get("type", "default"))
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if rope_type not in _STATIC_ROPE_TYPES:
        raise DraftModelError(
            f"{model_dir}: rope type {rope_type!r} is not supported by the draft engine "
            f"(supported: {', '.join(_STATIC_ROPE_TYPES)})"
        )
    if rope_type == "default":
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        scaling = 1.0
    else:
        from transformers import AutoConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        hf_config = AutoConfig.from_pretrained(str(model_dir), trust_remote_code=False)
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu")
        inv_freq = inv_freq.float()
    positions = torch.arange(length, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * scaling, emb.sin() * scaling


def _next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, n - 1).bit_length()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _Layer:
    __slots__ = ("ln_in", "qkv", "qkv_b", "o", "o_b", "ln_post", "gate_up", "gate_up_b", "down", "down_b")


class LlamaDraftModel:
    """A Llama checkpoint loaded for drafting.

    ``max_len`` bounds the positions a request can reach (the framework's
    ``max_model_len``); the RoPE tables are built for it once. ``target_dir`` is
    the target model's directory, needed by drafts that borrow its tensors.
    """

    def __init__(self, model_dir: str | Path, *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", max_len: int = 2048, initial_slots: int = 8,
                 target_dir: str | Path | None = None):
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
        cos, sin = _rope_tables(self.model_dir, cfg, self.head_dim, max_len)
        self._cos, self._sin = cos.to(self.device, dtype), sin.to(self.device, dtype)
        self._load_weights(bool(cfg.get("tie_word_embeddings", False)))
        self._capacity = 0
        self._num_slots = 0
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        self._free_rows: list[int] = []  # rows of the cache tensors no request holds
        self._free_handles: list[int] = []  # a heap: the lowest free handle is reused first
        self._num_handles = 0
        self._live_rows: dict[int, int] = {}  # slot handle -> row
        self._used = torch.zeros(0, dtype=torch.long, device=self.device)  # per row: positions cached
        self._row_of = torch.zeros(1, dtype=torch.long, device=self.device)
        self._min_slots, self._min_capacity = max(1, initial_slots), min(max_len, 128)
        self._grow(slots=self._min_slots, capacity=self._min_capacity)

    # ---------------------------------------------------------------- weights

    def _load_weights(self, tied: bool) -> None:
        # safetensors only: a pickle (pytorch_model.bin, *.pt) can run code when loaded
        try:
            check_model_dir(self.model_dir)
            tensors, spec = load_tensors(self.model_dir, self.target_dir)
        except (DraftFormatError, ModelDirError) as exc:
            raise DraftModelError(str(exc)) from None

        def take(name: str, required: bool = True) -> torch.Tensor | None:
            t = tensors.get(name)
            if t is None:
                if required:
                    raise DraftModelError(f"{self.model_dir}: weight {name!r} is missing from the safetensors files")
                return None
            return t.to(self.device, self.dtype).contiguous()

        def cat(*names: str, required: bool = True) -> torch.Tensor | None:
            parts = [take(n, required) for n in names]
            return None if any(p is None for p in parts) else torch.cat(parts, dim=0)

        self.embed = take("model.embed_tokens.weight")
        if self.embed.shape != (self.vocab_size, self.hidden_size):
            raise DraftModelError(
                f"{self.model_dir}: embed_tokens has shape {tuple(self.embed.shape)}, "
                f"config.json says ({self.vocab_size}, {self.hidden_size})"
            )
        self.norm = take("model.norm.weight")
        lm_head = take("lm_head.weight", required=not tied)
        self.lm_head = self.embed if lm_head is None else lm_head
        #: token ids of the head's rows (``None``: the whole vocabulary)
        self.head_vocab: torch.Tensor | None = None
        if spec is not None and spec.head_vocab:
            ids = tensors.get(spec.head_vocab)
            if ids is None or ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64):
                raise DraftModelError(
                    f"{self.model_dir}: head_vocab tensor {spec.head_vocab!r} is missing or not a 1-d integer tensor"
                )
            ids = ids.to(torch.long)
            if len(ids) == 0 or int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
                raise DraftModelError(f"{self.model_dir}: head_vocab ids must lie in 0..{self.vocab_size - 1}")
            self.head_vocab = ids.to(self.device)
            self.lm_head = self.lm_head.index_select(0, self.head_vocab).contiguous()
        self.layers: list[_Layer] = []
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            layer = _Layer()
            layer.ln_in = take(p + "input_layernorm.weight")
            layer.ln_post = take(p + "post_attention_layernorm.weight")
            attn = [p + f"self_attn.{x}_proj" for x in "qkv"]
            layer.qkv = cat(*(a + ".weight" for a in attn))
            layer.qkv_b = cat(*(a + ".bias" for a in attn), required=False)
            layer.o = take(p + "self_attn.o_proj.weight")
            layer.o_b = take(p + "self_attn.o_proj.bias", required=False)
            layer.gate_up = cat(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
            layer.gate_up_b = cat(p + "mlp.gate_proj.bias", p + "mlp.up_proj.bias", required=False)
            layer.down = take(p + "mlp.down_proj.weight")
            layer.down_b = take(p + "mlp.down_proj.bias", required=False)
            expect_qkv = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
            if layer.qkv.shape != (expect_qkv, self.hidden_size):
                raise DraftModelError(
                    f"{self.model_dir}: layer {i} q/k/v projections have {layer.qkv.shape[0]} rows, "
                    f"config.json implies {expect_qkv}"
                )
            self.layers.append(layer)
        #: bytes of weights one forward reads (the embedding table only by row):
        #: the size-based estimate of what a forward costs on memory-bound hardware
        self.forward_bytes = sum(
            t.numel() * t.element_size()
            for layer in self.layers for t in (getattr(layer, n) for n in _Layer.__slots__) if t is not None
        ) + (self.norm.numel() + self.lm_head.numel()) * self.lm_head.element_size()

    def greedy(self, logits: torch.Tensor) -> torch.Tensor:
        """Token ids of the argmax of :meth:`forward`'s logits (through ``head_vocab``)."""
        best = logits.argmax(dim=-1)
        return best if self.head_vocab is None else self.head_vocab[best]

    # --------------------------------------------------------------- KV slots
    #
    # A request's slot is a handle; ``_row_of[handle]`` is its row in the cache
    # tensors, so that shrinking can compact the live rows without the holders of
    # handles noticing. Growth doubles (rows when none is free, positions when a
    # forward needs more); shrinking happens when a slot is freed and the live
    # slots use at most a quarter of the rows, or their longest cached context at
    # most a quarter of the positions: both go down to the next power of two at or
    # above the need (never below the initial size). A shrink leaves the cache at
    # least half used and a grow needs twice that, so the two cannot alternate.

    def _grow(self, *, slots: int | None = None, capacity: int | None = None) -> None:
        new_slots = max(slots or 0, self._num_slots)
        new_cap = min(max(capacity or 0, self._capacity), self.max_len)
        if new_slots == self._num_slots and new_cap == self._capacity:
            return
        self._resize(new_slots, new_cap)

    @torch.inference_mode()  # forward's tensors are inference tensors: update them in kind
    def _resize(self, new_slots: int, new_cap: int) -> None:
        """Reallocate every layer's K/V as ``[new_slots, Hkv, new_cap, D]``; live rows
        move to rows ``0..live-1`` (in handle order), keeping ``min(used, new_cap)``
        positions (callers never cut below a live row's used length)."""
        live = sorted(self._live_rows.items())
        old_rows = torch.tensor([row for _, row in live], dtype=torch.long, device=self.device)
        keep = min(self._capacity, new_cap)
        shape = (new_slots, self.num_kv_heads, new_cap, self.head_dim)
        for caches in (self.k_cache, self.v_cache):
            for layer in range(self.num_layers):
                # zeros, not empty: padded queries may read past a row's length
                fresh = torch.zeros(shape, dtype=self.dtype, device=self.device)
                if layer < len(caches):
                    if live:
                        fresh[: len(live), :, :keep] = caches[layer][:, :, :keep].index_select(0, old_rows)
                    caches[layer] = fresh
                else:
                    caches.append(fresh)
        used = torch.zeros(new_slots, dtype=torch.long, device=self.device)
        if live:
            used[: len(live)] = self._used.index_select(0, old_rows)
        self._used = used
        for new_row, (handle, _) in enumerate(live):
            self._live_rows[handle] = new_row
        self._free_rows = list(range(new_slots - 1, len(live) - 1, -1))  # pop() takes the lowest
        self._num_slots, self._capacity = new_slots, new_cap
        self._sync_rows()

    def _sync_rows(self) -> None:
        """Rebuild the device table handle -> row (free handles point at row 0)."""
        table = [0] * self._num_handles
        for handle, row in self._live_rows.items():
            table[handle] = row
        self._row_of = torch.tensor(table or [0], dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def alloc_slot(self) -> int:
        """A free slot handle for a new request (grows the rows by doubling if none is free)."""
        if not self._free_rows:
            self._grow(slots=max(1, 2 * self._num_slots))
        row = self._free_rows.pop()
        if self._free_handles:
            handle = heapq.heappop(self._free_handles)
        else:
            handle, self._num_handles = self._num_handles, self._num_handles + 1
        self._live_rows[handle] = row
        self._used[row] = 0
        self._sync_rows()
        return handle

    @torch.inference_mode()
    def free_slot(self, slot: int) -> None:
        """Give a request's slot back; shrinks the cache when it is mostly unused."""
        row = self._live_rows.pop(slot, None)
        if row is None:
            return  # freed twice, or never allocated: nothing to give back
        self._used[row] = 0
        self._free_rows.append(row)
        heapq.heappush(self._free_handles, slot)
        self._maybe_shrink()
        self._sync_rows()

    def _maybe_shrink(self) -> None:
        live = len(self._live_rows)
        longest = int(self._used.max()) if live else 0
        new_slots, new_cap = self._num_slots, self._capacity
        if 4 * live <= self._num_slots:
            new_slots = max(self._min_slots, _next_pow2(live))
        if 4 * longest <= self._capacity:
            new_cap = min(self.max_len, max(self._min_capacity, _next_pow2(longest)))
        if new_slots < self._num_slots or new_cap < self._capacity:
            self._resize(min(new_slots, self._num_slots), min(new_cap, self._capacity))
            if self.device.type == "cpu":
                release_freed_memory()  # else the C heap keeps the old, larger cache's pages

    @property
    def num_free_slots(self) -> int:
        return len(self._free_rows)

    @property
    def num_slots(self) -> int:
        """Rows of the KV cache (live + free)."""
        return self._num_slots

    @property
    def capacity(self) -> int:
        """Positions per row of the KV cache."""
        return self._capacity

    @property
    def kv_bytes(self) -> int:
        """Bytes the draft KV cache holds now (K and V, every layer); O(1)."""
        itemsize = torch.empty(0, dtype=self.dtype).element_size()
        return (2 * self.num_layers * self._num_slots * self.num_kv_heads * self._capacity
                * self.head_dim * itemsize)

    def cache_bytes(self) -> int:
        return self.kv_bytes

    # ---------------------------------------------------------------- forward

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # in float32 and scaled after the cast back, as transformers' LlamaRMSNorm does
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return weight * normed.to(self.dtype)

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
        """
        B, T = tokens.shape
        device = self.device
        arange_t = torch.arange(T, device=device)
        pos = start[:, None] + arange_t[None, :]
        kv_len = int((start + q_lens).max())
        if kv_len > self.max_len:
            raise DraftModelError(f"context of {kv_len} tokens exceeds the draft engine's max_len {self.max_len}")
        if kv_len > self._capacity:
            self._grow(capacity=max(kv_len, 2 * self._capacity))
        slots = self._row_of[slots]  # handles -> rows (after any growth: it may move rows)
        self._used[slots] = start + q_lens  # what lies beyond is stale: rewound drafts
        if T == 1:
            w_slot, w_pos, w_b, w_t = slots, start, torch.arange(B, device=device), None
        else:
            valid = arange_t[None, :] < q_lens[:, None]
            w_b, w_t = valid.nonzero(as_tuple=True)
            w_slot, w_pos = slots[w_b], pos[w_b, w_t]
        pos_c = pos.clamp(max=self.max_len - 1)
        cos = self._cos[pos_c][:, :, None, :]  # [B, T, 1, D]
        sin = self._sin[pos_c][:, :, None, :]
        # key j is visible to query (b, t) iff j <= pos[b, t]; padded queries see
        # zeros or stale keys of their own slot and are discarded
        mask = torch.arange(kv_len, device=device)[None, None, None, :] <= pos[:, None, :, None]
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        x = F.embedding(tokens, self.embed)
        for i, layer in enumerate(self.layers):
            h = self._rms_norm(x, layer.ln_in)
            qkv = F.linear(h, layer.qkv, layer.qkv_b)
            # q and k rotated together: one set of RoPE ops per layer
            qk = qkv[..., : (H + Hkv) * D].view(B, T, H + Hkv, D)
            qk = qk * cos + _rotate_half(qk) * sin
            q, k = qk.split((H, Hkv), dim=2)
            v = qkv[..., (H + Hkv) * D :].view(B, T, Hkv, D)
            kc, vc = self.k_cache[i], self.v_cache[i]
            if w_t is None:
                kc[w_slot, :, w_pos] = k[:, 0]
                vc[w_slot, :, w_pos] = v[:, 0]
            else:
                kc[w_slot, :, w_pos] = k[w_b, w_t]
                vc[w_slot, :, w_pos] = v[w_b, w_t]
            # [B, Hkv, L, D]; index_select of the sliced view copies only L positions
            # (4-5x faster than advanced indexing kc[slots, :, :kv_len] on CPU at batch 8)
            keys = kc[:, :, :kv_len].index_select(0, slots)
            values = vc[:, :, :kv_len].index_select(0, slots)
            attn = F.scaled_dot_product_attention(
                q.transpose(1, 2), keys, values, attn_mask=mask, scale=self.scale, enable_gqa=Hkv != H
            )
            x = x + F.linear(attn.transpose(1, 2).reshape(B, T, H * D), layer.o, layer.o_b)
            h = self._rms_norm(x, layer.ln_post)
            gate, up = F.linear(h, layer.gate_up, layer.gate_up_b).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.down, layer.down_b)
        last = x[torch.arange(B, device=device), q_lens - 1]
        return F.linear(self._rms_norm(last, self.norm), self.lm_head).float()
