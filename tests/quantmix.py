"""Quants of one shape as llama-quantize makes them: its ``--dry-run`` over a sparse BF16 copy gives each
tensor's type for a quant type (no weights needed), and the shape is written again with those types."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from llamafit.server.binary import ServerBinary
from tests.factory import Shape

# "[  10/ 399] blk.0.attn_v.weight  - [ 4096, 1024, 1, 1], type = bf16, size = 8.00 MiB -> 2.25 MiB (q4_K)"
_LINE = re.compile(
    r"^\[\s*\d+/\s*\d+\]\s+(?P<name>\S+)\s+- \[.*\], type =\s*(?P<src>\w+), size =.*?(?:\((?P<dst>\w+)\))?\s*$"
)


def quantize_types(server: ServerBinary, bf16: Path, qtype: str, extra: Sequence[str] = ()) -> dict[str, str]:
    """Tensor name -> ggml type name of ``llama-quantize --dry-run [extra] bf16 qtype`` (unquantized ones keep
    theirs)."""
    tool = Path(server.path).with_name("llama-quantize")
    r = subprocess.run([str(tool), "--dry-run", *extra, str(bf16), qtype], capture_output=True, text=True,
                       timeout=120, env=server.env())  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    out = {}
    for line in (r.stdout + r.stderr).splitlines():
        if m := _LINE.match(line.strip()):
            out[m["name"]] = (m["dst"] or m["src"]).lower()
    assert out, (r.stdout + r.stderr)[-2000:]
    return out


def quantized(shape: Shape, types: dict[str, str]) -> Shape:
    """``shape`` with each tensor of the type llama-quantize gave it."""
    ts = [replace(t, type=types[t.name]) if t.name in types else t for t in shape.tensors]
    return Shape(shape.arch, dict(shape.kv), ts)


def ladder(server: ServerBinary, shape_bf16: Shape, directory: Path, stem: str, qtypes: list[str]) -> dict[str, Path]:
    """``stem-QTYPE.gguf`` for each quant type, written sparse from llama-quantize's type mix."""
    directory.mkdir(parents=True, exist_ok=True)
    bf16 = shape_bf16.write(directory / f"{stem}-BF16.gguf")
    out = {"BF16": bf16}
    for q in qtypes:
        if q != "BF16":
            out[q] = quantized(shape_bf16, quantize_types(server, bf16, q)).write(directory / f"{stem}-{q}.gguf")
    return out
