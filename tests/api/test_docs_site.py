"""The documentation site (mkdocs.yml, docs/_site/): it builds with warnings as errors and no
network, every internal link of the built pages resolves, a page renders in headless Chromium
(title, navigation, a highlighted code block, the theme's script ran), every public name a user
reaches (found from the package, not from the site's own list) is in the API reference, and
every public name in it has a docstring."""

from __future__ import annotations
import __future__

import fcntl
import functools
import glob
import hashlib
import html
import html.parser
import importlib
import inspect
import os
import re
import shutil
import subprocess
import sys
import types
import urllib.parse
from pathlib import Path

import pytest

from conftest import ROOT

ROOT_PATH = Path(ROOT)

sys.path.insert(0, os.path.join(ROOT, "docs", "_site"))
for _package in ("mkdocs", "material", "mkdocstrings_handlers.python", "markdown_it"):
    pytest.importorskip(_package, reason="the docs extra is not installed "
                        "(pip install -e '.[docs]')")
import hooks  # noqa: E402  (docs/_site/hooks.py)

import replicate as rp  # noqa: E402
import replicate.numpy as rnp  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def site(testrun_uid, tmp_path_factory):
    """The site built once per test run (``mkdocs build --strict``), shared by the xdist workers
    (in the folder above theirs, which pytest removes with its old runs)."""
    key = hashlib.sha1(f"{ROOT}{testrun_uid}".encode()).hexdigest()[:12]
    folder = os.path.join(tmp_path_factory.getbasetemp().parent, f"replicate-site-{key}")
    with open(folder + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(os.path.join(folder, "build.log")):
            env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
            result = subprocess.run(
                [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", folder],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
            with open(os.path.join(folder, "build.log"), "w") as f:
                f.write(f"{result.returncode}\n{result.stdout}{result.stderr}")
    with open(os.path.join(folder, "build.log")) as f:
        code, log = f.read().split("\n", 1)
    assert code == "0", "mkdocs build --strict failed:\n" + log[-4000:]
    return folder


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.ids, self.external = [], set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        target = attrs.get("href") if tag in ("a", "link") else attrs.get("src")
        if target and tag in ("link", "script", "img") and re.match(r"^(https?:)?//", target):
            self.external.append(target)
        if target:
            self.links.append(target)


@functools.lru_cache(maxsize=None)
def _parse(path):
    """A built page's links and ids, parsed once (a page is the target of many anchored links)."""
    parser = _Links()
    with open(path) as f:
        parser.feed(f.read())
    return parser


def test_the_site_builds_with_every_page(site):
    for page in ["index.html", "ARCHITECTURE.html", "bench/RESULTS.html",
                 "reference/replicate.html", "reference/replicate.nn.html",
                 "reference/replicate.numpy.html", "reference/replicate.optim.html"]:
        assert os.path.isfile(os.path.join(site, page)), page
    # every page of docs/ is in the navigation (the strict build refuses one left out) and built
    docs = {os.path.relpath(p, os.path.join(ROOT, "docs")) for p in glob.glob(
        os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)}
    assert len(docs) >= 20 and docs <= {path for _, path in hooks.pages()}
    for _, path in hooks.pages():
        assert os.path.isfile(os.path.join(site, path[:-3] + ".html")), path
    # the home page is the README, its links pointed at the pages
    with open(os.path.join(site, "index.html")) as f:
        home = f.read()
    assert 'href="guides/gpu.html"' in home and "pip install -e '.[test]' &amp;&amp; pytest" in home


# -- the API reference holds every name a user reaches ---------------------------------------------
# Reachable on a public module but its machinery, not its API: what it imports for its own use
# (rp.optim.TraceKeyed is replicate.dependency's base class). A name meant for users goes in the
# module's ``__all__`` (so on its page) instead; a new helper import, here or under a leading "_".
INTERNAL = {
    "replicate.optim": {"TraceKeyed", "current_trace", "gradient_mean", "shard_state"},
    "replicate.numpy.fft": {"check_device", "concrete"},
    "replicate.numpy.linalg": {"bind"},
    "replicate.numpy.random": {"bind", "float_operand"},
    "replicate.profile": {"start_from_environment"},  # (run by ``import replicate``)
    "replicate.runtime.communication.host": {
        "AVal", "agree", "all_gather_object", "current_replica", "current_trace", "digest",
        "on_input_thread", "refuse_exchange", "source_line", "user_frame", "wide_for_sum",
        "world"},
    "replicate.runtime.loop.callbacks": {"BackgroundWriter"},  # (Checkpoint's asynchronous=True)
    "replicate.runtime.variables.checkpoint": {
        "Archive", "agree", "class_name", "error_of_class", "load_whole", "source_line",
        "step_files", "user_frame", "whole_values", "world"},
}


def _public_modules() -> dict:
    """The modules a user reaches, by name: the two the README imports (``replicate`` as rp,
    ``replicate.numpy`` as rnp), every module a package among them names in its ``__all__``
    (rp.optim, rp.callbacks, rp.nn.init, rnp.fft, ...), and every module with a page."""
    found, todo = {}, [rp, rnp, *(importlib.import_module(m) for _, m, _ in hooks.REFERENCE)]
    while todo:
        mod = todo.pop()
        if mod.__name__ not in found:
            found[mod.__name__] = mod
            if hasattr(mod, "__path__"):  # (a package's submodules; not a module's imports)
                named = [getattr(mod, n, None) for n in getattr(mod, "__all__", ())]
                todo += [v for v in named if isinstance(v, types.ModuleType)]
    return found


def _reachable(mod):
    """(name, object) for every public name on ``mod`` — not its ``__all__`` alone: a class or
    function of the library (defined here or imported), or anything ``__all__`` names; not a
    module (those have pages)."""
    declared = set(getattr(mod, "__all__", ()))
    for name in sorted(dir(mod)):
        obj = getattr(mod, name)
        if name.startswith("_") or isinstance(obj, (types.ModuleType, __future__._Feature)):
            continue
        ours = str(getattr(obj, "__module__", "")).startswith("replicate")
        if name in declared or callable(obj) and ours:
            yield name, obj


def _resolve(anchor: str):
    """The object an anchor of the reference names (``replicate.optim.SGD``), or None."""
    parts = anchor.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part, None)
        return obj
    return None


def test_every_name_a_user_reaches_is_in_the_api_reference(site):
    """For every public module (derived from the package, not from the list the site is built
    from) and every public name on it: the built page has its anchor, or the same class or
    function is documented on another page (``rp.optim.Variable`` is ``rp.Variable``); NumPy's
    own types and ``None`` (``rnp.float32``, ``rnp.newaxis``) are named on the page."""
    pages = {module: title for title, module, _ in hooks.REFERENCE}
    ids = {module: _parse(os.path.join(site, "reference", f"{title}.html")).ids
           for module, title in pages.items()}
    documented = {id(obj) for anchors in ids.values() for a in anchors if a.startswith(
        "replicate.") and (inspect.isclass(obj := _resolve(a)) or callable(obj))}
    modules = _public_modules()
    assert {"replicate", "replicate.nn", "replicate.optim", "replicate.distributions",
            "replicate.runtime.loop.callbacks", "replicate.runtime.inputs.data",
            "replicate.runtime.variables.checkpoint", "replicate.numpy", "replicate.numpy.fft",
            "replicate.numpy.linalg", "replicate.numpy.random"} <= set(modules)
    missing, stale = [], []
    for name, mod in sorted(modules.items()):
        if name not in pages:
            missing.append(f"{name} (no reference page: hooks.REFERENCE)")
            continue
        with open(os.path.join(site, "reference", f"{pages[name]}.html")) as f:
            text = f.read()
        internal = INTERNAL.get(name, set())
        stale += [f"{name}.{n}" for n in internal if not hasattr(mod, n)]
        for attr, obj in _reachable(mod):
            if f"{name}.{attr}" in ids[name]:
                stale += [f"{name}.{attr}"] if attr in internal else []
            elif attr in internal or callable(obj) and id(obj) in documented:
                continue
            elif (obj is None or inspect.isclass(obj) and not str(obj.__module__).startswith(
                    "replicate")) and f"<code>{attr}</code>" in text:
                continue  # NumPy's own types, None
            else:
                missing.append(f"{name}.{attr}")
    assert missing == [], "public names missing from the API reference (a module's __all__ " \
        "lists its names; hooks.REFERENCE its page): " + ", ".join(missing)
    assert stale == [], "INTERNAL names that are gone or documented: " + ", ".join(stale)


def test_every_internal_link_of_the_site_resolves(site):
    broken, external, pages = [], [], 0
    for folder, _, files in os.walk(site):
        for name in files:
            if not name.endswith(".html") or name == "404.html":  # 404 links from the site root
                continue
            pages += 1
            path = os.path.join(folder, name)
            found = _parse(path)
            external += [f"{name}: {t}" for t in found.external]
            for target in found.links:
                if re.match(r"^([a-zA-Z][a-zA-Z0-9+.-]*:|//)", target):
                    continue
                url = urllib.parse.urlsplit(target)
                file = os.path.normpath(os.path.join(folder, urllib.parse.unquote(url.path))) \
                    if url.path else path
                if not os.path.exists(file):
                    broken.append(f"{os.path.relpath(path, site)}: {target}")
                elif url.fragment and file.endswith(".html") and \
                        urllib.parse.unquote(url.fragment) not in _parse(file).ids:
                    broken.append(f"{os.path.relpath(path, site)}: {target} (no such anchor)")
    assert pages >= 20
    assert broken == [], "\n".join(broken[:40])
    assert external == [], "the pages load from the network:\n" + "\n".join(external[:20])


def _chromium(url, *args, tmp_path):
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,900",
           "--virtual-time-budget=5000", *args, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get "
                    "install chromium; .ci/run installs it where apt-get works)")
def test_a_page_renders_in_headless_chromium(site, tmp_path):
    # the first page with a Python example
    title, path = next((t, p) for t, p in hooks.pages()[1:] if "```python" in
                       (ROOT_PATH / hooks.Site().repo_file(p)).read_text())
    page = os.path.join(site, path[:-3] + ".html")
    result = _chromium("file://" + page, "--dump-dom", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    shown = re.search(r"<title>(.*?)</title>", dom, re.S)
    assert shown and html.unescape(shown.group(1)) == f"{title} - replicate", shown
    nav = re.search(r'<nav class="md-nav md-nav--primary".*?md-sidebar--secondary', dom, re.S)
    assert nav, "no navigation"
    for entry in ("Getting started", "Concepts", "Guides", "API reference", "replicate.optim"):
        assert entry in nav.group(0), entry
    assert re.search(r'<div class="highlight">.*?<pre.*?<code', dom, re.S), "no code block"
    assert 'data-clipboard-target="#__code_' in dom, \
        "the theme's script did not run (no copy button on the code blocks)"
    shot = tmp_path / "page.png"
    result = _chromium("file://" + page, f"--screenshot={shot}", tmp_path=tmp_path)
    assert result.returncode == 0 and shot.stat().st_size > 10_000, result.stderr[-2000:]


def test_every_public_name_has_a_docstring():
    missing = []
    for _, module, _ in hooks.REFERENCE:
        mod = __import__(module, fromlist=["_"])
        for name in hooks.public_names(module):
            obj = getattr(mod, name)
            if not (inspect.isclass(obj) or callable(obj)):
                continue  # constants (pi, newaxis, NO_VALUE) are described where they are used
            doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else inspect.getdoc(obj)
            if not doc:  # (a class's own docstring, not an inherited one)
                missing.append(f"{module}.{name}")
    assert missing == [], "public names without a docstring: " + ", ".join(missing)
