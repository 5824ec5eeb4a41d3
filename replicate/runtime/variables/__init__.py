"""The Variables across processes: checkpoints (``checkpoint``, ``rp.checkpoint``) and the
Variables that live on one logical device (``owners``). Above ``communication`` and ``checks``."""
