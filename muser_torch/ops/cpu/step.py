"""The CPU's layer runner: a step's layers (``models/layer_plan.py``'s plans)
on the library, one call of ``decode.c``'s ``muser_decode_block`` per layer
(one new token of each of B sequences) or ``muser_extend_block`` (T new tokens
of one sequence), instead of about a hundred torch ops per layer.

It runs plans whose tensors are plain float32 CPU tensors (norms, caches,
biases; projections of a type the library runs) and steps on plain eager
CPU float32 activations (``eager.plain_eager``: nothing that must see the
ops is active); anything else it declines (``why_not``, ``takes``), and the
step runs the torch modules."""
from __future__ import annotations

import ctypes
from typing import Collection, Sequence

import torch

from . import BACK_TO_BACK_THREAD_MIN_BYTES, FUSED_MAX_TOKENS
from . import block as cb
from .build import _native_lib
from .eager import plain_eager, profiling, recorded

__all__ = ["CpuLayers"]

def _plain_f32(t: torch.Tensor | None) -> bool:
    return t is None or (t.dtype is torch.float32 and t.is_cpu and t.is_contiguous())


def _block(plan) -> "cb.Block | str":
    """The plan as decode.c's block, or why it is not one the library runs."""
    norms = {}
    for name, n in plan.norms.items():
        if not _plain_f32(n.weight):
            return f"{name} is not a float32 CPU tensor"
        norms[name] = cb.norm(n.weight, n.eps)
    linears = {}
    for name, p in plan.linears.items():
        if p is None:
            linears[name] = cb.ABSENT
            continue
        made = None
        if p.packed.is_cpu and _plain_f32(p.bias):
            made = cb.linear(p.packed, p.qtype, p.n_out, p.n_in, p.scales, p.scale_2, p.numerics,
                             p.bias, p.repacked)
        if made is None:
            return f"{name}: a weight type, device or bias the library does not run"
        linears[name] = made
    ring = plan.k_cache.shape[1:]
    if not (_plain_f32(plan.k_cache) and _plain_f32(plan.v_cache)
            and ring == (ring[0], plan.n_kv, plan.head_dim) and plan.v_cache.shape == plan.k_cache.shape):
        return "a KV cache that is not float32 on the CPU"
    return cb.Block(hidden=plan.hidden, n_heads=plan.n_heads, n_kv=plan.n_kv,
                    head_dim=plan.head_dim, ffn=plan.ffn, **norms, **linears,
                    rope=cb.ROPE[plan.rope], act=cb.ACTIVATIONS[plan.act], n_rot=plan.n_rot,
                    mscale=plan.mscale, scale=plan.scale, k_cache=plan.k_cache.data_ptr(),
                    v_cache=plan.v_cache.data_ptr(), capacity=ring[0], ggml=int(ggml_layer(plan)),
                    scale_q=int(plan.scale_q))


def ggml_layer(plan) -> bool:
    """Whether the layer runs in ggml's numerics: every projection does, so the
    rest of the block (norms, RoPE, f16 K/V, attention, GELU) follows ggml-cpu too."""
    parts = [p for p in plan.linears.values() if p is not None]
    return bool(parts) and all(p.numerics == "ggml" for p in parts)


def ggml_rope(inv_freq: torch.Tensor) -> tuple[float, float] | None:
    """(theta_scale, freq_scale) of ggml's rope cache for a RoPE table that is
    ``freq_scale * base ** (-2i / n_rot)``: its running product reproduces the
    table to 1e-5; None for a table of another shape (per-frequency factors,
    YaRN), whose angles stay the table's."""
    inv = inv_freq.double()
    if inv.numel() < 2 or inv[0] <= 0:
        return None
    freq_scale = float(inv[0])
    theta_scale = float(torch.tensor(float(inv[1] / inv[0]), dtype=torch.float32))
    steps = torch.full((inv.numel(),), theta_scale, dtype=torch.float64)
    steps[0] = 1.0
    if not torch.allclose(freq_scale * steps.cumprod(0), inv, rtol=1e-5, atol=0.0):
        return None
    return theta_scale, freq_scale


def _unfit_rope(plan, inv_freqs: Sequence[torch.Tensor]) -> str | None:
    if plan.rope == "none":
        return None
    # a rotating layer's table holds its n_rot / 2 frequencies, as float32
    slot = plan.rope_slot
    if slot >= len(inv_freqs) or not _plain_f32(inv_freqs[slot]):
        return f"RoPE table {slot} is missing or not float32"
    if 2 * inv_freqs[slot].numel() != plan.n_rot:
        return f"RoPE table {slot} has {inv_freqs[slot].numel()} frequencies for {plan.n_rot} features"
    return None


def _tensors(plan) -> list[torch.Tensor]:
    out = [n.weight for n in plan.norms.values()] + [plan.k_cache, plan.v_cache]
    for p in plan.linears.values():
        if p is not None:
            out += [p.packed, p.scales, p.scale_2, p.bias, p.repacked]
    return [t for t in out if isinstance(t, torch.Tensor)]


class CpuLayers:
    """The plans of one model's layers as decode.c blocks, and the scratch they share."""

    def __init__(self, plans: Sequence, inv_freqs: Sequence[torch.Tensor], extend_rows: int) -> None:
        """``extend_rows``: the longest run of one sequence's new tokens a step
        hands over (``models/layer_plan.py``'s ``EXTEND_MAX_TOKENS``), which
        sizes the scratch."""
        self.lib = lib = _native_lib()
        self.extend_rows = extend_rows
        self.blocks: list = []
        self.why_not = None if lib is not None else "the CPU library is not built"
        for i, plan in enumerate(plans if lib is not None else ()):
            made = _block(plan)
            why = made if isinstance(made, str) else _unfit_rope(plan, inv_freqs)
            if why is not None:
                self.why_not = f"layer {i}: {why}"
                break
            self.blocks.append(made)
        # every storage a block points at, kept alive (see muser_torch/changes.py)
        self.storages = [t.untyped_storage() for plan in plans for t in _tensors(plan)] + \
            [t.untyped_storage() for t in inv_freqs]
        self.rope_slots = [plan.rope_slot for plan in plans]
        # ggml's numerics in every layer: runs of any length, the RoPE angles as ggml's rope cache
        self.ggml = bool(plans) and all(ggml_layer(plan) for plan in plans)
        self.ggml_ropes = [ggml_rope(inv) if self.ggml else None for inv in inv_freqs]
        ok = self.why_not is None
        # what each step's rows must fit: the slots every cache holds, the hidden width
        self.slots = min((p.k_cache.shape[0] for p in plans), default=0) if ok else 0
        self.capacity = min((p.k_cache.shape[1] for p in plans), default=0) if ok else 0
        self.hidden = {p.hidden for p in plans} if ok else set()
        self.work = self.refs = None
        if ok:
            need = max(cb.block_work(lib, b, max(FUSED_MAX_TOKENS, extend_rows)) for b in self.blocks)
            self.work = torch.empty(need)
            self.refs = [ctypes.byref(b) for b in self.blocks]

    @staticmethod
    def accepts(x: torch.Tensor) -> bool:
        """Whether activations ``x`` may take the library at all: plain eager
        float32 (asked before a plan is built: a compiled, traced or
        mode-watched step runs the modules, and builds nothing)."""
        return x.dtype is torch.float32 and plain_eager(x)

    def takes(self, x: torch.Tensor, n_slots: int) -> bool:
        """Whether a step of activations ``x [B, T, hidden]`` (one token of B
        sequences, or up to ``extend_rows`` of one; in ggml's numerics a run of
        any length up to the smallest ring) in a cache of ``n_slots`` runs here."""
        B, T, hidden = x.shape
        return (self.why_not is None and self.accepts(x)
                and (T == 1 and B <= FUSED_MAX_TOKENS or B == 1 and (T <= self.extend_rows or self.ggml))
                and n_slots <= self.slots and self.hidden == {hidden} and T <= self.capacity)

    def __call__(self, x: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor,
                 inv_freqs: Sequence[torch.Tensor],
                 keep: Collection[int] = ()) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """x ``[B, T, hidden]`` through every layer (a new tensor), and a copy
        of the output of each layer in ``keep``; slots and lengths ``[B]``
        int64, ``inv_freqs`` the model's RoPE tables. ``T`` is 1 (B sequences,
        each at its length), or B is 1 (T new tokens of one sequence:
        positions length .. length+T-1)."""
        B, T, _ = x.shape
        x = x.contiguous().clone()
        slots, lengths = slots.contiguous(), lengths.contiguous()
        positions = lengths if T == 1 else torch.arange(T) + lengths
        lib, rows = self.lib, B * T
        angles = []
        for inv, ggml in zip(inv_freqs, self.ggml_ropes):   # cos and sin of each table (no torch ops)
            inv = inv.contiguous()
            half = inv.numel()
            cos, sin = torch.empty(rows, half), torch.empty(rows, half)
            if ggml is not None:    # as ggml's rope cache
                lib.muser_rope_angles_ggml(positions.data_ptr(), rows, *ggml, half, cos.data_ptr(),
                                           sin.data_ptr())
            else:                   # as parts.rope_angles
                lib.muser_rope_angles(positions.data_ptr(), rows, inv.data_ptr(), half,
                                      cos.data_ptr(), sin.data_ptr())
            angles.append((cos.data_ptr(), sin.data_ptr(), cos, sin))
        work = self.work
        if rows > max(FUSED_MAX_TOKENS, self.extend_rows):   # a long ggml-numerics run: its own scratch
            work = torch.empty(max(cb.block_work(lib, b, rows) for b in self.blocks))
        threads, xp, wp = torch.get_num_threads(), x.data_ptr(), work.data_ptr()
        if T == 1:
            run, name, where = lib.muser_decode_block, "muser::decode_block", (B, slots.data_ptr(),
                                                                              lengths.data_ptr())
        else:
            run, name, where = lib.muser_extend_block, "muser::extend_block", (T, int(slots[0]),
                                                                              int(lengths[0]))
        outputs = {}
        for i, (ref, k) in enumerate(zip(self.refs, self.rope_slots)):
            c, s = angles[k][:2] if angles else (None, None)
            args = (ref, xp, *where, c, s, wp, threads, BACK_TO_BACK_THREAD_MIN_BYTES)
            rc = recorded(name, run, *args) if profiling() else run(*args)
            if rc:
                raise RuntimeError(f"{name} failed ({rc}: -1 a projection it does not run, "
                                   f"-2 no memory, -3 a negative length or slot)")
            if i in keep:
                outputs[i] = x.clone()
        return x, outputs
