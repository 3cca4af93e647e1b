"""llama.cpp's importance-matrix GGUF (``llama-imatrix -o FILE.gguf``), read as
``llama-quantize --imatrix`` reads it: per weight ``NAME.in_sum2`` (sums of
squared activations, one row per expert) and ``NAME.counts`` (tokens seen per
expert); the importance is ``in_sum2 / count``, or 1 where nothing was seen.
Its metadata gives the keys llama-quantize writes into the quantized file."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import ConvertError
from ..gguf_io import load_gguf

_SUMS, _COUNTS = ".in_sum2", ".counts"


@dataclass
class ImportanceMatrix:
    path: Path
    values: dict[str, torch.Tensor] = field(default_factory=dict)    # weight name -> float32 [n_in]
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0

    def for_tensor(self, name: str, n_in: int) -> torch.Tensor | None:
        v = self.values.get(name)
        if v is None:
            return None
        if v.numel() != n_in:
            raise ConvertError(f"{self.path.name}: importance of {name!r} has {v.numel()} values, "
                               f"the tensor's rows have {n_in}")
        return v

    def quantize_keys(self) -> list[tuple[str, object, str]]:
        """(key, value, GGUF type name) that llama-quantize appends for this imatrix."""
        out: list[tuple[str, object, str]] = [("quantize.imatrix.file", str(self.path), "STRING")]
        if self.datasets:
            out.append(("quantize.imatrix.dataset", self.datasets[0], "STRING"))
        out.append(("quantize.imatrix.entries_count", len(self.values), "UINT32"))
        if self.chunk_count > 0:
            out.append(("quantize.imatrix.chunks_count", self.chunk_count, "UINT32"))
        return out


def load_imatrix(path: "str | Path") -> ImportanceMatrix:
    path = Path(path)
    try:
        g = load_gguf(path)
    except (OSError, ValueError) as e:
        raise ConvertError(f"{path}: not an imatrix GGUF ({e})") from None
    md = g.metadata
    if "imatrix.datasets" not in md or "imatrix.chunk_count" not in md or "imatrix.chunk_size" not in md:
        raise ConvertError(f"{path}: imatrix metadata (imatrix.datasets, chunk_count, chunk_size) is "
                           f"missing; not an imatrix GGUF written by llama-imatrix")
    im = ImportanceMatrix(path, datasets=list(md["imatrix.datasets"]), chunk_count=int(md["imatrix.chunk_count"]))
    for name, t in g.tensors.items():
        if not name.endswith(_SUMS):
            continue
        base = name[:-len(_SUMS)]
        counts = g.tensors.get(base + _COUNTS)
        if counts is None or t.type_name != "F32" or counts.type_name != "F32":
            raise ConvertError(f"{path}: {name!r} needs an F32 {base + _COUNTS!r} beside it")
        sums = t.raw.view(torch.float32).reshape(-1)
        n = counts.raw.view(torch.float32).reshape(-1)
        if n.numel() == 0 or sums.numel() % n.numel():
            raise ConvertError(f"{path}: {name!r} has {sums.numel()} values for {n.numel()} counts")
        if n.numel() != 1:
            raise ConvertError(f"{path}: {base!r} has per-expert counts; the converter's "
                               f"architectures have no experts")
        value = sums / n[0] if float(n[0]) > 0 else torch.ones_like(sums)
        if not bool(torch.isfinite(value).all()):
            raise ConvertError(f"{path}: importance of {base!r} is not finite")
        im.values[base] = value.clone()
    return im
