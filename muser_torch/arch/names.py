"""llama.cpp's tensor names, each once: its GGUF name, the module it becomes
in our models, its role and its GGUF ``ne`` in config terms. An
architecture's tensor table lists the names it has, in file order
(``tensor_table``), as llama.cpp lists each architecture's tensors against
one table of names (``llama-arch.cpp``)."""
from __future__ import annotations

from dataclasses import replace

from .spec import Role, TensorSpec

__all__ = ["TENSOR_NAMES", "optional", "tensor_table"]

# short name, GGUF name and module path ({i}: the layer), role, GGUF ne in config terms
_TABLE = """
token_embd          token_embd.weight                  tok_embeddings                 embedding  hidden vocab_size
rope_freqs          rope_freqs.weight                  rope_freqs                     norm       rope_pairs
attn_norm           blk.{i}.attn_norm.weight           layers.{i}.attention_norm      norm       hidden
attn_q              blk.{i}.attn_q.weight              layers.{i}.attention.wq        projection hidden q_dim
attn_k              blk.{i}.attn_k.weight              layers.{i}.attention.wk        projection hidden kv_dim
attn_v              blk.{i}.attn_v.weight              layers.{i}.attention.wv        projection hidden kv_dim
attn_gate           blk.{i}.attn_gate.weight           layers.{i}.attention.wgate     projection hidden q_dim
attn_q_norm         blk.{i}.attn_q_norm.weight         layers.{i}.attention.q_norm    norm       head_dim
attn_k_norm         blk.{i}.attn_k_norm.weight         layers.{i}.attention.k_norm    norm       head_dim
attn_q_bias         blk.{i}.attn_q.bias                layers.{i}.attention.wq.bias   bias       q_dim
attn_k_bias         blk.{i}.attn_k.bias                layers.{i}.attention.wk.bias   bias       kv_dim
attn_v_bias         blk.{i}.attn_v.bias                layers.{i}.attention.wv.bias   bias       kv_dim
attn_output         blk.{i}.attn_output.weight         layers.{i}.attention.wo        projection q_dim hidden
post_attention_norm blk.{i}.post_attention_norm.weight layers.{i}.post_attention_norm norm       hidden
ffn_norm            blk.{i}.ffn_norm.weight            layers.{i}.ffn_norm            norm       hidden
ffn_gate            blk.{i}.ffn_gate.weight            layers.{i}.feed_forward.w_gate projection hidden ffn
ffn_up              blk.{i}.ffn_up.weight              layers.{i}.feed_forward.w_up   projection hidden ffn
ffn_down            blk.{i}.ffn_down.weight            layers.{i}.feed_forward.w_down projection ffn hidden
post_ffw_norm       blk.{i}.post_ffw_norm.weight       layers.{i}.post_ffw_norm       norm       hidden
output_norm         output_norm.weight                 norm                           norm       hidden
output              output.weight                      output                         projection hidden vocab_size
fc                  fc.weight                          fc                             projection fc_in hidden
enc_output_norm     enc.output_norm.weight             enc_norm                       norm       hidden
"""
# attn_gate is Glimmer's sigmoid output gate (per feature of the attention output).
# A bias row follows its weight's row in a table: it goes onto that QLinear.
# fc / enc_output_norm: a DFlash draft's encoder of the target's tapped hidden states
# (fc_in = taps x hidden).
# rope_freqs: Llama 3's per-pair RoPE frequency divisors (rope_pairs = n_rot / 2).


def _parse(table: str) -> dict[str, TensorSpec]:
    out = {}
    for line in table.strip().splitlines():
        short, name, module, role, *ne = line.split()
        out[short] = TensorSpec(name, module, Role(role), tuple(ne))
    return out


TENSOR_NAMES: dict[str, TensorSpec] = _parse(_TABLE)


def optional(short: str, group: str, tied_to: str | None = None) -> TensorSpec:
    """Tensor ``short`` as a member of optional ``group`` (on every layer or
    none); with ``tied_to``, the module reuses that tensor when it is absent."""
    tied = TENSOR_NAMES[tied_to].name if tied_to is not None else None
    return replace(TENSOR_NAMES[short], group=group, tied_to=tied)


def tensor_table(*entries: "str | TensorSpec") -> tuple[TensorSpec, ...]:
    """An architecture's table: short names (required tensors) and
    ``optional(...)`` rows, in file order."""
    return tuple(TENSOR_NAMES[e] if isinstance(e, str) else e for e in entries)
