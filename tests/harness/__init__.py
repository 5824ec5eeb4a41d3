"""What several test modules share, imported as a package (``tests/`` is on ``sys.path``:
``tests/conftest.py`` puts it there, and on a child process's ``PYTHONPATH``): ``harness.ops``,
the op harness (every public op as cases with NumPy references: ``cases`` is its machinery,
``ops_*`` its tables); ``harness.steps``, whole training steps; ``harness.parity``, the parity
suites' comparisons and their replicated training run."""
