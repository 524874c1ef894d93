"""The daemon: the wiring of every wing, the single-instance lock, signals, the periodic duties and
shutdown (`main`), the control and bus sockets (`server`), the page's process run beside it
(`page`), giving freed heap back to the kernel (`memtrim`), and a span per turn to an OTLP
collector (`otel`).

The top of the house below the CLI: imports every wing below it (admission, cluster, turns, slots,
guards, history, output, wire, config). Imported only by `ccsup start --foreground`.
"""
