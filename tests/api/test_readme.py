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


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index, tmp_path):
    path = tmp_path / f"block{index}.py"
    path.write_text(BLOCKS[index])
    result = run([sys.executable, str(path)], cwd=str(tmp_path), timeout=120, env=child_env())
    assert result.returncode == 0, report(result)
    if "rp.cond((t // 4) * 4 == t" in BLOCKS[index]:  # the accumulation example's claim
        assert "[False, False, False, True, False, False, False, True]" in result.stdout, \
            report(result)
