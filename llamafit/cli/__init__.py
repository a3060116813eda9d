"""The ``llamafit`` command line: the only package that imports typer and rich, and the only one that prints.

Modules:

* ``entry``: the executable, a fast path for shell completion before the app;
* ``app``: the Typer app and its small commands (``gpus``, ``inspect``, ``demo``, ``history``, ...);
* ``plan_command``: ``llamafit plan``;
* ``run_command``: ``llamafit run``;
* ``targets``: what ``plan`` and ``run`` share: the models and options a command line names, one model's plan;
* ``keep``: ``run``'s options for the server's life after ready, checked before anything is planned;
* ``dry``: what ``run`` says before a launch, and all that ``run --dry-run`` does (nothing of serving loaded);
* ``options``: every option declared once (type, flags, help);
* ``output``: where words go: data on stdout, progress, hints and errors on stderr;
* ``render``: the human tables of devices, models and plans;
* ``supervise``: ``run``'s view of serving: key lines, ready, predicted against actual, failures;
* ``relay``: that view written on a thread of its own, so a stderr nobody reads never stops the server;
* ``events``: ``run --events FILE``, one JSON object a line (``llamafit.event/1``);
* ``several``: ``plan`` and ``run`` with several models (the router);
* ``ladder``: ``plan --quants``, the quant ladder of a repo or folder;
* ``tune``: ``llamafit tune``;
* ``demo``: ``llamafit demo``, the whole pipeline on the embedded model;
* ``service``: ``llamafit service`` (install, show, remove, list);
* ``completion``: shell completion scripts for bash, zsh and fish.
"""
