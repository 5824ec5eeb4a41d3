"""Checks: what user code hands in (``entry``), non-finite values (``nan_check``), ranks whose
variables diverged (``sync_check``), ranks that constructed their ``Replicator`` differently
(``config``). Above ``job`` and ``communication``."""
