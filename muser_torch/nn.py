"""``QLinear`` and ``QEmbedding``: modules over packed weights.

The packed bytes are buffers, so ``.to(device)`` moves them and
``state_dict()`` carries them:

* ``packed``: uint8 ``[n_out, row_bytes]`` (its shape carries n_out);
* ``scales`` (uint8 E4M3FN ``[n_out, n_in/16]``) and ``scale_2`` (float32
  ``[1]``): NVFP4_E2M1 only, otherwise absent;
* the extra state ``{"qtype": name, "n_out": int, "n_in": int}`` carries the
  rest, so ``load_state_dict`` restores (and checks) the type and width.

``module.half()`` / ``.to(dtype)`` leave the bytes alone and keep ``scale_2``
float32; the activation dtype is whatever x arrives in.

``QLinear.numerics`` picks the matmul's arithmetic (``NUMERICS``): ``"exact"``
(float activations, ``muser::qmatmul``) or ``"ggml"`` (activations quantized
per block as ggml-cpu does, integer dot products: ``muser::qmatmul_ggml``,
CPU only); :func:`set_numerics` sets it on every QLinear of a model.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn
from tqdm import tqdm

from . import changes, ops
from .formats.types import NEEDS_COMPANIONS, GGMLType
from .formats.companions import companion_args
from .gguf_io import pages
from .ops.cpu import build_now as build_cpu_kernels
from .ops.cpu import embedding as cpu_embedding
from .ops.cpu import packed as cpu_packed
from .ops.cpu.eager import Projection, plain_eager, profiling, recorded

_OP = {"exact": "muser::qmatmul", "ggml": "muser::qmatmul_ggml"}   # what a profile calls a QLinear


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class _Packed(nn.Module):
    """Holds one packed matrix and its companions; shared by both modules."""

    def __init__(self, packed: Tensor, qtype, n_out: int, n_in: int,
                 scales: Tensor | None = None, scale_2=None) -> None:
        super().__init__()
        op = type(self).__name__
        device = packed.device if isinstance(packed, Tensor) else None
        try:
            qtype = GGMLType.parse(qtype)
        except ValueError as e:
            raise ValueError(f"{op}: qtype: {e}") from None
        scales, scale_2 = companion_args(scales, scale_2, device)
        ops.check_args("qmatmul", packed, qtype, n_out, n_in, scales, scale_2, where=op)
        self.qtype, self.n_out, self.n_in = qtype, n_out, n_in
        self.register_buffer("packed", packed)
        if qtype in NEEDS_COMPANIONS:
            self.register_buffer("scales", scales)
            self.register_buffer("scale_2", scale_2)
        else:
            self.scales = self.scale_2 = None

    @classmethod
    def from_weight(cls, weight, **kw):
        """From a ``formats.PackedWeight`` (its companions included)."""
        return cls(weight.packed, weight.qtype, weight.n_out, weight.n_in, weight.scales,
                   weight.scale_2, **kw)

    @classmethod
    def from_gguf(cls, tensor, scales: Tensor | None = None, scale_2=None, **kw):
        """From a GGUF tensor record (anything with ``qtype``, ``n_out``, ``n_in``
        and ``packed``, e.g. ``muser_torch.gguf_io.GGUFTensor``). NVFP4_E2M1 needs
        its companions, e.g. ``GGUFFile.companions(name)``. The bytes are not
        copied (on CPU the module views the file's memory map)."""
        qtype = tensor.qtype
        if qtype is None:
            raise ValueError(f"{cls.__name__}.from_gguf: tensor {getattr(tensor, 'name', '?')!r} "
                             f"has a type muser-torch cannot compute")
        return cls(tensor.packed, qtype, tensor.n_out, tensor.n_in, scales, scale_2, **kw)

    @classmethod
    def _quantized(cls, weight: Tensor, qtype, imatrix: Tensor | None = None, **kw):
        """Quantize a float ``[n_out, n_in]`` weight (on the CPU, ggml's reference
        quantizers) into a module whose buffers sit on the weight's device."""
        from .formats import quantize
        qtype = GGMLType.parse(qtype)
        w = weight.detach()
        q = quantize(w.cpu(), qtype, imatrix=imatrix)
        packed, scales, scale_2 = q if isinstance(q, tuple) else (q, None, None)
        dev = w.device
        return cls(packed.to(dev), qtype, w.shape[0], w.shape[1],
                   None if scales is None else scales.to(dev),
                   None if scale_2 is None else scale_2.to(dev), **kw)

    def _weight_args(self):
        return (self.packed, int(self.qtype), self.n_out, self.n_in, self.scales, self.scale_2)

    def shares_bytes(self, other: "_Packed") -> bool:
        """Whether ``other`` holds the same matrix at the same address (a tied
        embedding and lm_head)."""
        a, b = self._buffers["packed"], other._buffers["packed"]
        return (a.device == b.device and a.data_ptr() == b.data_ptr() and a.shape == b.shape
                and self.qtype == other.qtype)

    def dequantize(self) -> Tensor:
        """The float32 weight ``[n_out, n_in]`` (for checks; the forward never makes it)."""
        return torch.ops.muser.dequantize(*self._weight_args())

    def get_extra_state(self):
        return {"qtype": self.qtype.name, "n_out": self.n_out, "n_in": self.n_in}

    def set_extra_state(self, state) -> None:
        qtype = GGMLType.parse(state["qtype"])
        ops.check_args("qmatmul", self.packed, qtype, int(state["n_out"]), int(state["n_in"]),
                       self.scales, self.scale_2, where=f"{type(self).__name__}.load_state_dict")
        self.qtype, self.n_out, self.n_in = qtype, int(state["n_out"]), int(state["n_in"])

    def _apply(self, fn, recurse=True):
        # Keep scale_2 float32 under .half()/.to(dtype); let it follow the device.
        changes.bump()
        s2 = self.scale_2
        super()._apply(fn, recurse)
        if s2 is not None and self.scale_2.dtype != torch.float32:
            self.scale_2 = s2.to(self.scale_2.device)
        return self

    def _describe(self) -> str:
        return f"{self.qtype.name}, in_features={self.n_in}, out_features={self.n_out}"


# The projections' arithmetic, one value for a whole model: "exact" (float
# activations, every device) or "ggml" (ggml's 8-bit activations; the native
# CPU kernels only). ``run --numerics`` offers these; the default is "exact".
NUMERICS = ("exact", "ggml")


def check_numerics(numerics: str, device: torch.device | str | None = None,
                   backend: str | None = None) -> str:
    """``numerics`` when it is one of ``NUMERICS`` and can be honoured on
    ``device`` with the CPU ``backend`` (default: ``ops.chosen_backend()``);
    else one ValueError naming the combination. The one check of the value."""
    if numerics not in NUMERICS:
        raise ValueError(f"numerics must be one of {NUMERICS}, got {numerics!r}")
    if numerics == "ggml":
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"numerics='ggml' runs on the CPU, not {torch.device(device).type}; "
                             "use numerics='exact' there")
        backend = backend or ops.chosen_backend()
        if backend != "native":
            raise ValueError(f"numerics='ggml' runs on the native CPU kernels, not the {backend} "
                             "backend; use numerics='exact' with it")
    return numerics


def set_numerics(model: nn.Module, numerics: str) -> nn.Module:
    """Set ``numerics`` on every QLinear in ``model``, checked once against the
    devices its weights are on; returns the model."""
    layers = [m for m in model.modules() if isinstance(m, QLinear)]
    for device in sorted({m.packed.device.type for m in layers}) or [None]:
        check_numerics(numerics, device)
    for m in layers:   # checked above: the field, not the property that checks again
        m._numerics = numerics
    changes.bump()
    return model


def prepare(model: nn.Module, progress: bool = False) -> nn.Module:
    """Do now, at load, the first-use work of every ``QLinear`` in ``model``
    (``QLinear.prepare``: the ggml numerics' repacks, whose file pages are
    released, or the file's pages of the weights run as they are) and load
    the CPU kernels, so the first call costs what a later one does; returns
    the model. ``progress`` shows a bar (after a second)."""
    layers = [m for m in model.modules() if isinstance(m, QLinear) and m.packed.is_cpu]
    if not layers:
        return model
    build_cpu_kernels()
    for m in tqdm(layers, desc="preparing the CPU weights", unit="weight", delay=1.0,
                  disable=not progress, leave=False):
        m.prepare()
    for e in model.modules():     # a tied embedding: its rows from the lm_head's repack
        if isinstance(e, QEmbedding):
            e.read_rows_from(next((m for m in layers if m.shares_bytes(e)), None))
    return model


def set_repack(enabled: bool) -> None:
    """Run ggml-numerics ``QLinear`` modules on a load-time repack of their
    weight (``ops/cpu/packed.py``; on by default, ``MUSER_CPU_REPACK=0`` at
    start) or on the file's rows, from the next call on: a benchmark compares
    the two in one process. Counted as a module change, so a model's cached
    layer plans, which hold the repack, are rebuilt."""
    cpu_packed.set_enabled(enabled)
    changes.bump()


class QLinear(_Packed):
    """``y = x @ W.T (+ bias)`` with W packed; y in x's dtype. Differentiable in
    x (and bias), so adapters can train on top of the frozen packed weight."""

    def __init__(self, packed: Tensor, qtype, n_out: int, n_in: int,
                 scales: Tensor | None = None, scale_2=None, bias: Tensor | None = None) -> None:
        super().__init__(packed, qtype, n_out, n_in, scales, scale_2)
        if bias is not None:
            if not isinstance(bias, Tensor) or tuple(bias.shape) != (n_out,):
                raise ValueError(f"QLinear: bias must be a tensor of shape ({n_out},), got "
                                 f"{getattr(bias, 'shape', type(bias).__name__)}")
            bias = nn.Parameter(bias.detach().clone(), requires_grad=bias.requires_grad)
        self.bias = bias
        self._numerics = "exact"
        self._projection = None

    @property
    def numerics(self) -> str:
        """The matmul's arithmetic, one of ``NUMERICS``."""
        return self._numerics

    @numerics.setter
    def numerics(self, value: str) -> None:
        self._numerics = check_numerics(value)
        changes.bump()

    @property
    def in_features(self) -> int:
        return self.n_in

    @property
    def out_features(self) -> int:
        return self.n_out

    @classmethod
    def from_linear(cls, linear: nn.Linear, qtype, imatrix: Tensor | None = None) -> "QLinear":
        """Quantize an ``nn.Linear``'s weight to ``qtype`` (ggml's reference
        quantizers, optional importance matrix); the bias stays float."""
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"QLinear.from_linear: linear must be an nn.Linear, got "
                             f"{type(linear).__name__}")
        bias = None if linear.bias is None else linear.bias.detach()
        return cls._quantized(linear.weight, qtype, imatrix, bias=bias)

    @classmethod
    def concat(cls, parts: "list[QLinear]") -> "QLinear | None":
        """One QLinear whose rows are ``parts``' rows in order (``y`` of it is
        the parts' outputs side by side), or None when they cannot share one
        matrix (another type, width or numerics, NVFP4 companions, some with a
        bias and some without). The parts' ``packed`` buffers become views of
        the joined one (their biases of its bias), so the bytes exist once."""
        first = parts[0]
        if any(not isinstance(p, QLinear) or p.qtype != first.qtype or p.n_in != first.n_in
               or p.numerics != first.numerics or p.scales is not None
               or (p.bias is None) != (first.bias is None) for p in parts):
            return None
        packed = torch.cat([p.packed for p in parts])
        bias = None if first.bias is None else torch.cat([p.bias.detach() for p in parts])
        joined = cls(packed, first.qtype, packed.shape[0], first.n_in, bias=bias)
        joined.numerics = first.numerics
        row = 0
        for p in parts:
            p.packed = packed[row:row + p.n_out]
            if bias is not None:
                p.bias = nn.Parameter(joined.bias.data[row:row + p.n_out],
                                      requires_grad=p.bias.requires_grad)
            row += p.n_out
        return joined

    def projection(self):
        """The prepared native call of this weight (``ops.cpu.eager.Projection``),
        rebuilt when the buffers or the numerics change."""
        # the buffers read from their dict: nn.Module.__getattr__ costs more than the check
        packed, scales = self._buffers["packed"], self._buffers.get("scales")
        repacked = self.repacked()
        p = self._projection
        if p is None or p.key != (packed.data_ptr(), _ptr(scales), self._numerics, _ptr(repacked)):
            p = self._projection = Projection(packed, self.qtype, self.n_out, self.n_in, scales,
                                              self.scale_2, self._numerics, repacked)
        return p

    def repacked(self) -> Tensor | None:
        """``packed`` repacked for the ggml-numerics kernels (``ops/cpu/packed.py``:
        the same bytes moved, the same values bit for bit), made on first use and
        kept while ``packed`` is the same tensor; None in the exact numerics, for
        a type without a packed kernel, off the CPU, or with repacking off
        (``MUSER_CPU_REPACK=0``, ``set_repack(False)``). It is a copy beside
        ``packed`` (not a buffer: state_dict and ``.to()`` see the file's layout);
        when ``packed`` views a GGUF file's map its pages are released from the
        resident set as the copy is made, and read from the file again only
        where another path (the tied embedding's rows, the torch op, state_dict)
        reads them."""
        packed = self._buffers["packed"]
        if (self._numerics != "ggml" or not cpu_packed.enabled() or not cpu_packed.serves(self.qtype)
                or not packed.is_cpu or not packed.is_contiguous()):
            self.__dict__.pop("_repacked", None)     # its memory goes with its use
            return None
        key = (packed.data_ptr(), tuple(packed.shape))
        cached = self.__dict__.get("_repacked")
        if cached is None or cached[0] != key:
            # a weight viewing the file's map gives its pages back as the copy
            # is made (gguf_io/pages.py): the kernels read only the copy
            repacked = cpu_packed.repack(packed, self.qtype, done=pages.release)
            pages.release(packed)    # the pages the spans' edges shared
            cached = self.__dict__["_repacked"] = (key, repacked)
        return cached[1]

    def prepare(self) -> None:
        """Do now what this weight's first call on the CPU would: make its repack
        (``repacked``; the file's pages of the weight are then released) or,
        running on the file's rows, map those pages in (``gguf_io.pages``)."""
        if self.repacked() is None:
            pages.populate(self._buffers["packed"])

    def forward(self, x: Tensor) -> Tensor:
        y = None
        if self._buffers["packed"].is_cpu and plain_eager(x):
            y = recorded(_OP[self._numerics], self.projection(), x) if profiling() \
                else self.projection()(x)
        if y is None and self._numerics == "ggml":
            y = torch.ops.muser.qmatmul_ggml(x, *self._weight_args())
        elif y is None:
            y = torch.ops.muser.qmatmul(x, *self._weight_args())
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y

    def extra_repr(self) -> str:
        return f"{self._describe()}, bias={self.bias is not None}, numerics={self.numerics}"


class QEmbedding(_Packed):
    """Rows of a packed ``[num_embeddings, embedding_dim]`` table; ``forward(ids)``
    returns ``[*ids.shape, embedding_dim]`` in ``dtype`` (float32 by default)."""

    def __init__(self, packed: Tensor, qtype, n_out: int, n_in: int,
                 scales: Tensor | None = None, scale_2=None,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__(packed, qtype, n_out, n_in, scales, scale_2)
        self.dtype = dtype

    @property
    def num_embeddings(self) -> int:
        return self.n_out

    @property
    def embedding_dim(self) -> int:
        return self.n_in

    @classmethod
    def from_embedding(cls, emb: nn.Embedding, qtype, dtype: torch.dtype = torch.float32):
        """Quantize an ``nn.Embedding``'s table to ``qtype``."""
        if not isinstance(emb, nn.Embedding):
            raise ValueError(f"QEmbedding.from_embedding: emb must be an nn.Embedding, got "
                             f"{type(emb).__name__}")
        return cls._quantized(emb.weight, qtype, dtype=dtype)

    def read_rows_from(self, linear: "QLinear | None") -> None:
        """Read the table's rows from ``linear``'s repack while it has one over
        these bytes (a tied lm_head in the ggml numerics; ``nn.prepare`` links
        them), so the file's pages of the table, released when the repack was
        made, stay out of the resident set; None unlinks."""
        if linear is not None and not linear.shares_bytes(self):
            raise ValueError(f"QEmbedding.read_rows_from: the QLinear holds other bytes "
                             f"({linear.qtype.name} {tuple(linear.packed.shape)}) than this table "
                             f"({self.qtype.name} {tuple(self.packed.shape)})")
        self.__dict__["_rows_from"] = linear     # not a submodule: the model holds it already

    def _repacked_rows(self, ids: Tensor) -> Tensor | None:
        """The rows of ``ids`` decoded from the linked repack, None without one."""
        linear = self.__dict__.get("_rows_from")
        repacked = None if linear is None or not linear.shares_bytes(self) else linear.repacked()
        if repacked is None:
            return None
        uniq, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
        rows = cpu_packed.rows(repacked, self.qtype, uniq)
        return cpu_embedding(inverse.view(ids.shape), rows, int(self.qtype), len(uniq), self.n_in)

    def forward(self, ids: Tensor) -> Tensor:
        if self.packed.is_cpu and plain_eager(ids) and ids.dtype in (torch.int64, torch.int32):
            # the op's CPU kernel without the dispatcher (the weight was checked when built)
            ops.check_ids_in_range("embedding", ids, self.n_out)
            rows = self._repacked_rows(ids)
            if rows is None:
                rows = cpu_embedding(ids, *self._weight_args())
        else:
            rows = torch.ops.muser.embedding(ids, *self._weight_args())
        return rows.to(self.dtype)

    def extra_repr(self) -> str:
        return (f"{self.qtype.name}, num_embeddings={self.n_out}, embedding_dim={self.n_in}, "
                f"dtype={self.dtype}")
