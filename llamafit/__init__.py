"""llamafit: start llama.cpp's llama-server with the best configuration that fits the machine.

The core is importable and silent: it returns frozen dataclasses and never prints. Only ``llamafit.cli`` talks
to a terminal. The pipeline (docs/architecture.md): ``planning`` reads the request, the machine (``devices``) and
the model (``gguf``, ``hub``), prices it (``memory``, ``speed``), fits it (``fit``, ``speculative``) and composes
the argv (``server``); ``serving`` runs it and ``several`` runs a set under the router.

Modules:

* ``cli``: the command line (Typer, rich), the only part that prints;
* ``planning``: from what the user typed to a plan and its argv, in named stages;
* ``gguf``: GGUF headers read, hparams resolved as llama.cpp does, test and demo models written;
* ``hub``: models on the Hugging Face Hub, sized from their headers;
* ``devices``: the machine: the devices the server will use, host RAM, RPC servers, cards by name;
* ``memory``: every byte llama.cpp allocates for a load, per device and buffer;
* ``fit``: context, placement, split and drafter chosen against each device;
* ``speculative``: which drafter, what it costs;
* ``speed``: the speed model, the probe that measures each device, llama-bench;
* ``server``: the llama-server binary, its flags and its process;
* ``several``: several models under llama-server's router;
* ``options``: llamafit's own options with their defaults;
* ``serving``: everything after the plan: launched, watched, kept while it serves, and on boot;
* ``tune``: the configurations that fit measured with llama-bench, the fastest kept;
* ``errors``: the typed errors, each with a hint and an exit code;
* ``numbers``: bounded numbers read from other programs' text;
* ``units``: byte sizes parsed and printed;
* ``paths``: llamafit's folders, and files read and written safely;
* ``store``: llamafit's own files read back as input;
* ``shellwords``: an argv as shell words that give back its exact bytes.
"""

__version__ = "0.1.0"
