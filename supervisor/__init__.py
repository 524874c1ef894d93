"""ccsup's supervisor: slots, turns, waits and the bus. Imports guardd, never the reverse."""

__version__ = "0.1.0"
