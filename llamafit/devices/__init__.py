"""The machine: the devices the server will use (machine: NVML, unified memory, blind devices; listed: the
server's own --list-devices) and llama.cpp RPC servers as devices (rpc); what a device does per second (rates)
and cards by name (cards). The speed model reads these; nothing here reads the speed model."""
