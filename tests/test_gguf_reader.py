"""The lazy GGUF reader: real files written by gguf.GGUFWriter, and hostile ones."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import gguf
import pytest

from llamafit.errors import BadModelFileError, ModelNotFoundError
from llamafit.gguf.ggml import TYPES
from llamafit.gguf.reader import ArrayInfo, read_file_header
from llamafit.gguf.writer import TensorSpec, write_gguf
from tests import factory


def test_type_table_matches_the_gguf_package() -> None:
    for qtype, (blck, size) in gguf.GGML_QUANT_SIZES.items():
        t = TYPES[int(qtype)]
        assert (t.blck, t.size) == (blck, size), t.name
        assert t.name.lower() == qtype.name.lower()


def test_reads_metadata_and_tensor_table(tmp_path: Path) -> None:
    p = factory.dense(n_layer=2, n_vocab=70000).write(tmp_path / "m.gguf")
    h = read_file_header(p)
    assert h.architecture == "llama"
    assert h.get("llama.block_count") == 2
    assert h.get("llama.attention.layer_norm_rms_epsilon") == pytest.approx(1e-6)
    # the 70000-entry vocabulary is skipped and recorded by length only
    assert h.get("tokenizer.ggml.tokens") == ArrayInfo(8, 70000)
    assert isinstance(h.get("tokenizer.ggml.scores"), ArrayInfo)
    names = [t.name for t in h.tensors]
    assert names[0] == "token_embd.weight"
    emb = h.tensors[0]
    assert emb.shape == (256, 70000)
    assert emb.nbytes == 256 * 70000 * 2
    # offsets are absolute and aligned, like llama.cpp computes them
    assert all(t.offset % h.alignment == 0 for t in h.tensors)
    assert h.tensors[-1].offset + h.tensors[-1].nbytes <= h.file_size


def test_agrees_with_gguf_reader_on_every_tensor(tmp_path: Path) -> None:
    p = factory.moe(n_layer=2).write(tmp_path / "moe.gguf")
    ours = {t.name: t for t in read_file_header(p).tensors}
    theirs = gguf.GGUFReader(p)
    assert len(ours) == len(theirs.tensors)
    for t in theirs.tensors:
        o = ours[t.name]
        assert o.nbytes == t.n_bytes
        assert o.offset == t.data_offset
        assert list(o.shape) == [int(x) for x in t.shape]
        assert o.type.id == int(t.tensor_type)


def _header(n_tensors: int, n_kv: int, magic: bytes = b"GGUF", version: int = 3) -> bytes:
    return magic + struct.pack("<IQQ", version, n_tensors, n_kv)


def _kv_string(key: str, value: str) -> bytes:
    k = key.encode()
    v = value.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", 8) + struct.pack("<Q", len(v)) + v


@pytest.mark.parametrize(
    ("blob", "match"),
    [
        (b"", "too small"),
        (b"PK\x03\x04" + b"\0" * 40, "not a GGUF file"),
        (_header(0, 0, version=9) + b"\0" * 8, "unsupported GGUF version"),
        (_header(10**12, 1) + b"\0" * 8, "absurd counts"),
        (_header(0, 1) + struct.pack("<Q", 2**62) + b"ab", "absurd length"),
        (_header(0, 1) + struct.pack("<Q", 200) + b"ab" * 10, "truncated"),
        (_header(0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<I", 42) + b"\0" * 16, "invalid GGUF type"),
        (
            _header(0, 1) + struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", 9, 9, 1) + b"\0" * 16,
            "nested array",
        ),
        (_header(0, 2) + _kv_string("a", "x") + _kv_string("a", "y"), "duplicate key"),
        (
            _header(1, 0) + struct.pack("<Q", 1) + b"t" + struct.pack("<I", 7) + b"\0" * 64,
            "dimensions",
        ),
        (
            _header(1, 0) + struct.pack("<Q", 1) + b"t" + struct.pack("<IQ", 1, 16) + struct.pack("<IQ", 77, 0),
            "unknown ggml type",
        ),
        (
            _header(1, 0) + struct.pack("<Q", 1) + b"t" + struct.pack("<IQ", 1, 33) + struct.pack("<IQ", 8, 0),
            "not a multiple",
        ),
        (
            _header(1, 0) + struct.pack("<Q", 1) + b"t" + struct.pack("<IQ", 1, 1 << 40) + struct.pack("<IQ", 0, 0),
            "truncated",
        ),
    ],
    ids=[
        "empty", "zip", "version", "counts", "huge-string", "short-string", "bad-type", "nested-array",
        "duplicate-key", "too-many-dims", "unknown-tensor-type", "unaligned-row", "data-beyond-eof",
    ],
)  # fmt: skip
def test_hostile_files_give_a_clear_error(tmp_path: Path, blob: bytes, match: str) -> None:
    p = tmp_path / "bad.gguf"
    p.write_bytes(blob)
    with pytest.raises(BadModelFileError, match=match):
        read_file_header(p)


def test_a_header_cut_in_the_middle_is_truncated_not_a_crash(tmp_path: Path) -> None:
    p = factory.dense(n_layer=2).write(tmp_path / "ok.gguf")
    data = p.read_bytes()
    for cut in (30, 200, 5000, len(data) // 3):
        q = tmp_path / f"cut{cut}.gguf"
        q.write_bytes(data[:cut])
        with pytest.raises(BadModelFileError):
            read_file_header(q)


def test_a_missing_file_is_model_not_found(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="not found"):
        read_file_header(tmp_path / "nope.gguf")


def test_a_directory_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(BadModelFileError, match="directory"):
        read_file_header(tmp_path)


def test_tensor_offsets_out_of_order_are_rejected(tmp_path: Path) -> None:
    p = tmp_path / "m.gguf"
    write_gguf(p, "llama", {}, [TensorSpec("a.weight", (32,)), TensorSpec("b.weight", (32,))])
    data = bytearray(p.read_bytes())
    # the second tensor's relative offset is the last 8 bytes of its table entry; point it elsewhere
    h = read_file_header(p)
    rel_b = h.tensors[1].offset - h.data_offset
    needle = struct.pack("<Q", rel_b)
    idx = data.rfind(needle, 0, h.data_offset)
    data[idx : idx + 8] = struct.pack("<Q", rel_b + 32)
    p.write_bytes(bytes(data))
    with pytest.raises(BadModelFileError, match="offset"):
        read_file_header(p)


def _ranged(path: Path, asked: list[int]) -> Callable[[int, int], bytes]:
    """Range reads of a local file, as the Hub serves them, each one's size heard in ``asked``."""

    def fetch(offset: int, n: int) -> bytes:
        asked.append(n)
        with path.open("rb") as f:
            f.seek(offset)
            return f.read(n)

    return fetch


def test_a_hostile_count_cannot_make_one_network_read_large(tmp_path: Path) -> None:
    """The network reader asks for what the rest of the header needs; a vocabulary that claims 100M
    tokens over a 1 GiB file (zeros: empty strings) is read in bounded requests and refused."""
    from llamafit.gguf.ahead import AHEAD_MAX
    from llamafit.gguf.reader import read_header
    from llamafit.hub.remote import FIRST_RANGE, MAX_REMOTE_HEADER, RemoteSource

    key = b"tokenizer.ggml.tokens"
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    head += struct.pack("<IIQ", 9, 8, 100_000_000)  # an array of 100M strings
    path = tmp_path / "hostile.gguf"
    with path.open("wb") as f:
        f.write(head)
        f.truncate(1 << 30)
    asked: list[int] = []
    with pytest.raises(BadModelFileError, match="runs past"):
        read_header(RemoteSource(_ranged(path, asked), "hostile.gguf", 1 << 30), first_read=FIRST_RANGE)
    assert max(asked) <= AHEAD_MAX and sum(asked) <= MAX_REMOTE_HEADER


def test_a_vocabulary_whose_first_strings_are_long_is_not_read_far_past_its_header(tmp_path: Path) -> None:
    """The strings read first say how long the rest are; where they are longer than the rest (2000 long
    control tokens ahead of a 100k vocabulary), the reader still ends every request within 1.10 times the
    least the header can be (the likely size alone read 2.6 times the header in two requests)."""
    from llamafit.gguf.ahead import OVER_READ
    from llamafit.gguf.reader import read_header
    from llamafit.hub.remote import FIRST_RANGE, RemoteSource

    vocab = factory.bpe_vocab(100000, 99744)
    tokens = list(vocab["tokenizer.ggml.tokens"])
    vocab["tokenizer.ggml.tokens"] = [f"<|reserved_control_token_{i}|>".ljust(40, "_") for i in range(2000)] + tokens[
        : 100000 - 2000
    ]
    path = factory.with_vocab(factory.qwen3_0_6b(), vocab).write(tmp_path / "long-first.gguf")
    asked: list[int] = []
    h = read_header(RemoteSource(_ranged(path, asked), path.name, path.stat().st_size), first_read=FIRST_RANGE)
    assert h.data_offset <= sum(asked) <= OVER_READ * h.data_offset and len(asked) <= 6, asked
