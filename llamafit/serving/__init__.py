"""Serving: everything after the plan. A launch made ready (the argv's last touch, the downloads, the server
found), one server or the router run and watched to ready, what it allocated held to the plan, a load that ran
out of memory planned again; after ready: restarts, liveness probes, the memory watch, metrics, the requests'
timings; and the unit that runs it on boot. Nothing here prints: what happens comes back as events.

Modules:

* ``serve``: one server launched, watched to ready, held to its plan, kept while it serves;
* ``events``: what serving says while it happens, and how it ended.
"""
