"""The machine: the devices the server will use (machine: NVML, unified memory, blind devices; listed: the
server's own --list-devices) and llama.cpp RPC servers as devices (rpc)."""
