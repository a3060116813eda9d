"""llamafit: start llama.cpp's llama-server with the best configuration that fits the machine.

The core (``gguf``, ``devices``, ``memory``, ``fit``, ``argv``, ``server``) is importable and
silent: it returns frozen dataclasses and never prints. Only ``llamafit.cli`` talks to a terminal.
"""

__version__ = "0.1.0"
