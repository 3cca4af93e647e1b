"""ggml's own ``mul_mat`` through ctypes: a one-op graph over our packed bytes,
computed by a ggml CPU library with a persistent thread pool (as llama.cpp
runs it), for ``bench ops --against ggml`` and as the tests' oracle.

The library is libggml-python's prebuilt one (its x86 build is AVX2 without
AVX-512) or, with ``lib_dir``, another build of ``libggml-base`` /
``libggml-cpu`` (e.g. llama.cpp's native build); :func:`describe` says which.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
from pathlib import Path

import numpy as np
import torch

GGML_TYPE_F32 = 0
GGML_MAX_N_THREADS = 512      # ggml.h; sizes ggml_threadpool_params.cpumask


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class _ThreadpoolParams(ctypes.Structure):
    _fields_ = [("cpumask", ctypes.c_bool * GGML_MAX_N_THREADS), ("n_threads", ctypes.c_int),
                ("prio", ctypes.c_int), ("poll", ctypes.c_uint32), ("strict_cpu", ctypes.c_bool),
                ("paused", ctypes.c_bool)]


class _Cplan(ctypes.Structure):
    _fields_ = [("work_size", ctypes.c_size_t), ("work_data", ctypes.c_void_p), ("n_threads", ctypes.c_int),
                ("threadpool", ctypes.c_void_p), ("abort_callback", ctypes.c_void_p),
                ("abort_callback_data", ctypes.c_void_p), ("use_ref", ctypes.c_bool)]


def default_lib_dir() -> Path | None:
    """libggml-python's library folder, or None when it is not installed."""
    spec = importlib.util.find_spec("libggml")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(spec.submodule_search_locations[0]) / "lib64"


@functools.lru_cache(maxsize=None)
def load(lib_dir: str | None = None) -> ctypes.CDLL | None:
    """libggml-cpu from ``lib_dir`` (default: libggml-python's) with the graph
    API declared; None when there is none."""
    folder = Path(lib_dir) if lib_dir else default_lib_dir()
    if folder is None or not (folder / "libggml-cpu.so").exists():
        return None
    ctypes.CDLL(str(folder / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    dll = ctypes.CDLL(str(folder / "libggml-cpu.so"))
    P, i64 = ctypes.c_void_p, ctypes.c_int64
    dll.ggml_init.restype, dll.ggml_init.argtypes = P, [_InitParams]
    dll.ggml_free.argtypes = [P]
    dll.ggml_new_tensor_2d.restype = P
    dll.ggml_new_tensor_2d.argtypes = [P, ctypes.c_int, i64, i64]
    dll.ggml_get_data.restype, dll.ggml_get_data.argtypes = P, [P]
    dll.ggml_mul_mat.restype, dll.ggml_mul_mat.argtypes = P, [P, P, P]
    dll.ggml_new_graph.restype, dll.ggml_new_graph.argtypes = P, [P]
    dll.ggml_build_forward_expand.argtypes = [P, P]
    dll.ggml_nbytes.restype, dll.ggml_nbytes.argtypes = ctypes.c_size_t, [P]
    dll.ggml_threadpool_params_default.restype = _ThreadpoolParams
    dll.ggml_threadpool_params_default.argtypes = [ctypes.c_int]
    dll.ggml_threadpool_new.restype = P
    dll.ggml_threadpool_new.argtypes = [ctypes.POINTER(_ThreadpoolParams)]
    dll.ggml_threadpool_free.argtypes = [P]
    dll.ggml_graph_plan.restype = _Cplan
    dll.ggml_graph_plan.argtypes = [P, ctypes.c_int, P]
    dll.ggml_graph_compute.restype = ctypes.c_int
    dll.ggml_graph_compute.argtypes = [P, ctypes.POINTER(_Cplan)]
    dll.folder = str(folder)
    return dll


def describe(dll: ctypes.CDLL) -> str:
    """Which ggml this is: its folder and the x86 features it was built with."""
    feats = [f for f in ("avx2", "avx512", "avx512_vnni", "avx_vnni")
             if getattr(dll, f"ggml_cpu_has_{f}")()]
    pkg = ""
    if dll.folder == str(default_lib_dir()):
        from importlib.metadata import version
        pkg = f"libggml-python {version('libggml-python')}, "
    return f"{pkg}{dll.folder} ({'+'.join(feats) or 'no AVX2'})"


class MulMat:
    """One prepared ``y = x @ W.T`` graph for a weight and a token count, with
    its plan, work buffer and thread pool, so a timed ``compute`` measures
    ggml's kernels, not setup."""

    def __init__(self, dll: ctypes.CDLL, packed: torch.Tensor, qtype: int, n_out: int, n_in: int,
                 tokens: int, threads: int = 1) -> None:
        self.dll, self.ctx, self.pool = dll, None, None
        raw = np.ascontiguousarray(packed.cpu().numpy())
        mem = raw.nbytes + 4 * tokens * (n_in + n_out) + (4 << 20)
        self.ctx = dll.ggml_init(_InitParams(mem, None, False))
        if not self.ctx:
            raise RuntimeError("ggml_init failed")
        a = dll.ggml_new_tensor_2d(self.ctx, int(qtype), n_in, n_out)
        if dll.ggml_nbytes(a) != raw.nbytes:
            raise ValueError(f"ggml sizes the weight at {dll.ggml_nbytes(a)} bytes, ours is {raw.nbytes}")
        ctypes.memmove(dll.ggml_get_data(a), raw.ctypes.data, raw.nbytes)
        self.b = dll.ggml_new_tensor_2d(self.ctx, GGML_TYPE_F32, n_in, tokens)
        self.out = dll.ggml_mul_mat(self.ctx, a, self.b)
        self.graph = dll.ggml_new_graph(self.ctx)
        dll.ggml_build_forward_expand(self.graph, self.out)
        params = dll.ggml_threadpool_params_default(threads)
        self.pool = dll.ggml_threadpool_new(ctypes.byref(params))
        self.plan = dll.ggml_graph_plan(self.graph, threads, self.pool)
        self.work = np.empty(max(1, self.plan.work_size), dtype=np.uint8)
        self.plan.work_data = self.work.ctypes.data
        self.shape = (tokens, n_out)

    def set_x(self, x: torch.Tensor) -> None:
        src = np.ascontiguousarray(x.detach().cpu().numpy(), dtype=np.float32)
        ctypes.memmove(self.dll.ggml_get_data(self.b), src.ctypes.data, src.nbytes)

    def compute(self) -> None:
        status = self.dll.ggml_graph_compute(self.graph, ctypes.byref(self.plan))
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute returned {status}")

    def result(self) -> torch.Tensor:
        res = np.empty(self.shape, dtype=np.float32)
        ctypes.memmove(res.ctypes.data, self.dll.ggml_get_data(self.out), res.nbytes)
        return torch.from_numpy(res)

    def close(self) -> None:
        if self.pool:
            self.dll.ggml_threadpool_free(self.pool)
            self.pool = None
        if self.ctx:
            self.dll.ggml_free(self.ctx)
            self.ctx = None

    def __del__(self) -> None:
        self.close()


def mul_mat(dll: ctypes.CDLL, packed: torch.Tensor, qtype: int, n_out: int, n_in: int,
            x: torch.Tensor, threads: int = 1) -> torch.Tensor:
    """ggml's ``x @ W.T`` (float32 ``[T, n_out]``) for W's bytes ``packed``."""
    mm = MulMat(dll, packed, qtype, n_out, n_in, x.shape[0], threads)
    try:
        mm.set_x(x)
        mm.compute()
        return mm.result()
    finally:
        mm.close()
