"""guardd: one turn's containment.

The guard runs a command in a process group it controls, sees every group the work creates (as a
child subreaper it even sees double-forked daemons), and ends all of it when the turn is over.
It imports only the standard library: its bus hints speak ZMTP themselves (guardd.hints), and pyzmq
is tried only for a transport other than ipc:// and tcp://.
"""
