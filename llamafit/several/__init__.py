"""Several models at once under llama-server's router: their joint plan (plan), router presets read and
written as llama.cpp does (preset), and the router's log per instance (router_log)."""
