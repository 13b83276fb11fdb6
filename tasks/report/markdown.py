"""The Prefect markdown artifact showing a stage's plots: each PNG inline as a data: URI (the Prefect UI renders
markdown images, and a data URI needs no file server), with the file it was written to."""

from __future__ import annotations

import base64


def plots_markdown(title: str, plots: dict[str, bytes], paths: dict[str, str]) -> str:
    lines = [f"# {title}", ""]
    for name, png in plots.items():
        data = base64.b64encode(png).decode("ascii")
        lines += [f"## {name.replace('_', ' ')}", "", f"![{name}](data:image/png;base64,{data})", "",
                  f"File: `{paths.get(name, '')}`", ""]
    return "\n".join(lines)
