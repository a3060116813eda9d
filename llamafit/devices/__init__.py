"""The machine: the devices the server will use and what each does per second. The speed model reads these;
nothing here reads the speed model.

Modules:

* ``machine``: what the machine has: NVML's cards, unified memory, blind devices, host RAM through psutil;
* ``listed``: the devices as ``llama-server --list-devices`` prints them (ROCm, Vulkan, Metal, SYCL, RPC);
* ``rpc``: llama.cpp RPC servers as offload devices;
* ``described``: hardware described with ``--gpu`` and ``--host-ram`` instead of detected;
* ``types``: the offload devices and the host's RAM as a plan is made for them;
* ``numa``: the host's NUMA nodes as llama.cpp counts them;
* ``rates``: what a device does per second, the figures the speed model divides by;
* ``cards``: cards by name, with their published peaks.
"""
