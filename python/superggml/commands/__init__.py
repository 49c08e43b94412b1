"""The commands: the CLI (`superggml generate, serve, bench, analyze, plan, rpc-server, plot`) and what only
its commands use: analyze (layer sizes, measured costs, predicted budgets), allocation (the layer-to-device
allocation `plan` prints) and plot (a timeline from a metrics file)."""
