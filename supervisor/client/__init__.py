"""The client of one supervisor, for the CLI, the page and sidecars: control requests and turns
(`control`), a live bus subscription with its gaps counted (`subscription`), and a turn's output
reassembled exactly from its events (`turn_output`).

Knows zmq sockets, the protocol's envelope and the state directory's endpoints; nothing of slots
or processes. Imports wire, config and the ground floor; never the daemon.

`from supervisor.client import Client` is the sidecars' import: the names below are the package's
public face, and the only re-export in ccsup kept for an import path.
"""

from .control import CLIENT_KEY_ENV, Client, RemoteError
from .turn_output import OutputGap, TurnOutput

__all__ = ["CLIENT_KEY_ENV", "Client", "OutputGap", "RemoteError", "TurnOutput"]
