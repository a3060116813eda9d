"""Replicas of ggml's graph allocator (galloc) and scheduler (sched), the graph builders of the model
classes llama.cpp builds (attention, mla, hybrid, mamba, mtp, dflash, sampling, trunk), and which graph a model
replays (replay)."""
