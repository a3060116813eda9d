"""Speed: how many tokens per second a plan gives, predicted from the plan and each device's measured
rates, and measured for real (llama-bench, the server's own timings).

* ``rates``: what a device does per second (measured, NVML, a card table, or given) and ``gpus`` the
  table of cards by name;
* ``work``: what each device reads and computes in one evaluation of the planned placement;
* ``model``: prompt processing and generation in tokens/s from those two (``Speed``);
* ``probe`` (with ``probe_models`` and ``bench``): the bounded, cached llama-bench measurement of each
  device the server will use;
* ``machine``: the rates of a machine's devices for one plan, from all of the above.
"""
