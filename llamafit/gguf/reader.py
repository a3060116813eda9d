"""A bounded, lazy GGUF header reader.

Reads the key/value metadata and the tensor table and nothing else. Large arrays (the tokenizer's
vocabulary and merges) are skipped and recorded by length only, which is what makes a plan of a
150k-vocabulary model take milliseconds where ``gguf.GGUFReader`` takes seconds.

Every count, length and offset comes from an untrusted file, so each is bounded before use and a
violation raises :class:`~llamafit.errors.BadModelFileError` naming the file; the validation
mirrors ``ggml/src/gguf.cpp:gguf_init_from_file_impl`` so that what we accept, llama.cpp accepts.

The reader works over a :class:`ByteSource` so the same code parses a local file and (through HTTP
range requests) a file on the Hugging Face Hub.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from llamafit.errors import BadModelFileError, ModelNotFoundError
from llamafit.gguf.ahead import Ahead
from llamafit.gguf.ggml import TYPES, GGMLType, nbytes

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT, ggml/include/gguf.h:46
MAX_DIMS = 4  # GGML_MAX_DIMS

# Hard limits for untrusted headers. llama.cpp's own are looser (1 Gi strings) but a model header
# larger than this is not a model llamafit can plan; saying so beats allocating gigabytes.
MAX_HEADER_BYTES = 256 << 20
MAX_KV = 1 << 16
MAX_TENSORS = 1 << 20
MAX_KEY_LEN = 1 << 16
MAX_STRING_LEN = 64 << 20
# Arrays up to this many elements are materialised (per-layer hparams); longer ones are skipped.
MAX_KEPT_ARRAY = 1 << 16
# Scalar strings longer than this are recorded by length only (chat templates stay readable).
MAX_KEPT_STRING = 1 << 20


class ByteSource(Protocol):
    """Random-access bytes: a local file, or a file on the Hub read with range requests."""

    name: str
    size: int

    def read(self, offset: int, n: int) -> bytes:  # may return fewer bytes at end of data
        ...


class FileSource:
    """A local file read with ``os.pread``; the descriptor is closed by :meth:`close`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.name = os.fspath(path)
        try:
            st = os.stat(self.name)
        except FileNotFoundError:
            raise ModelNotFoundError(
                f"model file not found: {self.name}",
                hint="check the path, or name a Hub repo as owner/repo[:QUANT]",
            ) from None
        except OSError as e:
            raise ModelNotFoundError(f"cannot open {self.name}: {e.strerror}") from None
        if stat.S_ISDIR(st.st_mode):
            raise BadModelFileError(f"{self.name} is a directory, not a GGUF file")
        if not stat.S_ISREG(st.st_mode):
            # a FIFO or a device would block or never end; llama.cpp maps models, so it needs a file too
            raise BadModelFileError(f"{self.name} is not a regular file")
        try:
            self._fd = os.open(self.name, os.O_RDONLY)
        except OSError as e:
            raise ModelNotFoundError(f"cannot open {self.name}: {e.strerror}") from None
        self.size = st.st_size
        # the file as it is now: what a remembered extent of it is filed under (``llamafit.gguf.extents``)
        self.identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def read(self, offset: int, n: int) -> bytes:
        return os.pread(self._fd, n, offset)

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> FileSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class ArrayInfo:
    """A metadata array too long to keep: its element type and length only."""

    elem_type: int
    length: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: ne[0] is the row length
    type: GGMLType
    offset: int  # absolute offset in the file
    nbytes: int


@dataclass(frozen=True)
class Extent:
    """Where one long string array's elements (a vocabulary, its merges) start and end in a file, with the bytes
    just before the end: what lets a later read of the same file jump over them (``read_header``'s ``known``)."""

    start: int
    count: int
    end: int
    tail: bytes  # the ``TAIL`` bytes before ``end``


TAIL = 32  # bytes before an extent's end a jump checks: a stale extent of a changed file is not trusted


@dataclass(frozen=True)
class GGUFHeader:
    source_name: str
    file_size: int
    version: int
    alignment: int
    data_offset: int
    header_bytes: int  # bytes of the file the reader had to look at
    kv: dict[str, Any] = field(repr=False)
    tensors: tuple[TensorInfo, ...] = field(repr=False)
    # the long string arrays' extents, where the read was asked to find them (``read_header``'s ``known``)
    extents: tuple[Extent, ...] = field(default=(), repr=False, compare=False)

    def get(self, key: str, default: Any = None) -> Any:
        return self.kv.get(key, default)

    @property
    def architecture(self) -> str:
        arch = self.kv.get("general.architecture")
        return arch if isinstance(arch, str) else ""


# GGUF value types (ggml/include/gguf.h)
_U8, _I8, _U16, _I16, _U32, _I32, _F32, _BOOL, _STR, _ARR, _U64, _I64, _F64 = range(13)
_SCALAR_FMT = {
    _U8: "B",
    _I8: "b",
    _U16: "H",
    _I16: "h",
    _U32: "I",
    _I32: "i",
    _F32: "f",
    _BOOL: "?",
    _U64: "Q",
    _I64: "q",
    _F64: "d",
}
_SCALAR_SIZE = {t: struct.calcsize("<" + f) for t, f in _SCALAR_FMT.items()}

_U32_S = struct.Struct("<I")
_U64_S = struct.Struct("<Q")


class _Cursor:
    """Sequential reads over a ByteSource with a chunked buffer and a hard byte budget."""

    def __init__(self, src: ByteSource, chunk: int = 1 << 20) -> None:
        self.src = src
        self.chunk = chunk  # a local file: every read; a network source: the first (then ``ahead``)
        self.buf = b""
        self.buf_start = 0
        self.pos = 0  # absolute offset of the next byte
        # a network source: what the rest of the header needs (llamafit.gguf.ahead), so a refill asks for
        # all of it at once instead of doubling, and never far past the header's end
        self.ahead: Ahead | None = None
        # the string array being read: its key, where its elements start, how many it has and has left;
        # and each string array read so far: its length and its bytes
        self.arr_key = ""
        self.arr_start = 0
        self.arr_n = 0
        self.arr_left = 0
        self.arrays: dict[str, tuple[int, int]] = {}
        # a local source read with extents known from an earlier read (by start), and those this read found
        self.known: dict[int, Extent] | None = None
        self.found: list[Extent] = []

    def _fail_truncated(self) -> BadModelFileError:
        return BadModelFileError(
            f"{self.src.name}: the GGUF header is truncated (ends at byte {self.src.size})",
            hint="the download may be incomplete; fetch the file again",
        )

    def _fill(self, need: int) -> None:
        """Make ``need`` bytes from ``pos`` available in ``buf``."""
        end = self.pos + need
        if end > self.src.size:
            raise self._fail_truncated()
        if end > MAX_HEADER_BYTES:
            raise BadModelFileError(
                f"{self.src.name}: GGUF header larger than {MAX_HEADER_BYTES >> 20} MiB; refusing to read further",
                hint="this does not look like a model file llama.cpp would load",
            )
        rel = self.pos - self.buf_start
        keep = self.buf[rel:] if 0 <= rel <= len(self.buf) else b""
        start = self.pos + len(keep)
        if self.ahead is not None and self.pos > 0:
            want = self.ahead.request(start, need - len(keep))
        else:
            want = max(need - len(keep), self.chunk)
        want = min(want, self.src.size - start)
        data = self.src.read(start, want) if want > 0 else b""
        self.buf = keep + data
        self.buf_start = self.pos
        if len(self.buf) < need:
            raise self._fail_truncated()

    def take(self, n: int) -> bytes:
        rel = self.pos - self.buf_start
        if rel + n > len(self.buf):
            self._fill(n)
            rel = 0
        self.pos += n
        return self.buf[rel : rel + n]

    def u32(self) -> int:
        v: int = _U32_S.unpack(self.take(4))[0]
        return v

    def u64(self) -> int:
        v: int = _U64_S.unpack(self.take(8))[0]
        return v

    def skip(self, n: int) -> None:
        if self.pos + n > self.src.size:
            raise self._fail_truncated()
        if self.pos + n > MAX_HEADER_BYTES:
            self._fill(n)  # raises the size error
        self.pos += n

    def string(self, limit: int, what: str) -> str | None:
        """A GGUF string; ``None`` (and skipped) when longer than ``limit``."""
        n = self.u64()
        if n > MAX_STRING_LEN:
            raise BadModelFileError(f"{self.src.name}: {what} has an absurd length ({n} bytes)")
        if n > limit:
            self.skip(n)
            return None
        raw = self.take(n)
        return raw.decode("utf-8", errors="replace")

    def jump(self, count: int) -> Extent | None:
        """Past ``count`` strings starting here at once, where an earlier read of this file found where they end
        and the bytes before that end are still the same: that extent; None (nothing moved) otherwise."""
        e = self.known.get(self.pos) if self.known else None
        if e is None or e.count != count or not self.pos + 8 * count <= e.end <= min(self.src.size, MAX_HEADER_BYTES):
            return None
        if len(e.tail) != TAIL or e.end - TAIL < self.pos or self.src.read(e.end - TAIL, TAIL) != e.tail:
            return None
        self.pos = e.end
        return e

    def tail(self) -> bytes:
        """The ``TAIL`` bytes before ``pos`` (from the buffer when it holds them)."""
        rel = self.pos - self.buf_start
        if TAIL <= rel <= len(self.buf):
            return self.buf[rel - TAIL : rel]
        return self.src.read(self.pos - TAIL, TAIL)

    def skip_strings(self, count: int) -> None:
        """Skip ``count`` length-prefixed strings (the vocabulary) without decoding them.

        The hot loop of a plan: a 150k vocabulary is 150k iterations, so it only reads lengths, as a ``for``
        loop (a third faster than counting down in a ``while``), and refills the buffer only where a length
        runs past it: reading there raises ``struct.error`` (an absurd length runs past it too, and the refill
        refuses it).
        """
        unpack = _U64_S.unpack_from
        done = 0
        while done < count:
            buf, base = self.buf, self.buf_start
            rel = self.pos - base
            at = done
            try:
                for at in range(done, count):  # noqa: B007 (``at`` says where it stopped)
                    rel += 8 + unpack(buf, rel)[0]
                done = count
            except struct.error:
                done = at  # this string's length is past the buffer
            self.pos = base + rel
            if done < count:
                self.arr_left = count - done
                self._fill(8)
        if self.pos > self.src.size:
            self.pos = self.src.size
            raise self._fail_truncated()
        if self.pos > MAX_HEADER_BYTES:
            self._fill(1)  # raises the size error


def _read_value(cur: _Cursor, vtype: int, key: str) -> Any:
    if vtype == _STR:
        s = cur.string(MAX_KEPT_STRING, f"value of {key!r}")
        return s if s is not None else ArrayInfo(_STR, -1)
    fmt = _SCALAR_FMT.get(vtype)
    if fmt is None:
        raise BadModelFileError(f"{cur.src.name}: key {key!r} has an invalid GGUF type {vtype}")
    return struct.unpack("<" + fmt, cur.take(_SCALAR_SIZE[vtype]))[0]


def _read_array(cur: _Cursor, key: str) -> Any:
    elem = cur.u32()
    n = cur.u64()
    if elem == _ARR:
        raise BadModelFileError(f"{cur.src.name}: key {key!r} is a nested array, which llama.cpp rejects")
    if elem == _STR:
        cur.arr_key, cur.arr_start, cur.arr_n, cur.arr_left = key, cur.pos, n, n
        if n > MAX_KEPT_ARRAY:
            if n > cur.src.size:  # every string costs at least 8 bytes
                raise cur._fail_truncated()
            start = cur.pos
            jumped = cur.jump(n)
            if jumped is None:
                cur.skip_strings(n)
            if cur.known is not None:
                cur.found.append(jumped or Extent(start, n, cur.pos, cur.tail()))
            result: Any = ArrayInfo(_STR, n)
        else:
            out: list[Any] = []
            for i in range(n):
                cur.arr_left = n - i
                out.append(cur.string(MAX_KEPT_STRING, f"element of {key!r}"))
            result = out
        cur.arr_left = 0
        cur.arrays[key] = (n, cur.pos - cur.arr_start)
        return result
    fmt = _SCALAR_FMT.get(elem)
    if fmt is None:
        raise BadModelFileError(f"{cur.src.name}: array {key!r} has an invalid element type {elem}")
    size = _SCALAR_SIZE[elem] * n
    if n > MAX_KEPT_ARRAY:
        cur.skip(size)
        return ArrayInfo(elem, n)
    return list(struct.unpack(f"<{n}{fmt}", cur.take(size)))


def _tensor_table(cur: _Cursor, n_tensors: int, ahead: Ahead) -> list[tuple[str, tuple[int, ...], GGMLType, int]]:
    """The tensor table's entries (name, shape, type, offset in the data), each checked as gguf.cpp checks it."""
    raw: list[tuple[str, tuple[int, ...], GGMLType, int]] = []
    seen: set[str] = set()
    src = cur.src
    for i in range(n_tensors):
        ahead.tensors_done = i
        name = cur.string(MAX_KEY_LEN, f"tensor name #{i}")
        if name is None:
            raise BadModelFileError(f"{src.name}: tensor #{i} has an over-long name")
        if name in seen:
            raise BadModelFileError(f"{src.name}: duplicate tensor {name!r}")
        seen.add(name)
        n_dims = cur.u32()
        if n_dims > MAX_DIMS:
            raise BadModelFileError(f"{src.name}: tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS})")
        shape = tuple(cur.u64() for _ in range(n_dims))
        n_el = 1
        for d in shape:
            n_el *= d
        if n_el >= 1 << 63:
            raise BadModelFileError(f"{src.name}: tensor {name!r} has an absurd shape {shape}")
        type_id = cur.u32()
        t = TYPES.get(type_id)
        if t is None:
            raise BadModelFileError(f"{src.name}: tensor {name!r} has an unknown ggml type {type_id}")
        if shape and shape[0] % t.blck:
            raise BadModelFileError(
                f"{src.name}: tensor {name!r} row of {shape[0]} is not a multiple of the {t.name} block ({t.blck})"
            )
        rel_off = cur.u64()
        raw.append((name, shape, t, rel_off))

    return raw


def read_header(src: ByteSource, first_read: int | None = None, known: Sequence[Extent] | None = None) -> GGUFHeader:
    """Parse the metadata and tensor table of one GGUF file (one shard).

    ``first_read``: a network source pays per request and per byte: read this much first, then what the
    rest of the header needs (:class:`llamafit.gguf.ahead.Ahead`). ``known``: of a local source, the long string
    arrays' extents an earlier read of the same file found (``GGUFHeader.extents``, which this read fills): each
    one whose end still holds the same bytes is jumped over instead of walked string by string. That check is of
    the bytes before the end only: a caller that passes ``known`` reads again without it when the header does not
    parse (``llamafit.gguf.extents`` does), so a file changed in place under the same size and time is read whole."""
    whole = min(1 << 20, max(src.size, 1))
    cur = _Cursor(src, chunk=min(first_read, whole) if first_read else whole)
    if src.size < 24:
        raise BadModelFileError(f"{src.name}: too small to be a GGUF file ({src.size} bytes)")
    magic = cur.take(4)
    if magic != GGUF_MAGIC:
        raise BadModelFileError(
            f"{src.name}: not a GGUF file (magic {magic!r})",
            hint="llama-server loads GGUF models; convert others with llama.cpp's convert_hf_to_gguf.py",
        )
    version = cur.u32()
    if version not in (2, 3):
        raise BadModelFileError(f"{src.name}: unsupported GGUF version {version} (llama.cpp reads 2 and 3)")
    n_tensors = cur.u64()
    n_kv = cur.u64()
    if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
        raise BadModelFileError(f"{src.name}: absurd counts in the GGUF header ({n_tensors} tensors, {n_kv} keys)")

    if known is not None:
        cur.known = {e.start: e for e in known}
    kv: dict[str, Any] = {}
    ahead = Ahead(cur, n_kv, n_tensors, kv)
    if first_read:
        cur.ahead = ahead
    for i in range(n_kv):
        ahead.kv_done = i
        key = cur.string(MAX_KEY_LEN, f"key #{i}")
        if key is None:
            raise BadModelFileError(f"{src.name}: key #{i} is longer than {MAX_KEY_LEN} bytes")
        if key in kv:
            raise BadModelFileError(f"{src.name}: duplicate key {key!r}")
        vtype = cur.u32()
        kv[key] = _read_array(cur, key) if vtype == _ARR else _read_value(cur, vtype, key)

    alignment = kv.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise BadModelFileError(f"{src.name}: general.alignment must be a power of two, got {alignment!r}")

    ahead.kv_done, ahead.table_start = n_kv, cur.pos
    raw = _tensor_table(cur, n_tensors, ahead)
    header_end = cur.pos
    data_offset = header_end + (-header_end % alignment) if n_tensors else header_end
    tensors: list[TensorInfo] = []
    expected = 0
    for name, shape, t, rel_off in raw:
        nb = nbytes(t, shape) if shape else t.size
        # llama.cpp requires tensors to be packed in table order (gguf.cpp:800-812).
        if rel_off != expected:
            raise BadModelFileError(f"{src.name}: tensor {name!r} has offset {rel_off}, expected {expected}")
        expected += nb + (-nb % alignment)
        tensors.append(TensorInfo(name, shape, t, data_offset + rel_off, nb))
    if tensors:
        last = tensors[-1]
        if last.offset + last.nbytes > src.size:
            raise BadModelFileError(
                f"{src.name}: tensor data is truncated: the tensors need {last.offset + last.nbytes} bytes, "
                f"the file has {src.size}",
                hint="the download may be incomplete; fetch the file again",
            )
    return GGUFHeader(
        source_name=src.name,
        file_size=src.size,
        version=version,
        alignment=alignment,
        data_offset=data_offset,
        header_bytes=header_end,
        kv=kv,
        tensors=tuple(tensors),
        extents=tuple(cur.found),
    )


def read_file_header(path: str | os.PathLike[str]) -> GGUFHeader:
    with FileSource(path) as src:
        return read_header(src)
