"""Worker pieces the multi-process benchmarks share (``weak_scaling.py``, ``multihost.py``,
``conv_gan.py``, ``memory.py``): the MLP training step of ``step_time.py`` as a ``Replicator``,
gloo's process group for PyTorch's DDP rows, the DDP twin of that MLP step, and the timed rounds
(the slowest rank's time per step)."""

from __future__ import annotations

import socket
import time

from step_time import LR, mlp_sizes, torch_model


def replicate_mlp(params, x, y, **replicator_kwargs):
    """(run(steps), variables): the MLP with ``params`` loaded, SGD, the same batch every step, one
    replica per process (``replicator_kwargs``: mode, backend, options)."""
    import replicate as rp

    sizes = mlp_sizes(params)
    layers = [rp.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:])]
    model = rp.nn.Sequential(layers[0], rp.nn.relu, layers[1], rp.nn.relu, layers[2])
    variables = [v for lin in layers for v in (lin.weight, lin.bias)]
    for v, p in zip(variables, params):
        v.load(p.copy())
    opt = rp.wrap_optimizer(rp.optim.SGD(model.parameters(), lr=LR))

    def input_fn(ctx):
        while True:
            yield x, y

    def step_fn(batch):
        xb, yb = batch
        loss = rp.nn.softmax_cross_entropy(model(xb), yb).mean()
        opt.apply(rp.grad(loss, model.parameters()))
        return {"loss": loss}

    rep = rp.Replicator(input_fn, step_fn, replicas_per_rank=1, **replicator_kwargs)
    return (lambda steps: rep.run(steps=steps)), variables


def init_gloo(comm, address: str = "127.0.0.1") -> None:
    """PyTorch's gloo process group over the ranks of ``comm`` (an mpi4py communicator), once per
    process: rank 0 picks a free port on ``address`` and tells the others."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    port = None
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind((address, 0))
            port = s.getsockname()[1]
    address, port = comm.bcast((address, port), root=0)
    dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}",
                            rank=comm.Get_rank(), world_size=comm.Get_size())


def ddp_mlp(comm, params, x, y, address: str = "127.0.0.1"):
    """run(steps) -> the last loss: the same MLP step under ``DistributedDataParallel`` (gloo,
    1 thread)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    init_gloo(comm, address)
    model = DistributedDataParallel(torch_model("mlp", params))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = torch.nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def run(steps):
        loss = None
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xt), yt)
            loss.backward()
            opt.step()
        return None if loss is None else float(loss.detach())
    return run


def timed_rounds(comm, run, steps: int, rounds: int) -> list[float]:
    """Seconds per step of each of ``rounds`` rounds of ``run(steps)``, the slowest rank's (a
    barrier before and after each round), the same on every rank."""
    from mpi4py import MPI

    times = []
    for _ in range(rounds):
        comm.Barrier()
        t0 = time.perf_counter()
        run(steps)
        comm.Barrier()
        times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX) / steps)
    return times
