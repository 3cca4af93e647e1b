#!/bin/bash
# One H200 call: CUDA tests of the layer ops and the models, then
# decode of random-weight files with real layouts (tools/layouts, written by
# muser_torch.bench.shaped) and of Muse Glimmer's seed geometry: tok/s in a CUDA
# graph and the kernels of one token. Run from the repo root on the device:
#   bash tools/cuda_bench.sh [tests] [gemma] [llama8b] [glimmer] [profile]
# Logs go to $OUT (or /tmp/cuda-bench). llama.cpp is not built here; its figures
# are recorded ones from the same kind of H200 (docs/performance.md says which).
set -uo pipefail
OUT=${OUT:-/tmp/cuda-bench}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then   # gguf and other pure-Python wheels the image lacks
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
want() { [ $# -eq 0 ] || [[ " $WHAT " == *" $1 "* ]]; }
WHAT=" ${*:-tests gemma llama8b glimmer profile} "
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
git log --oneline -1 2>/dev/null || true
mkdir -p /tmp/shaped
shaped() {  # layout name -> a file in /tmp/shaped
  [ -f /tmp/shaped/$1.gguf ] || python3 -m muser_torch.bench.shaped write tools/layouts/$1.lcpp.json /tmp/shaped/$1.gguf >/dev/null
  echo /tmp/shaped/$1.gguf
}
if want tests; then
  timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/ops/cuda/test_layer.py \
    tests/models/test_cuda_models.py tests/glimmer/test_cuda.py 2>&1 | tail -15 | tee "$OUT/tests.log"
fi
bench() {  # label, then bench model's arguments
  local label=$1; shift
  echo "== $label"; timeout 300 python3 -m muser_torch.cli bench model "$@" --device cuda 2>&1 \
    | grep -v Warning | tee -a "$OUT/bench.log"
}
want gemma && bench gemma "$(shaped gemma)" --prompt-len 512 --decode 64
want glimmer && bench glimmer seed --layers 52 --prompt-len 512 --decode 16
if want profile; then
  for m in "$(shaped gemma)" seed; do
    timeout 240 python3 tools/decode_kernels.py "$m" --top 20 2>&1 | grep -v Warning | tee -a "$OUT/kernels.log"
  done
fi
want llama8b && bench llama8b "$(shaped llama8b)" --prompt-len 512 --decode 32
