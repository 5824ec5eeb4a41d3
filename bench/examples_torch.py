"""The PyTorch twins of examples/transformer.py, mnist.py and ppo.py (bench/examples_vs_torch.py
runs them against the examples).

Each twin builds the example's model with the example's own code (the same seed), copies its
initial parameters into the same model written in ``torch.nn`` (linear weights transposed:
replicate stores them (in, out)), and trains on the same data in the same order: the global batch
of R replicas of batch B is the R per-replica batches in replica order (``shard_batches`` with
one replica of batch R*B; the transformer's windows drawn per (step, replica); PPO's R actors
stepped in turn with their own seeds and draws). Learning-rate schedules are the example's
schedule objects evaluated for each update (``LambdaLR``). What cannot be shared: dropout masks
(torch's generator) and, after the first updates, float rounding: RL trajectories part ways.
"""

from __future__ import annotations

import importlib.util
import os
import time

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def example(name):
    """examples/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(f"example_{name}",
                                                  os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load(torch_module, ours, transpose=()):
    """Copy ``ours`` (a replicate Module) into ``torch_module``: the same names, the linear
    weights in ``transpose`` transposed."""
    mine = {n: v.numpy() for n, v in ours.parameters().items()}
    theirs = dict(torch_module.named_parameters())
    assert set(mine) == set(theirs), (sorted(set(mine) ^ set(theirs)))
    with torch.no_grad():
        for n, p in theirs.items():
            value = mine[n].T if n in transpose else mine[n]
            assert p.shape == value.shape, (n, p.shape, value.shape)
            p.copy_(torch.from_numpy(np.ascontiguousarray(value)))


def linear_names(module):
    return {f"{n}.weight" for n, m in module.named_modules() if isinstance(m, nn.Linear)}


def lambda_lr(opt, schedule, lr):
    """``torch.optim.lr_scheduler.LambdaLR`` giving the rate of replicate's ``schedule`` at
    update n + 1 (its update count starts at 1)."""
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda n: float(np.asarray(schedule(np.asarray(n + 1, np.int64)))) / lr)


# -- MNIST ----------------------------------------------------------------------------------------
class MnistNet(nn.Module):
    def __init__(self, side=8):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 32, 3, 1), nn.Conv2d(32, 64, 3, 1)
        self.dropout1, self.dropout2 = nn.Dropout(0.25), nn.Dropout(0.5)
        self.fc1 = nn.Linear(64 * ((side - 4) // 2) ** 2, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = F.relu(self.fc1(torch.flatten(self.dropout1(x), 1)))
        return F.log_softmax(self.fc2(self.dropout2(x)), dim=1)


def mnist(replicas, seed=1, epochs=14, batch=64, lr=1.0, gamma=0.7):
    ex = example("mnist")
    x_train, y_train, x_test, y_test = ex.digits()
    torch.manual_seed(seed)
    model = MnistNet()
    load(model, ex.Net(np.random.default_rng(seed)), linear_names(model))
    opt = torch.optim.Adadelta(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=gamma)
    assert batch % replicas == 0
    losses, tests = [], []
    start = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        for x, y in epoch_batches(x_train, y_train, batch, seed, epoch):
            opt.zero_grad()
            loss = F.nll_loss(model(torch.from_numpy(x)), torch.from_numpy(y))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        sched.step()
        model.eval()
        with torch.no_grad():
            out = model(torch.from_numpy(x_test))
            tests.append((F.nll_loss(out, torch.from_numpy(y_test), reduction="sum").item()
                          / len(y_test),
                          (out.argmax(1).numpy() == y_test).mean().item()))
    return {"elapsed": time.perf_counter() - start, "losses": losses, "tests": tests}


def epoch_batches(x, y, batch, seed, epoch):
    """``rp.shard_batches``' global batches of ``epoch`` (its permutation:
    ``default_rng([seed, epoch])``; R replicas of batch B take rows in replica order)."""
    order = np.random.default_rng([seed, epoch]).permutation(len(x))
    for s in range(len(x) // batch):
        idx = order[s * batch:(s + 1) * batch]
        yield x[idx], y[idx]


# -- the transformer -----------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False, is_causal=True)[0]
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, context):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, ids):
        t = ids.shape[-1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        x = self.wte(ids) + self.wpe(torch.arange(t))
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln_f(x))


def transformer(replicas, seed=0, steps=400, batch=16, context=64, d=64, layers=2, heads=4,
                lr=3e-3, warmup=20):
    import replicate as rp

    ex = example("transformer")
    text, vocab = ex.corpus()
    codes = np.frombuffer(text.encode("ascii"), np.uint8)
    ids = np.searchsorted(np.frombuffer("".join(vocab).encode("ascii"), np.uint8), codes)
    cut = len(ids) * 9 // 10
    train, held = ids[:cut], ids[cut:]
    n = (len(held) - 1) // context * context
    val_x = torch.from_numpy(held[:n].reshape(-1, context))
    val_y = torch.from_numpy(held[1:n + 1].reshape(-1, context))
    torch.manual_seed(seed)
    own = GPT(len(vocab), d, layers, heads, context)  # torch's own default initialisation
    model = GPT(len(vocab), d, layers, heads, context)
    ours = ex.GPT(len(vocab), d, layers, heads, context, seed)
    names = linear_names(model) | {f"blocks.{i}.attn.in_proj_weight" for i in range(layers)}
    load(model, ours, names)
    schedule = rp.optim.LinearLR(rp.optim.CosineAnnealingLR(lr, steps), 1.0 / warmup, 1.0, warmup)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, eps=1e-8, weight_decay=0.01)
    sched = lambda_lr(opt, schedule, lr)

    def held_out(m):
        with torch.no_grad():
            return F.cross_entropy(m(val_x).flatten(0, 1), val_y.flatten()).item()

    def first_loss(m):
        x, y = (torch.from_numpy(np.concatenate(a)) for a in zip(*[
            ex.windows(train, context, batch, seed, 0, r) for r in range(replicas)]))
        with torch.no_grad():
            return F.cross_entropy(m(x).flatten(0, 1), y.flatten()).item()

    own_first, before, losses = first_loss(own), held_out(model), []
    start = time.perf_counter()
    for step in range(steps):
        x, y = (torch.from_numpy(np.concatenate(a)) for a in zip(*[
            ex.windows(train, context, batch, seed, step, r) for r in range(replicas)]))
        opt.zero_grad()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    elapsed = time.perf_counter() - start
    return {"elapsed": elapsed, "losses": losses, "held_out": [before, held_out(model)],
            "own_init_first_loss": own_first, "vocab": len(vocab)}


# -- PPO ------------------------------------------------------------------------------------------
class ActorCritic(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()

        def body():
            return nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, hidden),
                                 nn.Tanh())

        self.actor, self.critic = body(), body()
        self.pi, self.v = nn.Linear(hidden, 2), nn.Linear(hidden, 1)

    def forward(self, obs):
        return self.pi(self.actor(obs)), self.v(self.critic(obs)).squeeze(-1)


def ppo(replicas, seed=0, envs=2, rollout=128, rollouts=200, epochs=4, minibatches=4, lr=5e-4,
        gamma=0.99, lam=0.95, clip=0.2, entropy_coef=0.01, value_coef=0.5):
    import replicate as rp

    ex = example("ppo")
    torch.manual_seed(seed)
    model = ActorCritic()
    load(model, ex.ActorCritic(seed=seed), linear_names(model))
    updates = rollouts * epochs * minibatches
    opt = torch.optim.Adam(model.parameters(), lr=lr, eps=1e-8)
    sched = lambda_lr(opt, rp.optim.LinearLR(lr, 1.0, 0.0, updates), lr)
    episodes: list = []
    actors = [ex.Actor(r, envs, rollout, epochs, minibatches, gamma, lam, seed, episodes)
              for r in range(replicas)]

    def policy(obs):
        with torch.no_grad():
            logits, value = model(torch.from_numpy(np.asarray(obs, np.float32)))
        return logits.numpy(), value.numpy()

    def replica_loss(batch):
        obs, act, old_logp, adv, ret = (torch.from_numpy(a) for a in batch)
        logits, value = model(obs)
        pi = torch.distributions.Categorical(logits=logits)
        logp = pi.log_prob(act)
        adv = (adv - adv.mean()) / (adv.std(correction=0) + 1e-8)
        ratio = torch.exp(logp - old_logp)
        surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
        return (-surrogate.mean() + value_coef * 0.5 * ((ret - value) ** 2).mean()
                - entropy_coef * pi.entropy().mean())

    start = time.perf_counter()
    for _ in range(rollouts):
        batches = [list(a.minibatches(a.collect(policy))) for a in actors]
        for parts in zip(*batches):  # one update: the replicas' mean loss, as the mean gradient
            opt.zero_grad()
            loss = sum(replica_loss(b) for b in parts) / replicas
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            sched.step()
    elapsed = time.perf_counter() - start
    return {"elapsed": elapsed, "returns": [float(e[2]) for e in sorted(episodes)]}
