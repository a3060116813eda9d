"""Serving: everything after the plan. A launch made ready (the argv's last touch, the downloads, the
server found), one server run and watched to ready (the router: ``llamafit.several.router``), what it allocated
held to the plan, a load that ran out of memory planned again; after ready: restarts, liveness probes, the memory
watch, metrics, the requests' timings; and the unit that runs it on boot. Nothing here prints: what happens comes
back as events.

Modules:

* ``serve``: one server launched, watched to ready, held to its plan, kept while it serves;
* ``events``: what serving says while it happens, and how it ended;
* ``watch``: the server's host memory over its life, held to the plan;
* ``liveness``: whether a ready server still serves (a real generation);
* ``restarts``: when a server that was ready is started again;
* ``metrics``: the Prometheus endpoint of a served model;
* ``listener``: an HTTP listener in llamafit's process that no client can exhaust (metrics, the several models' front);
* ``timings``: the server's own timings of the requests it serves;
* ``decay``: a server that slows over its life;
* ``compare``: a plan's buffers lined up with what the server logged;
* ``service``: a unit that starts ``llamafit run`` on boot;
* ``unit_syntax``: words as a systemd unit holds them, written and read back;
* ``outcome``: what a launch measured against what was planned: memory, a load that ran out, speed; the launch record;
* ``before``: what every launch does first: the server found, the downloads, the environment, ``-lv 4``.
"""
