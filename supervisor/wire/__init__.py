"""The wire: protocol v1's closed vocabulary (envelopes, topics, error codes), each command's
arguments checked and typed (`args`), and how a requester is shown (`requester`).

Knows JSON frames and their fields; nothing of sockets, slots or processes. Imports only the
ground floor (errors, paths, caps, holder). Every wing that speaks to a client or reads a bus body
imports it; it imports no wing.
"""
