#!/usr/bin/env python3
"""Generate llamafit/gguf/archs.py: the model architectures llama.cpp knows (src/llama-arch.cpp LLM_ARCH_NAMES).

Usage: python tools/gen_archs.py LLAMA_CPP_DIR [-o llamafit/gguf/archs.py]

"clip" (a placeholder llama-quantize uses for projectors) and "(unknown)" are not model architectures
llama-server can load, so they are left out. tests/test_server_options.py checks the committed list
against a fresh generation when LLAMA_CPP_SRC names the tree.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

NOT_MODELS = {"clip", "(unknown)"}


def archs(llama_dir: Path) -> list[str]:
    src = (llama_dir / "src" / "llama-arch.cpp").read_text(encoding="utf-8")
    m = re.search(r"LLM_ARCH_NAMES\s*=\s*\{(.*?)\n\};", src, re.S)
    if not m:
        raise SystemExit("LLM_ARCH_NAMES not found in src/llama-arch.cpp")
    names = re.findall(r'\{\s*LLM_ARCH_\w+\s*,\s*"([^"]+)"\s*\}', m.group(1))
    return [n for n in names if n not in NOT_MODELS]


def generate(llama_dir: Path) -> str:
    body = "\n".join(f'    "{n}",' for n in archs(llama_dir))
    return (
        '"""Model architectures llama.cpp b11434 knows, generated from src/llama-arch.cpp (LLM_ARCH_NAMES) by\n'
        'tools/gen_archs.py. Do not edit by hand: regenerate."""\n\n'
        "from __future__ import annotations\n\n"
        f"ARCHS = frozenset({{\n{body}\n}})\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("llama_dir", type=Path)
    ap.add_argument("-o", "--out", type=Path)
    a = ap.parse_args()
    text = generate(a.llama_dir)
    if a.out is None:
        sys.stdout.write(text)
    else:
        a.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
