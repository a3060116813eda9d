"""Which weights a backend refuses at load (llamafit.memory.weight_ops), on real GGUF files: the state-space
kernels' limits, as the loader's probes ask them (held to the Vulkan server in tests/test_vulkan.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafit.devices.machine import Device, Host, Machine
from llamafit.fit import make_plan
from llamafit.fit.request import build_request
from llamafit.gguf.model import load_model
from llamafit.memory.weight_ops import refuses
from llamafit.server.args import parse_server_args
from llamafit.units import GiB
from tests import factory

CASES = [
    # (shape, the tensor, {device: refused})
    ("mamba2_64", "blk.0.ssm_a", {"CUDA0": True, "Vulkan0": True, "MTL0": False, "RPC0": False}),
    ("mamba2_128", "blk.0.ssm_a", {"CUDA0": False, "ROCm0": False, "Vulkan0": False}),
    ("mamba2_96", "blk.0.ssm_a", {"CUDA0": False, "Vulkan0": True}),
    ("mamba1", "blk.0.ssm_a", {"CUDA0": False, "Vulkan0": True}),  # d_state 16, d_inner 512: CUDA's kernel
    ("mamba1_odd", "blk.0.ssm_a", {"CUDA0": True}),  # d_inner 320: not a multiple of 128 heads
    ("mamba1_odd", "blk.0.ssm_conv1d", {"CUDA0": True, "Vulkan0": False}),  # 320 channels
    ("mamba2_128", "blk.0.ssm_conv1d", {"CUDA0": False}),
    ("mamba2_128", "blk.0.ssm_in", {"CUDA0": False, "Vulkan0": False}),  # a matmul weight: never
]
SHAPES = {
    "mamba2_64": lambda: factory.mamba2(d_state=64),
    "mamba2_128": lambda: factory.mamba2(d_state=128, d_inner=1024, n_head=16, n_embd=512),
    "mamba2_96": lambda: factory.mamba2(d_state=96, d_inner=1024, n_head=16, n_embd=512),
    "mamba1": lambda: factory.mamba(),
    "mamba1_odd": lambda: factory.mamba(n_embd=160),
}


@pytest.mark.parametrize(("shape", "tensor", "expected"), CASES, ids=[f"{s}:{t}" for s, t, _ in CASES])
def test_the_state_space_kernels_refuse_what_their_backends_cannot_run(
    tmp_path: Path, shape: str, tensor: str, expected: dict[str, bool]
) -> None:
    model = load_model(SHAPES[shape]().write(tmp_path / f"{shape}.gguf"))
    t = next(t for t in model.tensors if t.name.removesuffix(".weight") == tensor)
    assert {dev: refuses(dev, t, model.hparams) for dev in expected} == expected


def test_a_refused_weight_is_placed_on_the_host_with_the_file_span_it_stretches(tmp_path: Path) -> None:
    """Every layer offloaded to a Vulkan device, yet each Mamba-2 layer's ssm_a (d_state 64) stays on the host:
    the mapped host buffer then spans the file from the token embedding to the last of them."""
    model = load_model(factory.mamba2(d_state=64).write(tmp_path / "m.gguf"))
    vulkan = Device("Vulkan0", "lavapipe", 8 * GiB, 8 * GiB)
    machine = Machine((vulkan,), Host(total=64 * GiB, available=64 * GiB))
    plan = make_plan(model, machine, build_request(parse_server_args(["-c", "4096", "-ngl", "all"])))
    on_host = {p.tensor.name for p in plan.footprint.placement.tensors if p.device == "CPU"}
    assert {f"blk.{i}.ssm_a" for i in range(model.hparams.n_layer)} <= on_host
    assert not any(n.endswith(("ssm_in.weight", "ssm_out.weight")) for n in on_host)
    mapped = dict(plan.footprint.placement.buffers)["CPU_Mapped"]
    assert mapped > 2 * sum(p.tensor.info.nbytes for p in plan.footprint.placement.tensors if p.device == "CPU")
