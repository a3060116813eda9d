"""Several models at once under llama-server's router.

Modules:

* ``together``: their joint plan: contexts, placement, what may be resident at once;
* ``budget``: which models fit together by their plans, and which to unload for another;
* ``preset``: router presets read and written as llama.cpp does;
* ``router``: the router launched and watched, each instance held to its own plan;
* ``keeper``: the router's instances kept alive while it serves;
* ``front``: the user's address before the router, a model loaded once the budget has room;
* ``router_log``: the router's log, per instance.
"""
