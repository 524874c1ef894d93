"""Admission: may a key's head be granted now. The daemon's control loop for it (`control`:
pauses and rate windows on the bus, their timers), the policy (`policy`), pauses, start rates and
runtime limits (pure: no I/O, no clock), `[pause_on.<key>]` (a turn's stderr or exit pauses its
key) and admission.json (`state`).

Knows keys, times and reasons; implements turns.manager.Admission. Imports turns, wire, config and
the ground floor; never cluster, history, the daemon or the CLI.
"""
