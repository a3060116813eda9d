"""Planning: from what the user typed to a plan and the exact argv for one server binary, in named stages,
each a function a test can call alone (docs/architecture.md, "Planning"):

``asked.read`` (the server flags as the binary reads them, the request) -> ``discover.machine_for`` (the
machine with its RPC devices) -> ``resolve.resolve`` (the model, its projector and adapters) -> the measuring
stage (``measure``: the devices' rates, measured or priors) -> ``fitting.fit`` (the memory fit, held to the
binary's no-alloc measurement by ``bound``, and the argv) -> ``fit.speed.priced`` (its speed) ->
``tuned.start_from_winner`` (what ``llamafit tune`` measured fastest). ``planner.Planner`` owns what the stages
share across one command's plans: the machine, the server and what it accepts, the Hub, the models read.

Modules:

* ``asked``: the reading stage: the server flags as the binary reads them, the request;
* ``discover``: the discovering stage: the server binary, the machine as it sees it, the RPC devices;
* ``resolve``: the resolving stage: the model (local or a Hub repo's), its projector and adapters;
* ``measure``: the measuring stage: the devices' rates, measured or priors;
* ``fitting``: the fitting stage: the memory fit and its argv;
* ``bound``: a plan held to the binary's own no-alloc measurement where the memory model is not sure;
* ``tuned``: what ``llamafit tune`` measured fastest, the last stage;
* ``numa``: the note a plan carries where ``--numa`` would speed a host of several NUMA nodes;
* ``planner``: one command's planning context, shared by its plans;
* ``prepared``: what planning gives a command: the plan, the argv, what to tell the user;
* ``quants``: which quant of a repo or folder fits.

This package imports nothing on import: ``--help`` and completion never load the planner.
"""
