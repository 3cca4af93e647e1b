"""``bench triton --what peer``'s llama.cpp side: test-backend-ops' MUL_MAT perf lines
parsed, and the binary run with the arguments that select the perf shape. The
lines are written in test-backend-ops' own format (its ``print_perf_console``:
op and parameters, padding, runs, µs per run, FLOP per run, colour codes), with
fresh random timings."""
from __future__ import annotations

import random
import stat

import pytest

from muser_torch.bench import triton_peer as tp
from muser_torch.formats.types import GGMLType

from ..random_seed import fresh_seed


def _line(name: str, n: int, us: float, m: int = tp.PEER_M, k: int = tp.PEER_K, colour: bool = True) -> str:
    params = f"type_a={name},type_b=f32,m={m},n={n},k={k},bs=[1,1],nr=[1,1],per=[0,1,2,3],k_v=0,o=1"
    head = f"  MUL_MAT({params}): "
    pad = (len(head) + 7) // 8 * 8 - len(head)
    flops = f"\033[1;34m{2 * m * n * k / us / 1e3:6.2f} GFLOPS\033[0m" if colour else "1.00 GFLOPS"
    return f"{head}{' ' * (pad + 8 * (pad < 5))}    {random.randint(1, 99999):8d} runs - {us:8.2f} us/run - 1.00 MFLOP/run - {flops}"


def test_perf_lines_parse_to_their_timings():
    seed = fresh_seed()
    random.seed(seed)
    want = {(name, n): round(random.uniform(1, 5000), 2)
            for name in ("q4_K", "q8_0", "iq4_xs", "iq3_xxs") for n in (1, 2, 8, 512)}
    lines = [_line(name, n, us, colour=random.random() < 0.5) for (name, n), us in want.items()]
    lines += [_line("q4_K", 1, 7.0, m=14336, k=4096),               # another shape: left out
              "  MUL_MAT(type_a=nvfp4,type_b=f32,m=4096,n=1,k=14336,bs=[1,1]): not supported",
              "Backend 1/2: CUDA0", "  Device description: NVIDIA H200"]
    random.shuffle(lines)
    assert tp.parse_mulmat_perf("\n".join(lines)) == want, f"seed={seed}"


def test_the_binary_runs_with_the_perf_shape_and_its_lines_come_back(tmp_path):
    seed = fresh_seed()
    random.seed(seed)
    us = round(random.uniform(1, 100), 2)
    fake = tmp_path / "test-backend-ops"
    args_file = tmp_path / "args"
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {args_file}\n"
                    f"echo '{_line('q5_0', 8, us, colour=False)}'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    got = tp.llama_cpp_mulmat(fake, (GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.IQ4_XS))
    assert got == {("q5_0", 8): us}, f"seed={seed}"
    argv = args_file.read_text().split("\n")
    assert argv[:6] == ["perf", "-o", "MUL_MAT", "-b", "CUDA0", "-p"]
    assert argv[6] == f"type_a=(q5_0|q4_K|iq4_xs),type_b=f32,m={tp.PEER_M},n=[0-9]+,k={tp.PEER_K},"


def test_a_missing_or_silent_binary_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        tp.llama_cpp_mulmat(tmp_path / "absent", (GGMLType.Q4_K,))
    silent = tmp_path / "silent"
    silent.write_text("#!/bin/sh\necho 'ggml_cuda_init: no CUDA devices found' >&2\nexit 1\n")
    silent.chmod(silent.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(RuntimeError, match="no MUL_MAT timings.*no CUDA devices"):
        tp.llama_cpp_mulmat(silent, (GGMLType.Q4_K,))


def test_ggml_names():
    names = {t: tp.ggml_name(t) for t in (GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0, GGMLType.IQ4_XS,
                                          GGMLType.IQ3_XXS, GGMLType.MXFP4)}
    assert names == {GGMLType.Q4_K: "q4_K", GGMLType.Q6_K: "q6_K", GGMLType.Q8_0: "q8_0",
                     GGMLType.IQ4_XS: "iq4_xs", GGMLType.IQ3_XXS: "iq3_xxs", GGMLType.MXFP4: "mxfp4"}
