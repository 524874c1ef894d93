"""The slot gate: a machine-wide cap per key held as flock slots (`gate`), the slot records and
what their work is (`record`), and reading the gate without taking it, orphans and their reaping
(`views`). Also a library: any local program may take slots with `supervisor.slots.gate`, and the
cap holds for all of them together.

Knows flock, `/proc/locks` and records; nothing of ZeroMQ, waits or turns. Imports guards (the
reaper and a record's containment) and the ground floor; never turns, admission, cluster, the
daemon or the wire.
"""
