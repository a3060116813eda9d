"""LoRA adapters and control vectors: memory they take beside the model's weights.

``llama_adapter_lora_init`` (src/llama-adapter.cpp:300-395) gives each ``<tensor>.lora_a``/``.lora_b`` pair
the buffer type of the model tensor it adapts, except a CPU extra buffer type (repacking), where it takes the
CPU's: an adapter's bytes sit on the device of the weights they change (logged as ``<buft> LoRA buffer
size``). A control vector (``--control-vector``, every file summed into one, common.cpp) is one row of
``n_embd`` floats for layers 1 to ``n_layer - 1`` on each layer's device (llama-adapter.cpp:42-90).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from llamafit.errors import BadModelFileError, ModelNotFoundError
from llamafit.gguf.reader import GGUFHeader, read_file_header
from llamafit.memory.placement import CPU, WeightPlacement


@dataclass(frozen=True)
class Adapters:
    lora: tuple[tuple[str, int], ...] = ()  # (the model tensor adapted, bytes of its A and B)
    cvec_row: int = 0  # bytes of a control vector's row (n_embd floats), 0: none
    sources: tuple[str, ...] = field(default=())  # the files, for the report

    @property
    def empty(self) -> bool:
        return not self.lora and not self.cvec_row

    def per_device(self, placement: WeightPlacement, n_layer: int) -> dict[str, int]:
        where = {p.tensor.name: (CPU if p.buft == "CPU_REPACK" else p.device) for p in placement.tensors}
        out: dict[str, int] = {}
        for name, nbytes in self.lora:
            dev = where.get(name, CPU)
            out[dev] = out.get(dev, 0) + nbytes
        if self.cvec_row:
            for il in range(1, n_layer):
                dev = placement.layer_device[il]
                out[dev] = out.get(dev, 0) + self.cvec_row
        return out

    def per_layer(self, layer_of: dict[str, int | None], n_units: int) -> list[int]:
        """Bytes each layer's weights bring along (for packing layers onto cards)."""
        out = [0] * n_units
        for name, nbytes in self.lora:
            il = layer_of.get(name)
            if il is not None and il < n_units:
                out[il] += nbytes
        if self.cvec_row:
            for il in range(1, n_units - 1):
                out[il] += self.cvec_row
        return out


def read_adapters(lora: Sequence[str], cvecs: Sequence[str], n_embd: int) -> Adapters:
    """The adapters' tensors from their headers (no data read); a file that is missing or not a GGUF adapter
    is an error naming it."""
    pairs: dict[str, int] = {}
    for path in lora:
        header = _header(path, "--lora")
        for t in header.tensors:
            base, dot, part = t.name.rpartition(".")
            if dot and part in ("lora_a", "lora_b"):
                pairs[base] = pairs.get(base, 0) + t.nbytes
        if not any(t.name.endswith((".lora_a", ".lora_b")) for t in header.tensors):
            raise BadModelFileError(f"--lora {path}: no LoRA tensors (*.lora_a, *.lora_b) in it")
    for path in cvecs:
        _header(path, "--control-vector")
    return Adapters(tuple(pairs.items()), 4 * n_embd if cvecs else 0, (*lora, *cvecs))


def _header(path: str, flag: str) -> GGUFHeader:
    if not os.path.isfile(path):
        raise ModelNotFoundError(f"{flag} {path}: no such file", hint="give the adapter's GGUF file")
    return read_file_header(path)
