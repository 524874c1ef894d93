"""A turn's output: its bytes cut into bus chunks that tile the log (`chunks`), when each piece
arrived (`line_times`, the `.idx` beside each log), and which old logs are deleted (`retention`).

Knows files under `<state>/turns/<id>/` and the protocol's chunk shape (wire); reads `[logs]` from
config. Never imports guards, slots, turns or the daemon: the guard handle (guards.handle)
writes through it, the CLI and the page read through it.
"""
