"""guardd: one turn's containment.

The guard runs a command in a process group it controls, sees every group the work creates (as a
child subreaper it even sees double-forked daemons), and ends all of it when the turn is over.
It imports only the standard library; ZeroMQ only when asked to publish on a bus.
"""
