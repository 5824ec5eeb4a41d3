"""What a reader sees in the repository's Markdown (README.md, docs/**/*.md and bench/*.md: the
documentation site's sources), read off a real CommonMark renderer (markdown-it-py, with GitHub's
tables): every code fence closes, no heading or code block is swallowed by another code block,
every line written as a ``#`` heading renders as one, and every relative link and ``#anchor``
resolves. (A stray fence once turned the second
half of the README into one code block: 12 headings vanished while every Python block still ran.)
"""

from __future__ import annotations

import glob
import os
import re

import pytest

from conftest import ROOT

markdown_it = pytest.importorskip("markdown_it", reason="markdown-it-py (the test extra) is not "
                                  "installed")

DOCS = glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True) + \
    glob.glob(os.path.join(ROOT, "bench", "*.md"))
FILES = sorted(["README.md", *(os.path.relpath(p, ROOT) for p in DOCS)])
RENDERER = markdown_it.MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
FENCE_WITH_LANGUAGE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*[\w+-]")
SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*:|//)")
HTML_LINK = re.compile(r"""<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.I)


def _walk(tokens):
    for token in tokens:
        yield token
        if token.children:
            yield from _walk(token.children)


def slug(text: str) -> str:
    """GitHub's anchor for a heading's text: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(tokens) -> set[str]:
    """The anchors GitHub gives the headings (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for i, token in enumerate(tokens):
        if token.type != "heading_open":
            continue
        text = "".join(c.content for c in _walk(tokens[i + 1].children or [])
                       if c.type in ("text", "code_inline"))
        base = slug(text)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _fence_problems(token, lines: list[str]) -> list[str]:
    start, end = token.map
    out = []
    char, width = token.markup[0], len(token.markup)
    last = lines[end - 1] if end - 1 > start else ""
    if not re.match(rf"^ {{0,3}}{re.escape(char)}{{{width},}}\s*$", last):
        out.append(f"{start + 1}: this code block never closes: the rest of the file is code")
    if token.info.strip().lower() in ("md", "markdown"):
        return out
    for n in range(start + 1, end - 1):
        line = lines[n]
        if FENCE_WITH_LANGUAGE.match(line):
            out.append(f"{n + 1}: a code block opens inside the block opened at line {start + 1} "
                       "(that block never closed)")
        elif re.match(r"^#{2,6} \S", line) or (not token.info.strip()
                                                and re.match(r"^# \S", line)):
            out.append(f"{n + 1}: heading {line.strip()!r} is inside the code block opened at "
                       f"line {start + 1}")
    return out


def _link_problems(path: str, tokens) -> list[str]:
    here = os.path.dirname(os.path.join(ROOT, path))
    targets = [(t.attrs.get("href") or t.attrs.get("src"), t.map) for t in _walk(tokens)
               if t.type in ("link_open", "image")]
    targets += [(m.group(1), None) for t in _walk(tokens) if t.type.startswith("html")
                for m in HTML_LINK.finditer(t.content)]
    out = []
    for target, _ in targets:
        if not target or SCHEME.match(target):
            continue
        file_part, _, fragment = target.partition("#")
        file = os.path.normpath(os.path.join(here, file_part)) if file_part else \
            os.path.join(ROOT, path)
        if not os.path.exists(file):
            out.append(f"link {target!r}: {os.path.relpath(file, ROOT)} does not exist")
        elif fragment and file.endswith(".md"):
            if file_part:
                with open(file) as f:
                    found = anchors(RENDERER.parse(f.read()))
            else:
                found = anchors(tokens)
            if fragment not in found:
                out.append(f"link {target!r}: no heading with the anchor #{fragment}")
    return out


def problems(path: str, text: str) -> list[str]:
    """Everything in ``text`` (the file at ``path``, relative to the repository) that renders
    otherwise than written, one line each."""
    tokens = RENDERER.parse(text)
    lines = text.splitlines()
    out = []
    code = set()
    for token in tokens:
        if token.type == "fence":
            out += _fence_problems(token, lines)
        if token.type in ("fence", "code_block", "html_block"):
            code.update(range(*token.map))
    # every line written as an ATX heading outside a code block renders as a heading, and back;
    # so does a '#word' line that starts a paragraph (a '#10' inside a paragraph is text)
    written = {n for n, line in enumerate(lines) if n not in code and (
        re.match(r"^ {0,3}#{1,6}(\s|$)", line)
        or re.match(r"^ {0,3}#", line) and (n == 0 or not lines[n - 1].strip()))}
    rendered = {t.map[0] for t in tokens if t.type == "heading_open" and t.markup.startswith("#")}
    out += [f"{n + 1}: {lines[n].strip()!r} does not render as a heading (a space after the #?)"
            for n in sorted(written - rendered)]
    out += [f"{n + 1}: renders as a heading but was not written as one"
            for n in sorted(rendered - written)]
    return out + _link_problems(path, tokens)


def test_the_files_are_found():
    assert "README.md" in FILES and "docs/ARCHITECTURE.md" in FILES


@pytest.mark.parametrize("path", FILES)
def test_markdown_renders_as_written(path):
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    found = problems(path, text)
    assert found == [], f"{path}:\n" + "\n".join(found)


# -- the check itself sees each break ----------------------------------------------------------
def _readme() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        return f.read()


def test_a_stray_fence_is_seen():
    """An extra ``` line before a heading turns everything up to the next bare fence into code."""
    text = _readme()
    lines = text.splitlines()
    at = next(n for n, line in enumerate(lines) if line.startswith("## ") and n > 40)
    broken = "\n".join(lines[:at] + ["```"] + lines[at:]) + "\n"
    found = problems("README.md", broken)
    assert any("inside the code block" in p or "inside the block" in p for p in found), found


def test_a_lost_closing_fence_is_seen():
    text = "# Title\n\n```python\nx = 1\n\n## Next\n\ntext\n"
    found = problems("README.md", text)
    assert any("never closes" in p for p in found), found
    assert any("'## Next' is inside the code block" in p for p in found), found
    text = "# T\n\n```python\nx = 1\n\nprose\n\n```bash\nls\n```\n"
    assert any("opens inside the block opened at line 3" in p
               for p in problems("README.md", text))


def test_a_heading_without_its_space_is_seen():
    found = problems("README.md", "# T\n\n#Usage\n\ntext\n")
    assert found == ["3: '#Usage' does not render as a heading (a space after the #?)"]


def test_broken_links_and_anchors_are_seen():
    text = ("# Title\n\n## Set up: the `rp.x` way\n\n[a](#set-up-the-rpx-way) [b](#nowhere) "
            "[c](docs/NOPE.md) [d](docs/ARCHITECTURE.md#nope) [e](https://example.org/x)\n")
    found = problems("README.md", text)
    assert found == ["link '#nowhere': no heading with the anchor #nowhere",
                     "link 'docs/NOPE.md': docs/NOPE.md does not exist",
                     "link 'docs/ARCHITECTURE.md#nope': no heading with the anchor #nope"], found
