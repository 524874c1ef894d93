"""What `ccsup-guard` was asked to do: `Options`, built by guardd.__main__, read by guardd.guard.

Knows the fields and their defaults; nothing of parsing (guardd.__main__: arguments and
environment) or of what the guard does with them. Stateless.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the guard's start pays)
if TYPE_CHECKING:
    from collections.abc import Mapping


class Options:
    """What `ccsup-guard` was asked to do (a plain class: dataclasses cost ~10 ms of a start)."""

    __slots__ = (
        "argv",
        "record_dir",
        "grace",
        "scan",
        "turn",
        "bus",
        "cgroup",
        "deadline_file",
        "log_dir",
        "log_limit",
        "adopt_within",
        "env",
        "tty",
    )

    def __init__(
        self,
        argv: list[str],
        record_dir: str | None = None,
        grace: float = 5.0,
        scan: float = 2.0,
        turn: str | None = None,
        bus: str | None = None,
        cgroup: str | None = None,
        deadline_file: str | None = None,
        env: Mapping[str, str] | None = None,
        tty: bool = False,
        log_dir: str | None = None,
        log_limit: int | None = None,
        adopt_within: float = 0.0,
    ):
        self.argv, self.record_dir, self.grace, self.scan = argv, record_dir, grace, scan
        self.turn, self.bus, self.cgroup = turn, bus, cgroup
        self.deadline_file = deadline_file
        self.log_dir, self.log_limit = log_dir, log_limit  # guardd.output
        self.adopt_within = adopt_within  # seconds a gone supervisor is waited for (guardd.channel)
        # The environment the defaults were read from, and CMD's is made from (default: ours).
        self.env: Mapping[str, str] = os.environ if env is None else env
        self.tty = tty  # stdin is a terminal CMD takes as its controlling one (guardd.child)

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dataclass it replaces

    def __repr__(self) -> str:  # without env: no secret of it in a traceback or a log
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__ if n != "env")
        return f"Options({fields})"
