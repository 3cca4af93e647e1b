"""Muse Glimmer (``arch/muse_glimmer.py`` holds the facts), as llama.cpp's
``muse-glimmer.cpp`` computes it and transformers' ``MuseGlimmerTextModel``
defines it:

* the embedding passes a weightless RMSNorm (the model's eps);
* sandwich blocks: ``x + post_norm(attn(pre_norm(x)))`` and the same around
  the SwiGLU MLP; the post-norms use eps 1e-8;
* attention: per-head RMSNorm of q and k with the file's weights (q's holds
  ``qk_scale_factor``), RoPE in ggml's "normal" pair layout on sliding-window
  layers only (NoPE on global ones), scale 1/sqrt(head_dim), GQA, the output
  times ``sigmoid(attn_gate(x))`` before ``attn_output``;
* logits: the untied lm_head times ``logit_scale``, then ``c * tanh(l / c)``.

Projections are plain ``torch.nn.Linear`` when the model is built from a config
(that is how the demo is trained); ``from_gguf`` and ``random`` put
``QLinear`` / ``QEmbedding`` over packed bytes in their place, so the forward
code is the same for float and packed weights."""
from __future__ import annotations

import os
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from ..arch.glimmer_recipe import recipe_weight
from ..arch.muse_glimmer import MUSE_GLIMMER, POST_NORM_EPS, GlimmerConfig
from ..errors import ImageError
from ..gguf_io import load_gguf
from ..vision import VisionTower
from ..vision import prompt as vision_prompt
from .assembly import assemble
from .decoder import Decoder
from .vision_engine import vision_engine
from .parts import Attention, GatedMLP, SandwichBlock, no_rope, rope_inv_freq, rope_normal

__all__ = ["Glimmer", "GlimmerBlock", "no_rope"]


class GlimmerBlock(SandwichBlock):
    def __init__(self, config: GlimmerConfig, layer: int):
        c = config
        sliding = not c.is_global(layer)
        attention = Attention(c.hidden, c.n_heads, c.n_kv_heads, c.head_dim,
                              window=c.sliding_window if sliding else None,
                              rope=rope_normal if sliding else no_rope,
                              qk_norm_eps=c.rms_eps, gate=True)
        super().__init__(c.hidden, c.rms_eps, POST_NORM_EPS, attention,
                         GatedMLP(c.hidden, c.ffn, F.silu))


class Glimmer(Decoder):
    ARCH = MUSE_GLIMMER

    def __init__(self, config: GlimmerConfig):
        super().__init__(config, [GlimmerBlock(config, il) for il in range(config.n_layers)],
                         final_softcap=config.final_softcap)
        self.vision: VisionTower | None = None   # the mmproj's tower, when loaded with one

    def rope_tables(self) -> list[torch.Tensor]:
        # Only the sliding layers rotate, with their own base, never scaled.
        return [rope_inv_freq(self.config.head_dim, self.config.swa_base)]

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        # weightless RMSNorm in float32 (llama.cpp's build_norm with no weight)
        x = self.tok_embeddings(tokens).float()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.config.rms_eps)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        # scale and cap in float32, returned in the activation dtype as every model's logits
        logits = self.output(x)
        cap = self.config.final_softcap
        return (torch.tanh(logits.float() * (self.config.logit_scale / cap)) * cap).to(logits.dtype)

    @classmethod
    def build(cls, config: GlimmerConfig, groups: frozenset[str]) -> "Glimmer":
        return cls(config)

    @classmethod
    def random(cls, config: GlimmerConfig, device: torch.device | str | None = None,
               dtype: torch.dtype | None = None, seed: int = 0) -> "Glimmer":
        """Random packed weights made directly on ``device`` in the lane's recipe
        (``config.weight_precision`` picks the lane; ``arch/glimmer_recipe.py``), at any
        shape including the full 52-layer geometry: random bytes with sane
        scale fields, no file and no float copy of any weight. ``dtype`` defaults
        as ``from_gguf``'s does."""
        device = torch.device(device if device is not None else "cpu")
        gen = torch.Generator(device=device).manual_seed(seed)

        def get(name, n_out, n_in):
            return recipe_weight(config, name, n_out, n_in, gen, device)

        return assemble(cls, config, frozenset(), get, device, dtype or cls.default_dtype(device), None)

    # -- vision (the mmproj file) ------------------------------------------------------

    @classmethod
    def from_gguf(cls, path: str | os.PathLike, device: torch.device | str | None = None,
                  dtype: torch.dtype | None = None, progress: bool = False,
                  mmproj: str | os.PathLike | None = None) -> "Glimmer":
        """``Decoder.from_gguf``; ``mmproj``: llama.cpp's vision projector file for
        this model, whose tower and adapter then turn images into prompt rows."""
        model = cls.from_file(load_gguf(path), device, dtype, progress)
        if mmproj is not None:
            model.attach_vision(mmproj)
        return model

    def attach_vision(self, mmproj: str | os.PathLike) -> None:
        """Load the vision tower from an ``mmproj`` file (admitted against this
        model's width: VisionMismatchError for another model's projector)."""
        tower = VisionTower.from_gguf(load_gguf(mmproj), text_hidden=self.config.hidden)
        self.vision = tower.to(self.lengths.device)

    def placeholder_ids(self) -> tuple[int | None, int | None]:
        """The image and video placeholder ids of the file's tokenizer (None where it has none)."""
        return (vision_prompt.token_id(self.tokenizer, vision_prompt.IMAGE_TOKEN),
                vision_prompt.token_id(self.tokenizer, vision_prompt.VIDEO_TOKEN))

    def prepare_visual(self, images: Sequence[Any] = (), videos: Sequence[Any] = ()):
        """Images and videos (paths, bytes, PIL images; a video a list of frames)
        preprocessed for the tower: ``VisualInput`` s, whose ``grid.rows(merge)``
        is the number of placeholders each takes."""
        if self.vision is None:
            raise ImageError("this model was loaded without a vision projector: "
                             "from_gguf(path, mmproj=MMPROJ) to give it images")
        return vision_prompt.prepare(self.vision, images, videos)

    @torch.no_grad()
    def visual_rows(self, inputs: Sequence[Any], engine: Any = "auto") -> list[torch.Tensor]:
        """Each input's embedding rows: the tower and adapter, then the text
        model's weightless RMSNorm (as every embedding row), in float32.

        The tower runs on the vision engine (``models/vision_engine.py``): on
        CUDA recorded once per patch grid and replayed (``engine="auto"``, the
        default; ``"graph"`` insists on recording, ``"eager"`` launches every
        kernel from Python; a ``VisionEngine`` of this tower is used as it is)."""
        out = []
        runner = vision_engine(self.vision, engine)
        for x in inputs:
            r = runner.rows(x.pixels, x.grid).float()
            out.append(r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + self.config.rms_eps))
        return out

    def vision_embeds(self, ids: torch.Tensor, images: Sequence[Any] = (), videos: Sequence[Any] = (),
                      image_token_id: int | None = None, video_token_id: int | None = None,
                      engine: Any = "auto") -> tuple[torch.Tensor, torch.Tensor]:
        """``forward``'s ``embeds`` for prompt ``ids`` ``[B, T]`` holding the
        placeholders (``engine``: ``visual_rows``')."""
        inputs = self.prepare_visual(images, videos)
        img_id, vid_id = self.placeholder_ids()
        img_id = image_token_id if image_token_id is not None else img_id
        vid_id = video_token_id if video_token_id is not None else vid_id
        rows = self.visual_rows(inputs, engine)
        return vision_prompt.placeholder_rows(ids, inputs, rows, self.vision.config.merge, img_id, vid_id)

    def video_prompt(self, inputs: Sequence[Any]) -> list[int]:
        """The token blocks of preprocessed, timed videos (``vision.Video``), one
        after another, as transformers' processor writes them
        (``vision_prompt.video_block``)."""
        out: list[int] = []
        for x in inputs:
            out += vision_prompt.video_block(self.tokenizer, x, self.vision.config.merge)
        return out

    def image_prompt(self, inputs: Sequence[Any]) -> list[int]:
        """The token blocks of preprocessed images, one after another (``<|image_start|>``,
        a ``<|patch|>`` per row, ``<|image_end|>``)."""
        out: list[int] = []
        for x in inputs:
            out += vision_prompt.image_block(self.tokenizer, x.grid.rows(self.vision.config.merge))
        return out
