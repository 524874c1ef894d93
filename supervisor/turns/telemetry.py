"""A turn's OpenTelemetry resource attributes: the `OTEL_RESOURCE_ATTRIBUTES` its environment gets.

A harness that exports OpenTelemetry (Claude Code, Codex, Gemini) reads `OTEL_RESOURCE_ATTRIBUTES`
into the resource of everything it exports, so each turn's environment carries `ccsup.turn.id`,
`ccsup.key`, `ccsup.session` and `ccsup.agent` (the last two only when the turn has them): its
telemetry then says which turn, key and session spent it. They come after the caller's own
attributes and never replace a key the caller set (a caller who sets `ccsup.session` itself
means it).

The format is the OpenTelemetry specification's: `key1=value1,key2=value2`, each value
percent-encoded outside W3C Baggage's `baggage-octet` range (and `%` itself, so a decoder gives
the value back exactly). Pure: knows the variable's grammar, nothing of turns or processes.
"""

from __future__ import annotations

VARIABLE = "OTEL_RESOURCE_ATTRIBUTES"

# baggage-octet = %x21 / %x23-2B / %x2D-3A / %x3C-5B / %x5D-7E, less "%" (the escape itself)
_PLAIN = frozenset(c for c in map(chr, range(0x21, 0x7F)) if c not in {'"', ",", ";", "\\", "%"})


def encode(value: str) -> str:
    """`value` percent-encoded (UTF-8) where it falls outside the plain octets."""
    return "".join(
        c if c in _PLAIN else "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass"))
        for c in value
    )


def keys_of(attributes: str) -> set[str]:
    """The keys an `OTEL_RESOURCE_ATTRIBUTES` value sets (entries without `=` are not keys)."""
    return {
        entry.split("=", 1)[0].strip()
        for entry in attributes.split(",")
        if "=" in entry and entry.split("=", 1)[0].strip()
    }


def merged(own: str | None, ours: dict[str, str | None]) -> str:
    """The caller's `own` attributes, then each of `ours` that has a value and a key `own` does
    not set."""
    taken = keys_of(own or "")
    added = [
        f"{key}={encode(value)}"
        for key, value in ours.items()
        if value is not None and key not in taken
    ]
    kept = (own or "").rstrip(", ")
    return ",".join(([kept] if kept else []) + added)


def turn_attributes(
    turn_id: str, key: str, session: str | None, agent: str | None
) -> dict[str, str | None]:
    return {
        "ccsup.turn.id": turn_id,
        "ccsup.key": key,
        "ccsup.session": session,
        "ccsup.agent": agent,
    }
