"""Write GGUF files with ``gguf.GGUFWriter``: the embedded demo model, and shape-faithful test models.

Two fillings: ``"random"`` writes real (small, seeded) weights that llama.cpp can run; ``"sparse"``
writes only the header and leaves the tensor data a hole in the file, so a 70B *shape* costs a few
megabytes of disk. llama-server loads such a file fine with ``--no-warmup``.

The ``gguf`` package (and numpy) is imported here only, never on the planning path.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamafit.gguf.ggml import by_name, nbytes


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # ggml order (ne0 first), as llama.cpp's create_tensor lists it
    type: str = "f32"  # ggml type name


def spm_vocab(n_vocab: int) -> dict[str, Any]:
    """A SentencePiece-style vocabulary llama.cpp accepts: specials, the 256 byte tokens, then fillers.

    Byte tokens make every text encodable; filler tokens give real models their vocabulary size.
    """
    if n_vocab < 259:
        raise ValueError("an SPM vocabulary needs at least 259 tokens (3 specials + 256 bytes)")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    words = ["▁the", "▁a", "▁is", "▁of", "▁and", "▁to", "▁in", "▁fit", "▁model", "▁memory", "▁llama"]
    i = 0
    while len(tokens) < n_vocab:
        tokens.append(words[i] if i < len(words) else f"▁t{i}")
        i += 1
    types = [2, 3, 3] + [6] * 256 + [1] * (n_vocab - 259)
    scores = [0.0] * 3 + [0.0] * 256 + [-float(k) for k in range(n_vocab - 259)]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
    }


def _add_kv(w: Any, key: str, val: Any) -> None:
    import gguf
    import numpy as np

    if isinstance(val, np.integer):
        # an explicitly sized integer: gguf-split writes split.no/split.count as u16 and
        # split.tensors.count as i32, and llama.cpp checks the stored type
        adders = {np.uint16: w.add_uint16, np.int32: w.add_int32, np.uint32: w.add_uint32, np.uint64: w.add_uint64}
        adders[type(val)](key, int(val))
    elif isinstance(val, bool):
        w.add_bool(key, val)
    elif isinstance(val, int):
        # llama.cpp reads scalar hparams as uint32 and checks the stored type; ids and counts are
        # never negative, so uint32 is right for them.
        if val < 0:
            w.add_int32(key, val)
        elif val > 0xFFFFFFFF:
            w.add_uint64(key, val)
        else:
            w.add_uint32(key, val)
    elif isinstance(val, float):
        w.add_float32(key, val)
    elif isinstance(val, str):
        w.add_string(key, val)
    elif isinstance(val, (list, tuple)):
        if val and isinstance(val[0], bool):
            w.add_key_value(key, list(val), gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.BOOL)
        elif val and isinstance(val[0], int):
            w.add_key_value(key, list(val), gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
        else:
            w.add_array(key, list(val))
    else:
        raise TypeError(f"unsupported metadata value for {key}: {type(val).__name__}")


def write_gguf(
    path: str | os.PathLike[str],
    arch: str,
    kv: Mapping[str, Any],
    tensors: Sequence[TensorSpec],
    fill: str = "sparse",
    seed: int = 0,
    random: Sequence[str] = (),
) -> int:
    """Write one GGUF file; returns its size in bytes. ``kv`` must not repeat general.architecture.
    ``random``: with ``fill="sparse"``, the f16/f32 tensors that get seeded random data all the same (a
    model's routing needs varied embeddings and router weights; the rest may stay zero)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(os.fspath(path), arch)
    for key, val in kv.items():
        _add_kv(w, key, val)
    rng = np.random.default_rng(seed)
    data_size = 0
    align = w.data_alignment
    for t in tensors:
        gt = by_name(t.type)
        nb = nbytes(gt, t.shape)
        raw = gguf.GGMLQuantizationType(gt.id)
        # GGUFWriter takes shapes outermost-first (numpy order) and reverses them on write.
        np_shape = tuple(reversed(t.shape))
        if fill == "random":
            if gt.name == "f32":
                arr = (rng.standard_normal(np_shape) * 0.02).astype(np.float32)
                w.add_tensor(t.name, arr)
            elif gt.name == "f16":
                arr = (rng.standard_normal(np_shape) * 0.02).astype(np.float16)
                w.add_tensor(t.name, arr)
            else:
                raise ValueError("random fill supports f32 and f16 tensors")
        else:
            w.add_tensor_info(t.name, np_shape, np.dtype(np.float32), nb, raw_dtype=raw)
        data_size += nb + (-nb % align)
    if fill == "random":
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    else:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None
        f = w.fout[0]
        f.flush()
        pos = f.tell()
        start = pos + (-pos % align)
        w.close()
        # The tensor data is a hole: the file has its full logical size but no blocks on disk.
        with open(path, "r+b") as fh:
            fh.truncate(start + data_size)
        if random:
            _fill_random(path, set(random), rng)
    return os.path.getsize(path)


def _fill_random(path: str | os.PathLike[str], names: set[str], rng: Any) -> None:
    import numpy as np

    from llamafit.gguf.reader import read_file_header

    header = read_file_header(os.fspath(path))
    with open(path, "r+b") as fh:
        for t in header.tensors:
            if t.name not in names or t.type.name not in ("f16", "f32"):
                continue
            n = t.nbytes // t.type.size
            data = rng.standard_normal(n).astype(np.float16 if t.type.name == "f16" else np.float32)
            fh.seek(t.offset)
            fh.write(data.tobytes())


def ensure_gguf(path: Path, names: Sequence[str], write: Callable[[Path], object]) -> Path:
    """``path``, written first by ``write`` (to a temporary file, then moved: a crash leaves nothing half-written)
    unless a file there already reads as a GGUF of the tensors ``names`` with their data inside it. A file written
    earlier is input: a damaged one (truncated, overwritten) is written again instead of failing every later use."""
    if path.is_file() and _lists(path, names):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def _lists(path: Path, names: Sequence[str]) -> bool:
    from llamafit.errors import LlamafitError
    from llamafit.gguf.reader import read_file_header

    try:
        header = read_file_header(path)  # refuses tensor data that runs past the file's end
    except (LlamafitError, OSError):
        return False
    return [t.name for t in header.tensors] == list(names)
