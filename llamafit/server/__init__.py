"""The llama-server binary and its process: finding it (binary), what it accepts (capabilities, compat,
the generated option_table and args, which parses and composes its command line), its environment, the one
process runner (supervisor, with bounded for short probes), and reading its log (logparse, failures)."""
