"""Every Python code block in the README runs, as a newcomer would paste it (a fresh interpreter,
one process), and prints what the text around it says."""

from __future__ import annotations

import os
import re
import sys
import textwrap

import pytest

from conftest import ROOT, child_env, report, run

README = os.path.join(ROOT, "README.md")


def python_blocks():
    with open(README) as f:
        text = f.read()
    found = re.findall(r"^( *)```python\n(.*?)^\1```", text, flags=re.M | re.S)
    return [textwrap.dedent(body) for _, body in found]


BLOCKS = python_blocks()


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 4


def fenced_lines(text: str) -> tuple[list[bool], bool]:
    """For each line, whether CommonMark renders it inside a fenced code block (a fence opens
    with three or more backticks, indented at most 3 spaces, and closes with at least as many
    and nothing else); and whether a fence is still open at the end."""
    inside, fence, out = False, "", []
    for line in text.splitlines():
        m = re.match(r"^ {0,3}(`{3,})(.*)$", line)
        if not inside and m:
            inside, fence = True, m.group(1)
            out.append(True)
        elif inside and m and m.group(1).startswith(fence) and not m.group(2).strip():
            inside = False
            out.append(True)
        else:
            out.append(inside)
    return out, inside


def test_every_section_heading_renders():
    """What a reader sees, not a proxy: no ``## `` section heading falls inside a code block, and
    every fence closes. (An opening fence lost in an edit turned the second half of the README
    into one code block: 12 headings and the actor-learner example vanished from the page while
    every Python block still ran.)"""
    with open(README) as f:
        text = f.read()
    lines = text.splitlines()
    fenced, open_at_end = fenced_lines(text)
    hidden = [f"{n + 1}: {line}" for n, (line, inside) in enumerate(zip(lines, fenced))
              if inside and re.match(r"^#{2,3} \S", line)]
    assert hidden == [], "section headings inside a code block:\n" + "\n".join(hidden)
    assert not open_at_end, "a code fence is still open at the end of the README"
    assert sum(1 for line in lines if re.match(r"^## \S", line)) >= 10


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index, tmp_path):
    path = tmp_path / f"block{index}.py"
    path.write_text(BLOCKS[index])
    result = run([sys.executable, str(path)], cwd=str(tmp_path), timeout=120, env=child_env())
    assert result.returncode == 0, report(result)
    if "rp.cond((t // 4) * 4 == t" in BLOCKS[index]:  # the accumulation example's claim
        assert "[False, False, False, True, False, False, False, True]" in result.stdout, \
            report(result)
