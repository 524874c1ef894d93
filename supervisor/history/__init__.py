"""The history of turns and the figures: the SQLite file's form and queries (`db`), the one writer
thread that fills it (`writer`), and the Prometheus exposition (`metrics`).

Knows SQLite and prometheus_client; nothing of slots or processes. Imports only the ground floor:
the daemon feeds it events, the CLI and the page read it.
"""
