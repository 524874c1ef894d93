"""ccsup's supervisor: slots, turns, waits and the bus. Imports guardd, never the reverse.

The house has a ground floor (errors, paths, caps, holder, polling, filework, instance,
plain_asyncio) and wings, one folder a noun, each with its design note in its `__init__`. Imports
run one way: cli, web -> daemon -> admission, cluster -> turns -> slots -> guards -> output,
client -> wire, config -> the ground floor -> guardd. A lower wing that needs an upper one declares
a Protocol (turns.seams, turns.manager.Admission). The one import that runs back up is for types
only: config.cluster names cluster.transport's EtcdSettings under TYPE_CHECKING.
"""

__version__ = "0.1.0"
