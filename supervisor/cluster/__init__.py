"""The cluster gate: caps that hold across every supervisor of a cluster, kept in etcd v3 (`gate`),
one lease per supervisor and its fencing (`lease`), the watch on the prefix (`watch`), the
cluster caps (`caps`), what `status` and `show` say of it (`view`), where its threads meet the
event loop (`loop`), how it hooks into the daemon (`wiring`), and the etcd client over its JSON
gateway (`etcd`, `transport`).

Knows etcd and its own keys; asks the slot gate for the local slot. Imports slots, guards (a
guard's spec, to give a cluster turn's guard its deadline file), turns (only `manager.Turns`, what
its listener asks of the manager, and `states.State`), wire, config and the ground floor; never
turns' internals, admission, history or the CLI. Loaded only with a `[cluster]` table.
"""
