"""A Griffe extension (``mkdocs.yml``: the python handler's ``extensions``): the package's
docstrings are written for ``help()`` and doctest, with reStructuredText roles; on the site a
``>>>`` example is a code block and ``:class:`X``` is ``X`` in code."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj|py:\w+):`~?([^`]+)`")


def markdown(text: str) -> str:
    """``text`` with each doctest (a ``>>>`` line, its ``...`` lines and its output, up to a
    blank line) fenced as Python console code, and Sphinx roles as inline code."""
    out, lines, n = [], text.splitlines(), 0
    while n < len(lines):
        line = lines[n]
        if line.lstrip().startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            block = []
            while n < len(lines) and lines[n].strip():
                block.append(lines[n][len(indent):] if lines[n].startswith(indent) else lines[n])
                n += 1
            out += [f"{indent}```pycon", *(indent + b for b in block), f"{indent}```"]
            continue
        out.append(ROLE.sub(r"`\1`", line))
        n += 1
    return "\n".join(out)


class Doctests(griffe.Extension):
    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
