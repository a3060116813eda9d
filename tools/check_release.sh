#!/usr/bin/env bash
# The release a user installs: build the sdist, build the wheel from that sdist (so the sdist is whole),
# install the wheel into a clean venv and run the demo from it (package data and shell completions
# included). Prints the paths of the two artifacts on stdout; progress on stderr.
#   usage: tools/check_release.sh [OUT_DIR]   (LLAMAFIT_SERVER: the llama-server the demo runs)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
rm -f "$out"/llamafit_cli-*
echo "release: building the sdist" >&2
hatchling build -t sdist -d "$out" >&2
sdist=$(ls "$out"/llamafit_cli-*.tar.gz)
tar -xzf "$sdist" -C "$work"
echo "release: building the wheel from $sdist" >&2
(cd "$work"/llamafit_cli-* && hatchling build -t wheel -d "$work/wheel" >&2)
cp "$work"/wheel/llamafit_cli-*.whl "$out"/
wheel=$(ls "$out"/llamafit_cli-*.whl)
echo "release: installing $wheel into a clean venv" >&2
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$wheel" >&2
for f in share/bash-completion/completions/llamafit share/zsh/site-functions/_llamafit \
         share/fish/vendor_completions.d/llamafit.fish; do
  test -s "$work/venv/$f" || { echo "release: the wheel did not install $f" >&2; exit 1; }
done
echo "release: the demo, from the installed wheel" >&2
(cd "$work" && LLAMAFIT_DATA="$work/data" LLAMAFIT_CACHE="$work/cache" "$work/venv/bin/llamafit" demo >&2)
echo "$sdist"
echo "$wheel"
