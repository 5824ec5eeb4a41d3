"""The command-line entries: ``--help`` on stdout with exit code 0 for every one; the launcher
and the bootstrap run from any folder, and say so when a folder named ``replicate`` (a clone's
own folder, seen from its parent) hides the package."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

from conftest import ROOT, child_env, have_mpi, report, run

EXAMPLES = sorted(p.name for p in (pathlib.Path(ROOT) / "examples").glob("*.py"))
ENTRIES = [["-m", "replicate"], ["-m", "replicate.launch"], ["-m", "replicate.profile"]]


@pytest.mark.parametrize("entry", ENTRIES + [[f"examples/{e}"] for e in EXAMPLES],
                         ids=lambda e: e[-1])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_goes_to_stdout_with_exit_code_0(entry, flag):
    result = run([sys.executable, *entry, flag], cwd=ROOT, env=child_env(), job=False)
    assert result.returncode == 0, report(result)
    assert "usage" in result.stdout.lower() and result.stdout.strip(), report(result)
    assert result.stderr.strip() == "", report(result)


def test_the_console_script_main_prints_help_and_returns_0(capsys):
    from replicate.launch import main  # (replicate-launch = "replicate.launch:main")

    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "python -m replicate.launch -n 2" in capsys.readouterr().out


# An editable install (pip install -e) finds the package through a finder placed after
# Python's own path search, so a folder named ``replicate`` in the current folder wins; this
# runs an entry the same way: the checkout only through such a finder.
EDITABLE = """import importlib.machinery as m, runpy, sys
class Finder:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "replicate":
            return m.PathFinder.find_spec(name, [{root!r}])
        if name.rpartition(".")[0] == "replicate":
            return m.PathFinder.find_spec(name, [{package!r}])
sys.meta_path.insert(sys.meta_path.index(m.PathFinder) + 1, Finder)  # (before the venv's)
sys.argv = [{module!r}, *{args!r}]
runpy.run_module({module!r}, run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("module", ["replicate.launch", "replicate"])
def test_a_folder_named_replicate_in_the_current_folder_is_named_with_the_fix(tmp_path, module):
    (tmp_path / "replicate").mkdir()  # a clone: README, pyproject.toml, replicate/ ...
    (tmp_path / "replicate" / "README.md").write_text("# replicate\n")
    (tmp_path / "train.py").write_text("import replicate as rp\nprint(rp.nn.Linear)\n")
    env = child_env()
    env["PYTHONPATH"] = os.path.join(ROOT, "tests")  # (not the checkout: only the finder)
    code = EDITABLE.format(root=ROOT, package=os.path.join(ROOT, "replicate"), module=module,
                           args=["-n", "1", "train.py"] if module.endswith("launch")
                           else ["train.py"])
    result = run([sys.executable, "-c", code], cwd=str(tmp_path), env=env, job=False)
    assert result.returncode == 2, report(result)
    assert str(tmp_path / "replicate") in result.stderr, report(result)
    assert "run from another folder" in result.stderr and "rename" in result.stderr
    assert "has no attribute 'nn'" not in result.stderr


@pytest.mark.mpi
def test_the_launcher_runs_a_script_from_another_folder(tmp_path):
    if not have_mpi():
        pytest.skip("needs mpi4py and mpiexec (mpich wheel)")
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "train.py").write_text(
        "import sys\nimport replicate as rp\n"  # (one write a line: the ranks share the pipe)
        "sys.stdout.write(f'rank {rp.process_index()} {rp.nn.Linear.__name__}\\n')\n")
    (tmp_path / "elsewhere").mkdir()
    result = run([sys.executable, "-m", "replicate.launch", "-n", "2", "../job/train.py"],
                 cwd=str(tmp_path / "elsewhere"), env=child_env())
    assert result.returncode == 0, report(result)
    assert "rank 0 Linear" in result.stdout and "rank 1 Linear" in result.stdout, report(result)
