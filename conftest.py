"""Collection settings for the doctests in ``replicate/``: backends whose packages or hardware are
missing here are not imported (their tests skip with the reason)."""

collect_ignore = []
for _module, _path in [("replicate.backends.cupy_backend", "replicate/backends/cupy_backend.py"),
                       ("replicate.backends.cupy_device", "replicate/backends/cupy_device.py"),
                       ("replicate.backends.jax_backend", "replicate/backends/jax_backend.py")]:
    try:
        __import__(_module)
    except Exception:  # ImportError, or no GPU (ReplicateError)
        collect_ignore.append(_path)
