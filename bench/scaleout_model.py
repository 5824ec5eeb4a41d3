"""Scale-out model: predicted weak-scaling efficiency of data-parallel ResNet-50 training from 2 to
1024 replicas, from an alpha-beta cost model of the bucketed ring all-reduce plus compute.

    python bench/scaleout_model.py        # reads bench/results/*.json when present
                                          # writes bench/scaleout.png

Model (all assumptions are printed with the result):

* gradients: the 161 ResNet-50 tensors (25.56 M float32, 102 MB), packed in backward order
  (last layer first) into buckets of ``bucket_bytes`` (25 MiB, replicate's default);
* a ring all-reduce of n bytes over p replicas costs ``2 (p-1) alpha + 2 (p-1)/p n beta``
  (alpha: per-message latency, beta: seconds per byte of one link); with 8 GPUs per node the
  hierarchical form: reduce-scatter and all-gather inside the node over NVLink, the ring over
  the nodes' network on the node's share;
* compute: forward = 1/3, backward = 2/3 of the step; the backward time is spread evenly over
  ResNet-50's 54 weight layers (its four stages have about equal FLOPs), so the big late layers'
  gradients are ready first; a bucket may start once its last gradient exists; buckets use the
  link one after another;
* with overlap the step ends when both the backward pass and the last bucket are done; without
  it the all-reduces follow the backward pass; efficiency = single-replica step / p-replica step
  (weak scaling: each replica keeps its batch).

Calibration with what was measured here (``bench/results``): the local alpha and beta from the
``Allreduce`` size sweep (``allreduce.py``) and replicate's measured overhead over a raw MPI
``Allreduce`` of the same bytes (a "software factor" on the bandwidth term); this CPU's
measured GFLOP/s (``step_time.py``, hand-written NumPy MLP) for a CPU-cluster scenario; and the
model is checked against the measured 2-process efficiency of ``weak_scaling.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
from allreduce import resnet50_shapes  # noqa: E402

MB = 2**20
REPLICAS = [2**k for k in range(1, 11)]  # 2 .. 1024

# Published interconnect figures (per direction, per link); latencies are the usual one-way
# small-message figures of each fabric.
NETWORKS = {
    "InfiniBand EDR (12.5 GB/s, 1 µs)": dict(bw=12.5e9, alpha=1e-6),
    "10 GbE (1.25 GB/s, 25 µs)": dict(bw=1.25e9, alpha=25e-6),
    "NVLink (V100: 150 GB/s per direction, 2 µs)": dict(bw=150e9, alpha=2e-6),
}
# Published points (weak scaling efficiency of ResNet-class training at 128 GPUs)
PUBLISHED = [
    ("ChainerMN, 128 GPUs (90 %)", 128, 0.90),
    ("Horovod, 128 GPUs (88 %)", 128, 0.88),
    ("ChainerMN per seed 000: 109x at 128 GPUs (85 %)", 128, 109 / 128),
]
# A P100-class GPU on ResNet-50, batch 32 per GPU, float32: about 220 images/s
GPU_IMAGES_PER_S = 220.0
BATCH = 32
RESNET50_GFLOP_PER_IMAGE = 3 * 2 * 4.1  # forward 4.1 G multiply-adds; backward about twice that


def gradient_layers():
    """Per weight layer (in forward order) its gradient bytes; BN and bias tensors join the
    layer they belong to. 54 layers: conv1, 52 bottleneck/projection convs, the classifier."""
    layers = []
    for shape in resnet50_shapes():
        nbytes = 4 * math.prod(shape)
        if len(shape) > 1:
            layers.append(nbytes)
        else:
            layers[-1] += nbytes
    return layers


def ring(n, p, alpha, beta):
    if p <= 1 or n <= 0:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta


def hierarchical(n, p, gpus_per_node, intra, inter):
    """Reduce-scatter + all-gather inside a node (NVLink), ring across nodes on the node's
    share (each GPU drives 1/g of the data; the g GPUs share the node's network link)."""
    g = min(gpus_per_node, p)
    nodes = p // g
    t = 0.0
    if g > 1:  # reduce-scatter and all-gather are each half a ring all-reduce
        t += ring(n, g, intra["alpha"], 1 / intra["bw"])
    if nodes > 1:
        t += 2 * (nodes - 1) * inter["alpha"] + 2 * (nodes - 1) / nodes * n / inter["bw"]
    return t


def step_time(p, compute, layers, bucket_bytes, allreduce, overlap=True):
    """Time of one step of p replicas: compute + the bucketed all-reduce, overlapped or not."""
    if p == 1:
        return compute
    fwd, bwd = compute / 3, compute * 2 / 3
    per_layer = bwd / len(layers)
    buckets, size, ready = [], 0, 0.0
    for i, nbytes in enumerate(reversed(layers)):  # backward order
        size += nbytes
        ready = fwd + (i + 1) * per_layer
        if size >= bucket_bytes:
            buckets.append((size, ready))
            size = 0
    if size:
        buckets.append((size, ready))
    if not overlap:
        return compute + sum(allreduce(n, p) for n, _ in buckets)
    end = 0.0
    for n, r in buckets:
        end = max(end, r) + allreduce(n, p)
    return max(compute, end)


def efficiency(p, compute, layers, bucket_bytes, allreduce, overlap=True):
    return compute / step_time(p, compute, layers, bucket_bytes, allreduce, overlap)


# -- calibration from bench/results ---------------------------------------------------------------
def load(name):
    path = os.path.join(C.RESULTS_DIR, f"{name}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def calibration():
    """What this machine measured (None where a script has not been run)."""
    cal = {"sources": []}
    ar = load("allreduce")
    if ar and "peers" in ar:
        a, b = ar["peers"]["fit_a"], ar["peers"]["fit_b"]
        cal["local_alpha"], cal["local_beta"] = a / 2, b  # 2 ranks: 2 alpha + n beta
        cal["sources"].append("bench/results/allreduce.json")
        rows = {r["name"]: r for r in ar.get("replicate", {}).get("rows", [])}
        rep = rows.get("replicate all_reduce (compiled step, default options)")
        ref = rows.get("mpi4py Allreduce, one flat buffer (reference)")
        if rep and ref and rep["timing"] and ref["timing"]:
            cal["software_factor"] = rep["timing"]["median"] / ref["timing"]["median"]
    st = load("step_time")
    if st:
        res = st["results"].get("1") or next(iter(st["results"].values()))
        rows = {r["name"]: r for r in res["models"]["mlp"]}
        hand = rows.get("hand-written NumPy")
        if hand and hand["timing"]:
            flop = 6 * 256 * (784 * 1024 + 1024 * 1024 + 1024 * 10)
            cal["cpu_gflops"] = flop / hand["timing"]["median"] / 1e9
            cal["sources"].append("bench/results/step_time.json")
    ws = load("weak_scaling")
    if ws:
        r1 = {r["name"]: r for r in ws["results"]["1"]["rows"]}
        r2 = {r["name"]: r for r in ws["results"]["2"]["rows"]}
        name = "replicate graph numpy"
        if r1.get(name, {}).get("timing") and r2.get(name, {}).get("timing"):
            cal["ws_compute"] = r1[name]["timing"]["median"]
            cal["ws_measured"] = r1[name]["timing"]["median"] / r2[name]["timing"]["median"]
            cal["sources"].append("bench/results/weak_scaling.json")
    return cal


DEFAULTS = dict(local_alpha=3e-6, local_beta=1 / 3.8e9, software_factor=2.0, cpu_gflops=50.0)


def scenarios(cal, bucket_bytes):
    """name -> (compute seconds per step, allreduce(n, p) cost function, overlap, style)."""
    gpu = BATCH / GPU_IMAGES_PER_S
    ib = NETWORKS["InfiniBand EDR (12.5 GB/s, 1 µs)"]
    eth = NETWORKS["10 GbE (1.25 GB/s, 25 µs)"]
    nvl = NETWORKS["NVLink (V100: 150 GB/s per direction, 2 µs)"]
    sw = cal.get("software_factor", DEFAULTS["software_factor"])
    cpu = BATCH * RESNET50_GFLOP_PER_IMAGE / cal.get("cpu_gflops", DEFAULTS["cpu_gflops"])

    def flat(net, factor=1.0):
        return lambda n, p: ring(n, p, net["alpha"], factor / net["bw"])

    def hier(inter, factor=1.0):
        intra = dict(alpha=nvl["alpha"], bw=nvl["bw"] / factor)
        inter2 = dict(alpha=inter["alpha"], bw=inter["bw"] / factor)
        return lambda n, p: hierarchical(n, p, 8, intra, inter2)

    return {
        "GPU, 1 per node, InfiniBand EDR ring, overlap": (gpu, flat(ib), True, "-"),
        "GPU, 1 per node, InfiniBand EDR ring, no overlap": (gpu, flat(ib), False, "--"),
        "GPU, 8 per node on NVLink + InfiniBand EDR, overlap": (gpu, hier(ib), True, "-"),
        f"same, replicate's measured software factor ({sw:.2f}x)": (gpu, hier(ib, sw), True,
                                                                    ":"),
        "GPU, 1 per node, 10 GbE ring, overlap": (gpu, flat(eth), True, "-"),
        "GPU, 1 per node, 10 GbE ring, no overlap": (gpu, flat(eth), False, "--"),
        "GPU, NVLink ring only (one large NVLink domain), overlap": (gpu, flat(nvl), True, "-."),
        "V100 mixed precision (1000 images/s), 8 per node NVLink + IB EDR, overlap": (
            BATCH / 1000.0, hier(ib), True, "-"),
        "V100 mixed precision, 8 per node NVLink + IB EDR, no overlap": (
            BATCH / 1000.0, hier(ib), False, "--"),
        "CPU nodes like this one (measured GFLOP/s), 10 GbE, overlap": (cpu, flat(eth), True,
                                                                        "-"),
    }


# -- calibration from the simulated cluster (bench/multihost.py) ---------------------------------
def fit_link(rows):
    """(a, b) of t(n) = a + b n from the all-reduce alone at two sizes on 2 hosts."""
    pts = sorted((v["bytes"], v["seconds"]) for k, v in rows.items()
                 if k.startswith("allreduce") and v)
    (n0, t0), (n1, t1) = pts[0], pts[-1]
    b = (t1 - t0) / (n1 - n0)
    return t0 - b * n0, b


def two_level(n, p, g, a, b, nvl, piece=MB):
    """The two-level all-reduce as built (``hierarchy.py``): within the node over NVLink
    (reduce-scatter + all-gather), then the chain of the H nodes, every node's link carrying
    the bucket once each way; for H > 2 the way back starts when the way forward ends."""
    hosts = max(1, p // g)
    t = ring(n, g, nvl["alpha"], 1 / nvl["bw"]) if g > 1 else 0.0
    if hosts == 2:
        t += a + n * b + piece * b
    elif hosts > 2:
        t += 2 * (a + n * b) + 2 * (hosts - 1) * (a / 2 + piece * b)
    return t


def compressed_cpu_seconds(elements: int, repeats: int = 7) -> float:
    """The CPU work the bfloat16-compressed all-reduce of ``elements`` float32 gradients adds on
    2 hosts (one rank each), timed on this machine: the cast of the bucket to bfloat16 before
    it, each rank's sum of the two ranks' rows of its half (``hierarchy.combine``, as the split
    all-reduce does: bfloat16 has no MPI type), and the cast back to float32 after it. The
    median of ``repeats`` runs, in seconds."""
    import statistics
    import time

    import numpy as np

    from replicate.dtypes import bfloat16
    from replicate.runtime.communication.hierarchy import combine

    x = np.random.default_rng(0).standard_normal(elements).astype(np.float32)
    half = elements // 2
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        low = x.astype(bfloat16)
        rows = np.stack([low[:half], low[half:2 * half]])  # (what the all-to-all delivers)
        part = combine(rows, "sum")
        low[:half] = part
        low.astype(np.float32)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def multihost_section():
    """The model calibrated on the simulated cluster: its 2-host prediction against the
    measured rows, and its prediction for 32 hosts x 8 GPUs."""
    mh = load("multihost")
    if not mh:
        return "Simulated cluster: n/a (run bench/multihost.py as root)."
    mlp = 4 * (784 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10)
    lines, fits = [], {}
    casts = compressed_cpu_seconds(mlp // 4)
    for rate, rows in mh["scaling"].items():
        a, b = fits[rate] = fit_link(rows)
        for row, nbytes, cpu in (("replicate plain", mlp, 0.0),
                                 ("replicate bf16-compressed", mlp / 2, casts)):
            if row not in rows:
                continue
            t1 = rows[row]["t1"]
            predicted = t1 / (t1 + a + b * nbytes + cpu)
            measured = rows[row]["efficiency"]
            lines.append(f"{rate}, {row}: predicted {predicted:.2f}, measured {measured:.2f} "
                         f"({(predicted / measured - 1) * 100:+.0f} %)")
    a, b = fits.get("10gbit", (None, None))
    if a is None:
        return "Simulated cluster: no 10 Gbit/s rows."
    nvl = NETWORKS["NVLink (V100: 150 GB/s per direction, 2 µs)"]
    layers = gradient_layers()
    gpu = BATCH / GPU_IMAGES_PER_S
    eff = efficiency(256, gpu, layers, 25 * MB, lambda n, p: two_level(n, p, 8, a, b, nvl))
    return "\n".join([
        "Calibrated on the simulated cluster (bench/results/multihost.json): the all-reduce "
        "alone at two sizes on 2 hosts gives t(n) = a + b n per link rate (10 Gbit/s: a = "
        f"{a * 1e3:.2f} ms, 1/b = {1 / b / 1e9:.2f} GB/s); with the measured 1-host step time "
        "the 2-host efficiency is t1 / (t1 + t(gradient bytes) + c) (one bucket, after the "
        "backward pass; c: for the bfloat16-compressed row, the CPU work of its casts and "
        f"bfloat16 sums, timed here: {casts * 1e3:.2f} ms, 0 otherwise):",
        *[f"- {line}" for line in lines], "",
        f"Prediction, 32 hosts x 8 GPUs (256 replicas), ResNet-50 as above, two-level "
        f"all-reduce, overlap: {eff * 100:.0f} % weak-scaling efficiency. Assumptions: each "
        f"host's link delivers what the simulated 10 Gbit/s link delivered here (a, b above, "
        f"measured {mh.get('machine', {}).get('date', '?')}: TCP through the kernel of a "
        "host with one core, not RDMA); NVLink inside the host at the "
        "published figures; the GPU's gradients reach the network without a host copy (with "
        "replicate's host-staged transport add two PCIe copies per bucket); P100-class compute "
        f"({GPU_IMAGES_PER_S:.0f} images/s, batch {BATCH}); no stragglers."])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--plot", default=os.path.join(C.HERE, "scaleout.png"))
    ap.add_argument("--quick", action="store_true", help="same as the full run (it is fast)")
    args = ap.parse_args(argv)
    bucket = args.bucket_mb * MB
    layers = gradient_layers()
    cal = calibration()
    scen = scenarios(cal, bucket)
    table = {}
    for name, (compute, ar, overlap, _) in scen.items():
        table[name] = [efficiency(p, compute, layers, bucket, ar, overlap) for p in REPLICAS]
    text = report(cal, scen, table, layers, bucket)
    plot(args.plot, scen, table)
    print(f"\nplot: {os.path.relpath(args.plot)}")
    C.save_json("scaleout_model", {"calibration": cal, "replicas": REPLICAS,
                                   "efficiency": table, "markdown": text})


def validation(cal):
    """The model with local alpha/beta against the measured 2-process weak scaling."""
    if "ws_compute" not in cal or "local_alpha" not in cal:
        return "Validation against weak_scaling.py: n/a (run allreduce.py and weak_scaling.py)."
    mlp = [4 * (784 * 1024 + 1024), 4 * (1024 * 1024 + 1024), 4 * (1024 * 10 + 10)]
    sw = cal.get("software_factor", 1.0)
    out = []
    for label, factor in (("raw MPI", 1.0), ("with the software factor", sw)):
        def ar(n, p, f=factor):
            return ring(n, p, cal["local_alpha"], f * cal["local_beta"])
        e_ov = efficiency(2, cal["ws_compute"], mlp, 25 * MB, ar, True)
        e_no = efficiency(2, cal["ws_compute"], mlp, 25 * MB, ar, False)
        out.append(f"{label}: {e_ov * 100:.0f} % with overlap, {e_no * 100:.0f} % without")
    return (f"Validation on this machine (MLP of weak_scaling.py, 7.4 MB of gradients, measured "
            f"1-process step {cal['ws_compute'] * 1e3:.1f} ms, local alpha/beta): model "
            + "; ".join(out) + f"; measured {cal['ws_measured'] * 100:.0f} %. The two processes "
            "also share the memory bandwidth and the two cores with everything else, which the "
            "model does not see.")


def report(cal, scen, table, layers, bucket):
    total = sum(layers)
    nb = math.ceil(total / bucket)
    gpu = BATCH / GPU_IMAGES_PER_S
    cols = ["scenario"] + [str(p) for p in REPLICAS]
    cells = [[name] + [f"{e * 100:.0f}" for e in effs] for name, effs in table.items()]
    assumptions = [
        f"gradients: ResNet-50, {len(resnet50_shapes())} tensors in {len(layers)} weight layers, "
        f"{total / 1e6:.1f} MB float32, {args_bucket(bucket)} buckets (about {nb}), packed in "
        "backward order",
        f"GPU compute per step: batch {BATCH} at {GPU_IMAGES_PER_S:.0f} images/s (a P100-class "
        f"GPU, float32) = {gpu * 1e3:.0f} ms; forward 1/3, backward 2/3, spread evenly over "
        f"the {len(layers)} weight layers",
        "ring all-reduce 2(p-1)·alpha + 2(p-1)/p·n·beta per bucket; buckets one after another "
        "on the link; the reduction arithmetic is free (GPU); no stragglers, no jitter",
        "8 GPUs per node: reduce-scatter/all-gather over NVLink, the ring over the nodes on the "
        "node's share, the node's network link shared by its 8 GPUs",
        "networks: " + "; ".join(NETWORKS),
        "software factor: replicate's compiled all-reduce step / a raw MPI Allreduce of the same "
        "bytes, " + (f"measured here = {cal['software_factor']:.2f}x" if "software_factor" in cal
                     else f"not measured, default {DEFAULTS['software_factor']}x")
        + ", applied to the bandwidth terms",
        "CPU scenario: ResNet-50 at about "
        f"{RESNET50_GFLOP_PER_IMAGE:.1f} GFLOP per image (forward + backward), batch {BATCH}, "
        f"at this core's measured {cal.get('cpu_gflops', DEFAULTS['cpu_gflops']):.0f} GFLOP/s "
        f"(hand-written NumPy MLP, 1 thread)",
        "local calibration (2 ranks, shared memory): alpha = "
        + (f"{cal['local_alpha'] * 1e6:.1f} µs, 1/beta = {1 / cal['local_beta'] / 1e9:.2f} GB/s"
           if "local_alpha" in cal else "not measured"),
    ]
    pub = "; ".join(f"{n}" for n, _, _ in PUBLISHED)
    text = [C.header("Scale-out model: weak-scaling efficiency (%) of ResNet-50, 2-1024 "
                     "replicas", "python bench/scaleout_model.py"),
            C.table(cols, cells), "",
            f"Published, for comparison: {pub}.", "",
            "Assumptions:", *[f"- {a}" for a in assumptions], "",
            validation(cal), "",
            multihost_section(), "",
            "Calibrated from: " + (", ".join(cal["sources"]) or "defaults only") + "."]
    out = "\n".join(text)
    print(out)
    return out


def args_bucket(bucket):
    return f"{bucket / MB:.0f} MiB"


def plot(path, scen, table):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install 'replicate[bench]')")
        return
    fig, ax = plt.subplots(figsize=(12, 5.5))
    for name, effs in table.items():
        ax.plot(REPLICAS, [e * 100 for e in effs], scen[name][3], marker=".", label=name)
    for (label, p, e), m, dx in zip(PUBLISHED, ("*", "D", "s"), (0.88, 1.0, 1.12)):
        ax.plot([p * dx], [e * 100], m, markersize=9, color="black", linestyle="none",
                label=f"published: {label}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(REPLICAS)
    ax.set_xticklabels([str(p) for p in REPLICAS])
    ax.set_ylim(0, 102)
    ax.set_xlabel("replicas (GPUs)")
    ax.set_ylabel("weak-scaling efficiency (%)")
    ax.set_title("ResNet-50 data parallel: bucketed ring all-reduce + compute (model)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7.5, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    main()
