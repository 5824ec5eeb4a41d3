"""The architecture's promises (issue 12): layers, one road for a step, rows instead of ladders.

* ``replicate/graph`` imports nothing from the backends, the runtime or the front modules;
* ``rp.function`` and ``Replicator`` compile through the same pipeline, the collective rewrite
  included, and the graph is validated after every pass of it;
* a step's outputs cross the processes in one exchange;
* fusion forms only groups the backend runs as one kernel (no op-by-op fallback);
* adding an elementwise primitive is a declaration, a reference row, a VJP row and a wrapper.
"""

from __future__ import annotations

import ast
import os
import pathlib

import numpy as np
import pytest

import replicate as rp
import replicate.numpy as rnp
from replicate.compiler import PIPELINE, CompileOptions
from replicate.graph import passes, primitives, reference
from replicate.graph.core import bind
from replicate.graph.passes import step_passes
from replicate.graph.primitives import REGISTRY, prims_where
from replicate.graph.validate import InvalidGraphError
from replicate.graph.vjp_rules import VJP
from replicate.step import gather_outputs

PACKAGE = pathlib.Path(rp.__file__).parent
FRONT = ("function", "collectives", "state", "context", "control", "nn", "optim", "compiler",
         "step", "launch", "runtime", "backends")


def _imports(path: pathlib.Path):
    """The ``replicate`` modules a file imports (relative imports resolved)."""
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[:len(package) - node.level + 1])
                base += node.module.split(".") if node.module else []
            else:
                base = (node.module or "").split(".")
            if base[0] != "replicate":
                continue
            for alias in node.names:
                yield ".".join(base + ([alias.name] if not node.module else []))
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("replicate"))


def test_the_graph_layer_imports_nothing_above_it():
    bad = []
    for path in sorted((PACKAGE / "graph").rglob("*.py")):
        for target in _imports(path):
            parts = target.split(".")
            if len(parts) < 2 or parts[1] in FRONT or target == "replicate":
                bad.append(f"{path.relative_to(PACKAGE)} imports {target}")
    assert bad == []


def test_the_graph_kernel_does_not_import_the_op_namespace():
    """core, trace, reference, interpret & co. sit below ``replicate.numpy``; only the rules and
    passes (vjp_rules, autodiff, passes/) are written with it."""
    kernel = ["aval", "primitives", "shape_rules", "core", "trace", "rebuild", "printer",
              "validate", "reference", "special", "interpret", "fused", "collectives"]
    bad = [f"{name} imports {t}" for name in kernel
           for t in _imports(PACKAGE / "graph" / f"{name}.py") if t.startswith("replicate.numpy")]
    assert bad == []


def test_backends_import_neither_runtime_nor_front():
    bad = []
    for path in sorted((PACKAGE / "backends").glob("*.py")):
        for target in _imports(path):
            parts = target.split(".")
            if len(parts) < 2 or parts[1] in FRONT and parts[1] != "backends":
                bad.append(f"{path.name} imports {target}")
    assert bad == []


def test_no_module_over_400_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


# -- one road --------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_function_with_a_collective_compiles_through_the_rewrite(mode):
    def step(x):
        return rp.all_reduce(x * 2.0, "mean") + rp.all_gather(x, tiled=True)

    f = rp.function(step, mode=mode)
    np.testing.assert_allclose(f(np.arange(3.0)), np.arange(3.0) * 3)
    if mode == "graph":
        graph = f.graph(np.arange(3.0))
        assert not any(REGISTRY[n.prim].placeholder for n in graph.nodes)
        assert "collective[" not in str(graph)
        assert not any(REGISTRY[n.prim].placeholder for n in f.executable(np.arange(3.0))
                       .graph.nodes)


def test_validation_runs_after_the_collective_rewrite(monkeypatch):
    """A rewrite that broke the graph is caught right after it, not at run time."""
    real = step_passes.replicate_collectives

    def broken(graph, *args, **kwargs):
        out = real(graph, *args, **kwargs)
        out.nodes = out.nodes[1:]  # drop the first node: a later one reads an undefined value
        return out

    monkeypatch.setattr(step_passes, "replicate_collectives", broken)
    monkeypatch.setenv("REPLICATE_VALIDATE", "1")
    f = rp.function(lambda x: rp.all_reduce(rnp.exp(x) + 1.0, "sum"))
    with pytest.raises(InvalidGraphError, match="before it is defined"):
        f(np.ones(3))


def test_the_suite_validates_every_pass():
    """``tests/conftest.py`` turns the validator on for every test and every process a test
    starts (``docs/ARCHITECTURE.md``): a pass that breaks a graph fails the test that
    compiled it, not a later step that runs it, if any does."""
    from conftest import child_env

    assert os.environ.get("REPLICATE_VALIDATE") == "1"
    assert child_env().get("REPLICATE_VALIDATE") == "1"


def test_every_pass_of_the_road_is_printed(monkeypatch, capsys):
    monkeypatch.setenv("REPLICATE_DEBUG", "passes")
    rp.function(lambda x: rp.all_reduce(x * 2.0, "sum").sum())(np.ones(3))
    out = capsys.readouterr().out
    order = [out.index(f"# after pass {name}") for name in
             ("replicate_collectives", "merge_updates", "dce", "const_fold", "fusion", "memory")]
    assert order == sorted(order)


def test_one_road_for_every_step():
    """The step is traced and its passes run in one place, the driver (``compiler.py``): no
    other module of the package calls ``trace_step``, runs ``STEP_PASSES`` or defines a
    ``step_graph``/``compile_step`` of its own (model parallelism copied the driver once)."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel in ("compiler.py", "step.py", "graph/passes/step_passes.py"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            called = isinstance(node, ast.Call) and getattr(
                node.func, "id", getattr(node.func, "attr", "")) in ("trace_step", "run_passes")
            defined = node in tree.body and isinstance(node, ast.FunctionDef) and \
                node.name in ("step_graph", "compile_step")  # (a method may delegate)
            if called or defined or (isinstance(node, ast.Name) and node.id == "STEP_PASSES"
                                     and rel != "graph/passes/__init__.py"):
                bad.append(f"{rel}:{node.lineno}")
    assert bad == []


def test_every_caller_compiles_through_the_driver(monkeypatch):
    """rp.function, a Replicator and a model-parallel device's part all run STEP_PASSES
    through ``compiler.run_passes``."""
    from replicate import compiler
    from replicate.context import ReplicaContext
    from replicate.model_parallel import Where

    seen = []
    real = compiler.run_passes

    def spy(graph, todo, ctx):
        if todo is step_passes.STEP_PASSES:
            seen.append((ctx.replicas, ctx.devices))
        return real(graph, todo, ctx)

    monkeypatch.setattr(compiler, "run_passes", spy)
    rp.function(lambda x: (x * 2.0).sum())(np.ones(3))
    w = rp.Variable(np.ones(3), name="w")

    def step_fn(x):
        w.assign(w + rp.all_reduce(x, "mean"))
        return w.sum()

    rp.Replicator(lambda ctx: iter([np.ones(3)]), step_fn, replicas_per_rank=2).run()
    w2 = rp.Variable(np.ones((3, 3)), name="w2")

    def placed(x):
        with rp.logical_device(1):
            return (x @ w2).sum()

    compiler.step_graph(placed, [np.ones((2, 3))], [ReplicaContext(0, 1)], where=Where(m=2))
    assert seen == [(1, 1), (2, 1), (1, 2)]


def test_function_and_replicator_give_the_same_step():
    """The same step_fn, one replica, through rp.function and through Replicator: the same
    parameters after three steps (they share every stage of the road)."""
    results = []
    for use_replicator in (False, True):
        w = rp.Variable(np.linspace(-1, 1, 6).reshape(3, 2), name="w")
        opt = rp.wrap_optimizer(rp.optim.Adam([w], lr=0.1))

        def step_fn(x, w=w, opt=opt):
            loss = rnp.tanh(x @ w).sum()
            opt.apply(rp.grad(loss, [w]))
            return {"loss": loss}

        x = np.arange(12.0).reshape(4, 3) / 10
        if use_replicator:
            rp.Replicator(lambda ctx: iter([x] * 3), step_fn).run()
        else:
            f = rp.function(step_fn)
            for _ in range(3):
                f(x)
        results.append(w.numpy().copy())
    np.testing.assert_array_equal(results[0], results[1])


# -- the step's outputs: one exchange --------------------------------------------------------------
class TwoRanks:
    """A stand-in for two processes whose peer sends the same bytes as this one."""

    size, rank = 2, 0

    def __init__(self):
        self.calls = 0

    def allgather(self, x):
        self.calls += 1
        return np.stack([x, x])


def test_outputs_cross_the_processes_in_one_exchange():
    comm = TwoRanks()
    big = np.int64(2**53 + 1)  # exact: the bytes travel, not a float64 copy
    results = [[np.float32(0.5), np.arange(3.0), big, np.array([True, False])],
               [np.float32(1.5), np.arange(3.0) + 1, big - 1, np.array([False, False])]]
    everyone = gather_outputs(comm, results)
    assert comm.calls == 1
    assert [e.shape for e in everyone] == [(4,), (4, 3), (4,), (4, 2)]
    assert [e.dtype for e in everyone] == [np.float32, np.float64, np.int64, np.bool_]
    np.testing.assert_array_equal(everyone[0], [0.5, 1.5, 0.5, 1.5])
    assert everyone[2].tolist() == [2**53 + 1, 2**53, 2**53 + 1, 2**53]
    np.testing.assert_array_equal(everyone[1][1], [1.0, 2.0, 3.0])


# -- fusion asks the backend -----------------------------------------------------------------------
def _scalar_consts(node):
    return {i: x.node.attrs["value"] for i, x in enumerate(node.inputs)
            if x.node is not None and x.node.prim == "const" and x.size == 1}


def _generates(node) -> bool:
    from replicate.backends import cuda_codegen

    try:
        cuda_codegen.generate(node, _scalar_consts(node), "k")
    except NotImplementedError:
        return False
    return True


def test_fusion_forms_only_groups_the_cuda_codegen_builds():
    from replicate.backends import cuda_codegen
    from replicate.graph.passes.fusion import find_groups

    def f(x, s):
        return rnp.exp(x).sum() * s + 1.0  # the epilogue reads s, a runtime scalar

    graph = rp.function(f, options={"disable": list(PIPELINE)}).graph(np.ones(8), np.float64(2))
    groups = [[graph.nodes[i] for i in g] for g in find_groups(graph)]
    assert [cuda_codegen.accepts(g) for g in groups] == [False]  # NumPy fuses it all
    numpy_fused = [n for n in passes.fuse(graph).nodes if n.prim == "fused"]
    assert [_generates(n) for n in numpy_fused] == [False]  # CuPy used to run it op by op
    kept = [n for n in passes.fuse(graph, cuda_codegen.accepts).nodes if n.prim == "fused"]
    # the reduction with its prologue is one kernel, the epilogue another
    assert [n.attrs["body"].prims for n in kept] == [["mul", "add"], ["exp", "reduce_sum"]] \
        or [n.attrs["body"].prims for n in kept] == [["exp", "reduce_sum"], ["mul", "add"]]
    assert all(_generates(n) for n in kept)


# -- adding an elementwise primitive ---------------------------------------------------------------
@pytest.fixture
def cube(monkeypatch):
    """A new elementwise primitive, added the way the checklist says: a declaration (with its
    CUDA template), a reference row, a VJP row, and a wrapper (here ``bind``)."""
    monkeypatch.setitem(REGISTRY, "cube", primitives.Primitive(
        "cube", primitives.ELEMENTWISE, primitives._unary_float, cuda="({a} * {a} * {a})"))
    monkeypatch.setitem(reference.ROWS, "cube", lambda xp: lambda x: x * x * x)
    monkeypatch.setitem(reference.IMPL, "cube", reference.ROWS["cube"](np))
    monkeypatch.setitem(VJP, "cube", lambda g, out, needs, x: (g * 3.0 * x * x,))
    return lambda x: bind("cube", rnp.asarray(x))


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_a_new_elementwise_primitive_works_everywhere_from_its_rows(cube, mode):
    f = rp.function(lambda x: (cube(x), rp.grad(cube(x).sum(), x)), mode=mode)
    value, grad = f(np.array([1.0, 2.0]))
    np.testing.assert_allclose(value, [1.0, 8.0])
    np.testing.assert_allclose(grad, [3.0, 12.0])
    if mode == "graph":  # it fuses with its neighbours: the fusion pass reads its flags
        g = rp.function(lambda x: (cube(x) + 1.0).sum()).executable(np.ones(3))
        assert g.kernels == ["fused[cube,add,reduce_sum]"]


def test_a_new_primitive_gets_its_jax_rule_from_the_reference_row(cube):
    jnp = pytest.importorskip("jax.numpy")
    table = reference.table(jnp, "jax")
    assert np.asarray(table["cube"](jnp.asarray([2.0]))).tolist() == [8.0]


def test_a_primitive_without_a_reference_row_is_named(monkeypatch):
    monkeypatch.setitem(REGISTRY, "nothing", primitives.Primitive(
        "nothing", primitives.ELEMENTWISE, primitives._unary_float))
    with pytest.raises(rp.ReplicateError, match="no numpy rule for nothing"):
        bind("nothing", rnp.asarray(1.0))


def test_primitive_flags_follow_from_the_kind():
    assert REGISTRY["exp"].fuse == "map" and REGISTRY["reduce_sum"].fuse == "reduce"
    assert REGISTRY["broadcast_to"].fuse == "map" and REGISTRY["broadcast_to"].view
    for name in ("all_reduce", "all_gather", "broadcast", "reduce_scatter", "permute"):
        p = REGISTRY[name]
        assert p.placeholder and p.effect and p.host and not p.exchange
    for name in ("mpi_allreduce", "mpi_allgather", "mpi_broadcast", "comm_start", "comm_wait"):
        p = REGISTRY[name]
        assert p.exchange and p.effect and p.host and not p.placeholder
    # the in-process combine is a device op (no communication): it stays inside a JAX segment
    assert not REGISTRY["local_reduce"].effect and not REGISTRY["local_reduce"].host
    assert REGISTRY["random_bits"].random and not REGISTRY["random_bits"].foldable
    with pytest.raises(ValueError, match="unknown kind"):
        primitives.Primitive("x", "sideways", lambda a: a)


def test_op_classes_are_flags_derived_in_primitives():
    """What kind of data an op touches is a flag: an alias is a view, a view moves data only;
    a placeholder says what the replicas receive."""
    assert prims_where(alias=True) == {"reshape", "stop_gradient", "custom_vjp", "remat",
                                       "remat_barrier", "branch_input"}
    assert prims_where(alias=True) | prims_where(repeats=True) <= prims_where(view=True)
    assert prims_where(view=True) <= prims_where(moves=True)
    assert prims_where(moves=True) - prims_where(view=True) == {"concatenate", "const", "cast"}
    assert {p.name: p.across for p in REGISTRY.values() if p.placeholder} == {
        "all_reduce": "same", "all_gather": "same", "broadcast": "same",
        "reduce_scatter": "own", "permute": "moved"}
    with pytest.raises(ValueError, match="across must be"):
        primitives.Primitive("x", "collective", lambda a: a, placeholder=True)


# (name, line) of the membership tests on primitive names that are not a class of ops
_NAMED_PAIRS = {("graph/passes/bucketing.py", 'node.prim in ("mpi_allreduce", "send")')}


def test_no_list_of_primitive_names_outside_primitives():
    """A class of ops is a flag in ``primitives.py``, not a set of names kept elsewhere: no
    module-level set/tuple of primitive names, and no ``prim in (names...)`` test (rule tables,
    dicts keyed by name, stay)."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "primitives.py":
            continue
        text = path.read_text()
        tree = ast.parse(text)
        literals = [n.value for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                    and "__all__" not in ast.unparse(n)]  # (exported names, not op classes)
        literals += [n.comparators[0] for n in ast.walk(tree) if isinstance(n, ast.Compare)
                     and isinstance(n.ops[0], (ast.In, ast.NotIn))]
        for lit in literals:
            if isinstance(lit, ast.Call) and getattr(lit.func, "id", "") == "frozenset":
                lit = lit.args[0] if lit.args else lit
            if not isinstance(lit, (ast.Set, ast.Tuple, ast.List)):
                continue
            names = [e.value for e in lit.elts if isinstance(e, ast.Constant)]
            if len(names) >= 2 and len(names) == len(lit.elts) and \
                    all(isinstance(n, str) and n in REGISTRY for n in names):
                line = text.splitlines()[lit.lineno - 1].strip()
                where = str(path.relative_to(PACKAGE))
                if not any(w == where and snippet in line for w, snippet in _NAMED_PAIRS):
                    bad.append(f"{where}:{lit.lineno}: {line}")
    assert bad == []


def test_compile_options_know_every_pass():
    assert list(PIPELINE) == ["const_fold", "cse", "dce", "bucketing", "widen", "fusion", "memory"]
    CompileOptions(disable=set(PIPELINE))


def test_outputs_that_differ_between_local_replicas_are_an_error_before_any_exchange():
    comm = TwoRanks()
    with pytest.raises(rp.ReplicateError, match="output leaf 0 differs between the replicas"):
        gather_outputs(comm, [[np.zeros(8)], [np.zeros(4)]])
    assert comm.calls == 0  # (8 + 4 bytes on one rank could pair with 4 + 8 on another)
