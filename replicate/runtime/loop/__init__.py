"""The loop on top: ``Replicator`` (``replicator``), where each process stands (``layout``), a
step's outputs gathered (``outputs``) and what runs around each step (``callbacks``)."""
