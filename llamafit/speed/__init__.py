"""Speed: how many tokens per second a plan gives, predicted from the plan and each device's measured
rates, and measured for real (llama-bench, the server's own timings).

Modules:

* ``work``: what each device reads and computes in one evaluation of the planned placement;
* ``prediction``: the speed model: prompt processing and generation in tokens/s (``Speed``);
* ``parallel``: how ``-sm tensor`` and ``-sm row`` spread one evaluation over cards at once;
* ``tiles``: how ggml-cuda's MMQ tiles an MoE ubatch's expert matmuls;
* ``priors``: what a device does per second where nothing was measured, per backend;
* ``known``: a device's rates without measuring it: a card's peak with its backend's priors, what is assumed;
* ``rate_source``: each device's rates for one plan, measured by the probe or from priors (``RateSource``);
* ``probe``: the bounded llama-bench measurement of each device;
* ``attention_run``: how deep a cache the probe's attention run times within a plan's time;
* ``probe_cache``: the probe's cache of timings and failures, and the measuring lock;
* ``probe_models``: the synthetic models the probe times;
* ``bench``: running the real llama-bench and reading its JSON lines;
* ``busy``: whether the machine is quiet enough to measure;
* ``calibrate``: past launches' served speed against their plans, correcting the next;
"""
