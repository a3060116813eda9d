"""The llama-server binary and its process.

Modules:

* ``binary``: finding llama-server;
* ``capabilities``: what a binary accepts, learned by asking it (cached by path and mtime);
* ``option_table``: llama-server's options, generated from llama.cpp's common/arg.cpp;
* ``args``: the command line parsed and composed through that one table;
* ``values``: an option's value read as llama-server reads it (integers, booleans, cache types, ``--override-kv``);
* ``compat``: an argv made to fit the binary that will run it;
* ``environment``: what the server inherits besides its argv;
* ``endpoint``: a running server's HTTP endpoint (http, https, a unix socket, an API prefix);
* ``unix_http``: HTTP over a unix socket, loaded when an endpoint connects to one;
* ``supervisor``: the server run under supervision: its log streamed, ready noticed, signals forwarded;
* ``children``: every process llamafit starts dies with it;
* ``bounded``: short child processes with a bound on time and output;
* ``fitprint``: the binary's own no-alloc measurement (``llama-fit-params``);
* ``logparse``: the memory log lines parsed into what each context allocated;
* ``failures``: why a server did not come up, one actionable message per class;
"""
