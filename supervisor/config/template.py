"""The commented default configuration that `ccsup config init` writes, from the sections' schema.

Imported only by `config init` and its tests (it needs tomli-w).
"""

from __future__ import annotations

from .schema import Section, dotted


def _toml_value(value: object) -> str:
    if isinstance(value, dict):
        items = (f"{dotted((k,))} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + ", ".join(items) + " }"
    if isinstance(value, list):  # one line, so that commenting it out is one "# "
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    import tomli_w

    return tomli_w.dumps({"x": value}).split(" = ", 1)[1].strip()


def render(sections: tuple[Section, ...]) -> str:
    """Every key explained; optional keys shown commented out with an example value."""
    out: list[str] = []
    for section in sections:
        if out:
            out.append("")
        # A doc ending in a blank line is the file's header, set apart from its first key.
        out.extend(f"# {line}".rstrip() if line else "" for line in section.doc.split("\n"))
        if section.path:
            name = ".".join(section.example_name if p == "*" else p for p in section.path)
            out.append(f"{'# ' if section.example else ''}[{name}]")
        for key in section.keys:
            out.extend(f"# {line}".rstrip() for line in key.doc.splitlines())
            out.append(f"{'# ' if key.example else ''}{key.name} = {_toml_value(key.value)}")
    return "\n".join(out) + "\n"
