"""Device discovery. NVML is the one boundary faked here, through the GpuProbe seam."""

from __future__ import annotations

import pytest

from llamafit.devices.described import parse_gpu_spec
from llamafit.devices.machine import GpuProbeError, Host, PhysicalGpu, apply_cuda_visible, discover
from llamafit.errors import UsageError
from llamafit.units import GiB, MiB

HOST = Host(total=64 * GiB, available=60 * GiB)

PHYS = [
    PhysicalGpu(0, "NVIDIA RTX 4090", "GPU-aaaa1111-0000-0000-0000-000000000000", 24 * GiB, 23 * GiB),
    PhysicalGpu(1, "NVIDIA RTX 3090", "GPU-bbbb2222-0000-0000-0000-000000000000", 24 * GiB, 20 * GiB),
    PhysicalGpu(2, "NVIDIA A4000", "GPU-cccc3333-0000-0000-0000-000000000000", 16 * GiB, 16 * GiB),
]


class FakeProbe:
    def __init__(self, gpus: list[PhysicalGpu] | None = None, error: str | None = None) -> None:
        self._gpus = gpus or []
        self._error = error

    def gpus(self) -> list[PhysicalGpu]:
        if self._error:
            raise GpuProbeError(self._error)
        return list(self._gpus)


def test_all_gpus_named_in_cuda_order() -> None:
    m = discover(probe=FakeProbe(PHYS), environ={}, host=HOST)
    assert [(g.id, g.nvml_index) for g in m.gpus] == [("CUDA0", 0), ("CUDA1", 1), ("CUDA2", 2)]
    assert m.gpus[1].free == 20 * GiB


def test_cuda_visible_devices_reorders_and_filters() -> None:
    m = discover(probe=FakeProbe(PHYS), environ={"CUDA_VISIBLE_DEVICES": "2,0"}, host=HOST)
    assert [(g.id, g.name) for g in m.gpus] == [("CUDA0", "NVIDIA A4000"), ("CUDA1", "NVIDIA RTX 4090")]
    assert m.notes


def test_cuda_visible_devices_by_uuid_and_prefix() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "GPU-bbbb2222-0000-0000-0000-000000000000,cccc"}
    m = discover(probe=FakeProbe(PHYS), environ=env, host=HOST)
    assert [g.nvml_index for g in m.gpus] == [1, 2]


def test_cuda_visible_devices_stops_at_the_first_invalid_entry() -> None:
    assert [g.index for g in apply_cuda_visible(PHYS, "1,7,0")] == [1]
    assert apply_cuda_visible(PHYS, "") == []
    assert apply_cuda_visible(PHYS, "-1") == []


def test_no_nvml_is_a_cpu_plan_with_a_note() -> None:
    m = discover(probe=FakeProbe(error="NVML Shared Library Not Found"), environ={}, host=HOST)
    assert m.gpus == ()
    assert "NVML" in m.notes[0] and "no NVIDIA GPU" in m.notes[0]


def test_real_nvml_probe_does_not_crash_here() -> None:
    """On a machine without NVIDIA drivers the real probe reports, it does not raise."""
    m = discover(environ={}, host=HOST)
    assert isinstance(m.gpus, tuple)


def test_gpu_specs_describe_other_hardware() -> None:
    m = discover(gpu_specs=["22GiB/24GiB", "16GiB"], probe=FakeProbe(error="unused"), host=HOST)
    assert [(g.id, g.free, g.total) for g in m.gpus] == [
        ("CUDA0", 22 * GiB, 24 * GiB),
        ("CUDA1", 16 * GiB, 16 * GiB),
    ]
    assert parse_gpu_spec("8000MiB") == (8000 * MiB, 8000 * MiB)
    for bare in ("24", "22/24", "22GiB/24"):  # --gpu 24 meant GiB: a unit is required
        with pytest.raises(UsageError, match="give a unit"):
            parse_gpu_spec(bare)
    with pytest.raises(UsageError):
        parse_gpu_spec("30GiB/24GiB")
    with pytest.raises(UsageError, match="not a size"):
        parse_gpu_spec("lots")


def test_cpu_only_ignores_gpus() -> None:
    m = discover(cpu_only=True, probe=FakeProbe(PHYS), host=HOST)
    assert m.gpus == ()


def test_nvml_says_nothing_of_a_cards_use_where_it_cannot_read_it() -> None:
    """Without a card or driver (as here) a card's use is not known: never an error, never 'idle'."""
    from llamafit.devices.machine import NvmlProbe

    assert NvmlProbe().busy(0) is None


def test_without_nvidias_library_the_probe_says_so_without_importing_pynvml() -> None:
    """A machine without NVIDIA's driver library (as here, unless a driver is installed) gets pynvml's own
    message, and a plan does not pay for importing pynvml to hear it."""
    import ctypes
    import subprocess
    import sys

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        pytest.skip("NVIDIA's driver library is installed here")
    except OSError:
        pass
    code = (
        "import sys\n"
        "from llamafit.devices.machine import GpuProbeError, NvmlProbe\n"
        "try:\n"
        "    NvmlProbe().gpus()\n"
        "except GpuProbeError as e:\n"
        "    print(e)\n"
        "print('pynvml' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:2] == ["NVML Shared Library Not Found", "False"]


def test_the_missing_library_message_is_pynvmls() -> None:
    import pynvml

    from llamafit.devices.machine import NO_LIBRARY

    assert str(pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)) == NO_LIBRARY


def test_a_gpu_value_may_list_several_cards() -> None:
    """``--gpu rtx-4090,rtx-3090`` is two cards (it was planned as one RTX 4090: the table took the rest of the
    value for a longer name of that card)."""
    from llamafit.devices.described import described_gpus

    devs = described_gpus(["rtx-4090,rtx-3090", "vulkan:8GiB"])
    assert [(d.id, d.total >> 30) for d in devs] == [("CUDA0", 24), ("CUDA1", 24), ("Vulkan0", 8)]
    assert "RTX 3090" in devs[1].name
    for bad in ("rtx-4090,", ",8GiB", "8GiB,,8GiB"):
        with pytest.raises(UsageError, match="empty entry"):
            described_gpus([bad])


def test_a_card_name_that_is_not_known_is_said_so() -> None:
    """A name the table does not have is an unknown card (it was "not a size"), with the table's names it may
    mean; a bare number that is a card's is offered that card beside the unit."""
    from llamafit.devices.described import described_gpu

    with pytest.raises(UsageError, match="no card called 'rtx-9999' is known") as e:
        described_gpu("rtx-9999")
    assert "did you mean" not in str(e.value)
    with pytest.raises(UsageError, match=r"no card called '4090' is known \(did you mean RTX 4090\?\)"):
        described_gpu("24GiB@4090")
    with pytest.raises(UsageError, match="give a unit") as e:
        described_gpu("4090")
    assert "--gpu rtx-4090" in (e.value.hint or "")
    with pytest.raises(UsageError, match="give a unit") as e:
        described_gpu("24")
    assert "card" not in (e.value.hint or "")
