"""A model as llama.cpp sees it: every shard's header, the hparams and the whole tensor table.

Split sets follow ``src/llama-model-loader.cpp:82-108, 596-668``: shards are named
``<prefix>-NNNNN-of-MMMMM.gguf``, sit in one directory, carry ``split.no``/``split.count`` and
together hold ``split.tensors.count`` tensors. Any shard may be named; the set is found from it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from llamafit.errors import BadModelFileError, ModelNotFoundError
from llamafit.gguf.checks import check_arch
from llamafit.gguf.extents import read_remembered
from llamafit.gguf.hparams import Hparams, resolve_hparams
from llamafit.gguf.reader import GGUFHeader, TensorInfo
from llamafit.gguf.tensors import is_matmul_weight, layer_of

T = TypeVar("T")

SPLIT_RE = re.compile(r"^(?P<prefix>.+)-(?P<idx>\d{5})-of-(?P<cnt>\d{5})\.gguf$")


@dataclass(frozen=True)
class Tensor:
    info: TensorInfo
    shard: int  # index into ModelInfo.shards
    layer: int | None = None  # None: input layer; n_layer_all: output layer (gguf.tensors.layer_of)
    matmul: bool = False  # a MUL_MAT / MUL_MAT_ID weight

    @property
    def name(self) -> str:
        return self.info.name


@dataclass(frozen=True)
class ModelInfo:
    """Everything the planner knows about one GGUF model (all shards)."""

    path: str  # the first shard: what llama-server is given with -m
    shards: tuple[str, ...]
    shard_sizes: tuple[int, ...]
    hparams: Hparams
    kv: dict[str, object] = field(repr=False)
    tensors: tuple[Tensor, ...] = field(repr=False)
    # values derived from this model, computed once per model object (the fit asks for them many times)
    _memo: dict[Hashable, object] = field(default_factory=dict, repr=False, compare=False)

    def memo(self, key: Hashable, make: Callable[[], T]) -> T:
        """``make()``, computed once per model object and ``key`` (bounded: an old entry may be recomputed)."""
        if key not in self._memo:
            if len(self._memo) >= 128:
                self._memo.clear()
            self._memo[key] = make()
        return cast(T, self._memo[key])

    def known(self, key: Hashable) -> object | None:
        """What ``memo`` keeps for ``key``, without computing it (None: nothing yet)."""
        return self._memo.get(key)

    @property
    def arch(self) -> str:
        return self.hparams.arch

    @property
    def name(self) -> str:
        n = self.kv.get("general.name")
        return n if isinstance(n, str) else Path(self.path).name

    @property
    def file_size(self) -> int:
        return sum(self.shard_sizes)

    @property
    def tensor_bytes(self) -> int:
        return sum(t.info.nbytes for t in self.tensors)

    def has_tensor(self, name: str) -> bool:
        return any(t.name == name for t in self.tensors)

    def number(self, key: str) -> float:
        """``{arch}.<key>`` as a number; 0 where absent or not a number (the header is untrusted input, and
        llama.cpp's optional keys default to 0)."""
        v = self.kv.get(f"{self.arch}.{key}")
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0

    def to_json(self) -> dict[str, Any]:
        """``llamafit.inspect/1``: the architecture, the hyperparameters, every tensor and shard."""
        hp = self.hparams
        tensors = [
            {
                "name": t.name,
                "type": t.info.type.name,
                "shape": list(t.info.shape),
                "bytes": t.info.nbytes,
                "shard": t.shard,
            }
            for t in self.tensors
        ]
        return {
            "schema": "llamafit.inspect/1",
            "path": self.path,
            "shards": list(self.shards),
            "name": self.name,
            "architecture": hp.arch,
            "file_size": self.file_size,
            "tensor_bytes": self.tensor_bytes,
            "n_tensors": len(self.tensors),
            "hparams": {k: (list(v) if isinstance(v, tuple) else v) for k, v in hp.__dict__.items()},
            "tensors": tensors,
        }


def split_parts(path: str) -> tuple[str, int, int] | None:
    """``(prefix, index, count)`` of a shard name, or None."""
    m = SPLIT_RE.match(os.path.basename(path))
    if not m:
        return None
    prefix = os.path.join(os.path.dirname(path), m.group("prefix"))
    return prefix, int(m.group("idx")), int(m.group("cnt"))


def shard_path(prefix: str, idx: int, count: int) -> str:
    """``llama_split_path`` (src/llama.cpp:545-568)."""
    return f"{prefix}-{idx:05d}-of-{count:05d}.gguf"


def find_shards(path: str) -> list[str]:
    """All shards of the set ``path`` belongs to, in order; errors name the missing or stray file."""
    parts = split_parts(path)
    if parts is None:
        return [path]
    prefix, idx, count = parts
    if count < 1 or not 1 <= idx <= count:
        raise BadModelFileError(f"{path}: shard index {idx} is outside 1..{count}")
    directory = os.path.dirname(path) or "."
    base = os.path.basename(prefix)
    try:
        names = os.listdir(directory)
    except OSError as e:
        raise ModelNotFoundError(f"cannot list {directory}: {e.strerror}") from None
    for name in sorted(names):
        m = SPLIT_RE.match(name)
        if m and m.group("prefix") == base:
            i, c = int(m.group("idx")), int(m.group("cnt"))
            if c != count or not 1 <= i <= count:
                raise BadModelFileError(
                    f"stray shard {os.path.join(directory, name)}: it does not belong to a set of {count}",
                    hint="remove or move the stray file; llama-server loads shards by name",
                )
    shards = [shard_path(prefix, i, count) for i in range(1, count + 1)]
    for s in shards:
        if not os.path.isfile(s):
            raise ModelNotFoundError(
                f"missing shard {s} (the set has {count} shards)",
                hint="download the missing part; llama-server needs every shard in the same directory",
            )
    return shards


def _int_key(h: GGUFHeader, key: str) -> int | None:
    v = h.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def with_kv(model: ModelInfo, overrides: Mapping[str, object]) -> tuple[ModelInfo, list[str]]:
    """The model as llama.cpp loads it with ``--override-kv``: each overridden scalar key read as given (the
    loader's get_key takes overrides, llama-model-loader.cpp GGUFMeta::override); a key whose value in the
    file is an array is not overridden (get_arr does not look at overrides), which the notes say."""
    kv = dict(model.kv)
    notes = []
    for key, value in overrides.items():
        if isinstance(kv.get(key), list):
            notes.append(f"--override-kv {key}: an array in the file; llama-server does not override arrays")
            continue
        kv[key] = value
    if kv == model.kv:
        return model, notes
    check_arch(kv, model.path)
    hp = resolve_hparams(kv, model.path)
    tensors = tuple(Tensor(t.info, t.shard, layer_of(t.name, hp.n_layer_all), t.matmul) for t in model.tensors)
    return ModelInfo(model.path, model.shards, model.shard_sizes, hp, kv, tensors), notes


def model_from_headers(headers: Sequence[GGUFHeader], names: Sequence[str]) -> ModelInfo:
    """Assemble a ModelInfo from the headers of every shard (shard 1 first)."""
    first = headers[0]
    count = len(headers)
    declared = _int_key(first, "split.count")
    if count > 1 or (declared is not None and declared > 1):
        if declared != count:
            raise BadModelFileError(f"{names[0]}: split.count is {declared} but the set has {count} shards")
        total = _int_key(first, "split.tensors.count")
        for i, h in enumerate(headers):
            no = _int_key(h, "split.no")
            if no != i:
                raise BadModelFileError(
                    f"{names[i]}: split.no is {no}, expected {i} (the file name says shard {i + 1})"
                )
            if _int_key(h, "split.count") != count:
                raise BadModelFileError(f"{names[i]}: split.count disagrees with the first shard")
        found = sum(len(h.tensors) for h in headers)
        if total is not None and total != found:
            raise BadModelFileError(
                f"{names[0]}: corrupted split set: {total} tensors expected but {found} found",
                hint="one of the shards is from another conversion; download the set again",
            )
    check_arch(first.kv, names[0])
    hp = resolve_hparams(first.kv, names[0])
    seen: set[str] = set()
    tensors: list[Tensor] = []
    for i, h in enumerate(headers):
        for t in h.tensors:
            if t.name in seen:
                raise BadModelFileError(f"{names[i]}: tensor {t.name!r} appears in more than one shard")
            seen.add(t.name)
            tensors.append(Tensor(t, i, layer_of(t.name, hp.n_layer_all), is_matmul_weight(t.name, len(t.shape))))
    return ModelInfo(
        path=names[0],
        shards=tuple(names),
        shard_sizes=tuple(h.file_size for h in headers),
        hparams=hp,
        kv=first.kv,
        tensors=tuple(tensors),
    )


def load_model(path: str | os.PathLike[str], reader: Callable[[str], GGUFHeader] = read_remembered) -> ModelInfo:
    """Read a local GGUF model (any shard of a split set) without touching tensor data (by default jumping over the
    vocabulary where an earlier read of the same file found its end: ``llamafit.gguf.extents``)."""
    p = os.fspath(path)
    if not os.path.exists(p):
        raise ModelNotFoundError(
            f"model file not found: {p}", hint="check the path, or name a Hub repo as owner/repo[:QUANT]"
        )
    shards = find_shards(p)
    headers = [reader(s) for s in shards]
    if len(shards) == 1:
        declared = _int_key(headers[0], "split.count")
        if declared is not None and declared > 1:
            raise BadModelFileError(
                f"{p}: this is shard {(_int_key(headers[0], 'split.no') or 0) + 1} of {declared}, but its name "
                "does not follow <prefix>-NNNNN-of-MMMMM.gguf",
                hint="restore the original shard names; llama-server finds shards by name",
            )
    return model_from_headers(headers, shards)
