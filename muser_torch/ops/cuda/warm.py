"""Compile, at load, the Triton kernels a model's projections will call
(``ops.warm_up`` asks for it when a model's weights are on CUDA).

Triton compiles a kernel on its first launch for each set of compile-time
constants, so without this the first prefill after ``from_gguf`` waits for
seconds (8.2 s against 0.13 s warm, measured on the H200). ``warm_up`` calls
``qmatmul`` once for every distinct weight shape of a module tree at token
counts that reach every rung of the ladder, and each distinct split-K
variant of the wide tensor-core tile, so every kernel a forward can launch
is compiled (or loaded from Triton's on-disk cache, ``~/.triton/cache``,
which makes a second load of the same model cheap) before the first call.
The activations are zeros: nothing is timed or returned.
"""
from __future__ import annotations

import os
import sys
import time

import torch
from torch import nn

# One count inside each rung's range (1; 2; 3-4; 5-8 are the int8-dot token
# widths; 9-16; 17-64; 65-255; 256+). Within a rung no count compiles anything new: the
# token count is not a specialized argument and the split K does not depend on it.
WARM_TOKENS = (1, 2, 3, 5, 9, 17, 65, 257)


def projection_weights(module: nn.Module) -> list[tuple]:
    """``qmatmul``'s weight arguments for each distinct (type, shape) in ``module``."""
    seen: dict[tuple, tuple] = {}
    for m in module.modules():
        args = getattr(m, "_weight_args", None)
        if args is None or not hasattr(m, "in_features"):
            continue
        a = args()
        seen.setdefault((a[1], a[2], a[3]), a)
    return list(seen.values())


# Whole forwards (no cache) at these lengths after the projections: the embedding,
# attention and every other kernel of a prefill and a decode step get their first
# call here (Triton specializes integers equal to 1 or divisible by 16).
WARM_FORWARDS = (1, 16, 17, 65)


def warm_up(module: nn.Module, dtype: torch.dtype, tokens: tuple[int, ...] = WARM_TOKENS,
            max_tokens: int | None = None) -> float:
    """Compile the kernels of ``module``'s CUDA projections for ``dtype``
    activations, then (a model with a ``config.vocab_size``) run short forwards
    without a cache; returns the seconds it took. ``max_tokens`` (e.g. the context
    length) drops counts no call can reach."""
    weights = [a for a in projection_weights(module) if a[0].is_cuda]
    if not weights:
        return 0.0
    cache = os.environ.get("TRITON_CACHE_DIR", "~/.triton/cache")
    cached = os.path.isdir(os.path.expanduser(cache)) and any(os.scandir(os.path.expanduser(cache)))
    # measured on the H200 (docs/performance.md): 28-34 s for 10-11 shapes with
    # nothing cached, 5-6 s with Triton's cache warm
    expect = len(weights) * (0.5 if cached else 3.0)
    where = (f"from Triton's cache in {cache}" if cached else
             f"Triton compiles each on this first load; later loads read them from {cache}")
    print(f"muser-torch: loading the CUDA kernels of {len(weights)} weight shapes, about "
          f"{expect:.0f} s ({where})",
          file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    from . import compiled
    if compiled.kernels() is None:
        print(f"muser-torch: the CUDA C++ matvecs are not built ({compiled.reason()}); "
              f"Triton's kernels run instead", file=sys.stderr, flush=True)
    counts = [t for t in tokens if max_tokens is None or t <= max_tokens]
    with torch.no_grad():
        for m in module.modules():          # the embedding's row decoder
            if hasattr(m, "num_embeddings") and getattr(m, "packed", None) is not None \
                    and m.packed.is_cuda:
                m(torch.zeros(1, dtype=torch.long, device=m.packed.device))
        for args in weights:
            for n in counts:
                x = torch.zeros((n, args[3]), dtype=dtype, device=args[0].device)
                torch.ops.muser.qmatmul(x, *args)
        vocab = getattr(getattr(module, "config", None), "vocab_size", None)
        # a Decoder: forwards without slots change no cache state. A DFlash
        # draft has a config but no forward of token ids (its blocks run in rounds).
        if vocab and type(module).forward is not nn.Module.forward:
            for n in WARM_FORWARDS:
                if max_tokens is None or n <= max_tokens:
                    module(torch.zeros((1, n), dtype=torch.long, device=weights[0][0].device))
    torch.cuda.synchronize()
    return time.perf_counter() - t0
