"""Where a replayed step's time goes (issue 31): the host's part of a call against the graph's
device time, for the MLP and the small GPT step of ``bench/gpu_steps.py`` replayed as CUDA graphs
(``rp.CompileOptions(cuda_graph=True)``).

    python3 bench/gpu_replay_probe.py [--kinds mlp,gpt-small] [--calls 20]

Per kind, medians over ``--calls`` calls back to back:

* ``call``: a whole call of the step (copies in, graph launch, copies out, the step's own
  bookkeeping), wall time with a synchronisation at the end of the run of calls;
* ``host``: the same calls timed on the host only, without waiting for the GPU (what the Python
  side costs; when it exceeds ``graph``, the GPU waits on the host);
* ``graph``: the captured graph launched alone, device time from CUDA events;
* the number of inputs copied into the graph's buffers and of outputs copied out per call.

Needs CuPy and an NVIDIA GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _step(kind):
    """(the replayed step's callable, its executable's run) for ``kind``."""
    import step_time as S
    import transformer as T

    if kind == "mlp":
        params, x, y = S.mlp_init(S.MLP_SIZES, S.MLP_BATCH)
        f = S.replicate_step("mlp", params, "graph", "cupy", options={"cuda_graph": True})
        args = (x, y)
    else:
        cfg = T.SIZES[kind[4:]]
        params, ids, targets = T.init(cfg)
        f = T.replicate_step(cfg, params, "graph", "cupy", options={"cuda_graph": True})
        args = (ids, targets)
    for _ in range(3):  # run, capture and check, replay
        f(*args)
    return (lambda: f(*args)), f.executable(*args).run


def _median_ms(times):
    return statistics.median(times) * 1e3


def probe(kind, calls):
    import cupy as cp

    call, run = _step(kind)
    state = getattr(run, "state", "not asked")
    stream = cp.cuda.get_current_stream()
    if state != "replay":
        print(f"{kind}: not replayed ({state}); REPLICATE_DEBUG=cuda_graph says why")
        return
    whole, host = [], []
    for _ in range(calls):
        stream.synchronize()
        t0 = time.perf_counter()
        call()
        host.append(time.perf_counter() - t0)
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    stream.synchronize()
    whole = (time.perf_counter() - t0) / calls
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    device = []
    for _ in range(calls):
        start.record(stream)
        run.graph.launch(stream=stream)
        stop.record(stream)
        stop.synchronize()
        device.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
    print(f"{kind}: call {whole * 1e3:.3f} ms (back to back), host {_median_ms(host):.3f} ms "
          f"a call, graph {_median_ms(device):.3f} ms on the device; {len(run.buffers)} inputs "
          f"copied in, {len(run.outs)} outputs copied out per call")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default="mlp,gpt-small")
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args(argv)
    for kind in args.kinds.split(","):
        probe(kind, args.calls)


if __name__ == "__main__":
    main()
