"""A turn's life: its states and the one transition table (`states`), the manager that decides
(`manager`, with the Admission protocol it asks), the ledger of unfinished turns and the order
events leave in (`ledger`), every ending as one table (`endings`), starting a granted turn
(`starting`), the confirmed gone (`gone`), restore after a restart (`restore`), finished ids
(`finished`), requesters watched until gone (`requesters`), the fair wait queue and its order
(`waits`, `fairness`), the seams to the outside world (`seams`: the slot gate, guards, time),
what `ps` and `status` answer (`views`), queue.json and its journal (`store`), and the
OpenTelemetry attributes a turn's environment carries (`telemetry`).

Knows turns, waits and reservations; asks slots and guards through `seams`. Imports slots, guards,
output, wire, config and the ground floor; never admission, cluster, history, the daemon, the CLI
or the page (admission implements `manager.Admission`, made by the manager with the function the
daemon gives it, and given the manager as `manager.Turns`).
"""
