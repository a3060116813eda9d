"""Planning: from what the user typed to a plan and the exact argv for one server binary, in named stages,
each a function a test can call alone (docs/architecture.md, "Planning"):

``asked.read`` (the server flags as the binary reads them, the request) -> ``discover.machine_for`` (the
machine with its RPC devices) -> ``resolve.resolve`` (the model, its projector and adapters) -> the measuring
stage (``measure``: the devices' rates, measured or priors) -> ``fitting.fit`` (the memory fit, held to the
binary's no-alloc measurement by ``bound``, and the argv) -> ``fit.speed.priced`` (its speed) ->
``tuned.start_from_winner`` (what ``llamafit tune`` measured fastest). ``planner.Planner`` owns what the stages
share across one command's plans: the machine, the server and what it accepts, the Hub, the models read.

This package imports nothing on import: ``--help`` and completion never load the planner.
"""
