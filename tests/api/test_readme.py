"""Every Python code block of the documentation — README.md and the pages in docs/ — runs, as a
newcomer would paste it (a fresh interpreter, one process), and prints what the text around it
says."""

from __future__ import annotations

import glob
import os
import re
import sys
import textwrap

import pytest

from conftest import ROOT, child_env, report, run

FILES = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(
    os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))]


def python_blocks(path):
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    found = re.findall(r"^( *)```python\n(.*?)^\1```", text, flags=re.M | re.S)
    return [textwrap.dedent(body) for _, body in found]


BLOCKS = [(path, i, block) for path in FILES for i, block in enumerate(python_blocks(path))]
CLAIMS = {  # a line of a block -> what its output must hold
    "rp.cond((t // 4) * 4 == t": "[False, False, False, True, False, False, False, True]",
    'print(rep.restore(pattern, state))': "30\nTrue\n",
    "print(seen.numpy(), int(opt.optimizer.step.numpy()))": "[64 64] 2",
    "print(resumed_at, restarted.tobytes() == uninterrupted.tobytes())": "10 True\n",
    'print(report["parameters"], report["optimizer_state"])': "262144 524296\n",
}


def test_the_documentation_has_python_blocks():
    assert len(python_blocks("README.md")) >= 1  # the first example, on the front page
    assert len(BLOCKS) >= 15
    for line in CLAIMS:
        assert sum(line in block for _, _, block in BLOCKS) == 1, line


@pytest.mark.parametrize("path,index,block", BLOCKS, ids=[f"{p}:{i}" for p, i, _ in BLOCKS])
def test_documentation_block_runs(path, index, block, tmp_path):
    script = tmp_path / f"block{index}.py"
    script.write_text(block)
    result = run([sys.executable, str(script)], cwd=str(tmp_path), timeout=120, env=child_env(),
                 job=False)
    assert result.returncode == 0, f"{path}, Python block {index}:\n{report(result)}"
    for line, claim in CLAIMS.items():
        if line in block:
            assert claim in result.stdout, f"{path}, Python block {index}:\n{report(result)}"
