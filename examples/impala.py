"""IMPALA-style actor-learner with V-trace on CartPole-v1 (``rp.ActorLearner``).

Actors step their own CartPole environments with a copy of the policy that may be a few
updates old and push 10-step trajectories into the learner's bounded queue; the learner
corrects for the lag with V-trace (Espeholt et al. 2018: truncated importance weights rho and
c, n-step value targets v_s) and publishes its parameters to the actors after every update.

    python -m replicate.launch -n 2 examples/impala.py              # 1 learner + 1 actor process
    python -m replicate.launch -n 2 examples/impala.py --layout threads   # each: learner + actor
    python examples/impala.py --actors 2                             # one process, 2 actor threads

Prints the environment steps per second, the policy lag the learner saw and the mean return of
the last 20 episodes (those in the trajectories the learner trained on); plots the return
against wall time (impala.png). It stops when that mean reaches 475 (``--target``, 0: train the
whole budget).

Defaults (at most the budget of examples/rl.py: 2000 updates of 160 transitions = 320 000
environment steps): each actor runs 16 environments, a trajectory is 10 steps of each, one
trajectory per update; the same separate 64-64 tanh actor and critic as rl.py, gradients
clipped to a global norm of 0.5, gamma 0.99, V-trace lambda 0.95, rho and c truncated at 1,
value-loss coefficient 0.5, no entropy bonus, Adam 2e-3 decaying linearly to 0. Why these: with
the policy lag of asynchronous actors (2-3 updates here) the learning is less stable than
rl.py's on-policy A2C. With rl.py's Adam 3e-3 (and trajectories of 8 environments x 20
steps, or 32 x 5) a run now and then collapsed to a return of about 9 and stayed there, in
every layout, and a policy that had reached 500 sometimes fell back later; with ``--max-lag
0`` (on-policy data only: stale trajectories dropped, at half the throughput) 7 of 7 runs
reached the target. With the defaults, 19 of 20 runs (1
learner + 1 actor process, seeds 51-70) reached the target, after 35 000-210 000 environment
steps; with ``--target 0`` a run may still fall back after reaching it (bench/impala_vs_a2c.py).
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import numpy as np

import replicate as rp
import replicate.numpy as rnp


class ActorCritic(rp.nn.Module):
    """Policy logits and state value from separate 64-64 tanh MLPs (as examples/rl.py)."""

    def __init__(self, hidden=64, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)

        def body():
            return rp.nn.Sequential(rp.nn.Linear(4, hidden, rng=rng), rp.nn.tanh,
                                    rp.nn.Linear(hidden, hidden, rng=rng), rp.nn.tanh)

        self.actor_body, self.critic_body = body(), body()
        self.pi = rp.nn.Linear(hidden, 2, rng=rng, init_fn=lambda s, rng=None, dtype=None:
                               rp.nn.init.normal(s, 0.01, rng=rng))
        self.v = rp.nn.Linear(hidden, 1, rng=rng)

    def forward(self, obs):
        return self.pi(self.actor_body(obs)), rnp.squeeze(self.v(self.critic_body(obs)), -1)


def log_softmax_np(logits):
    z = logits - logits.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def make_actor_fn(model, n_envs, unroll, gamma, seed):
    """actor_fn(ctx): yields trajectories {obs (T+1, E, 4), act, rew, done, logp, episode
    (T, E)}; ``episode`` holds the return of each episode where it ends (-1 elsewhere)."""

    def actor_fn(ctx):
        policy = rp.function(model)  # reads the published copy of the parameters
        envs = [gym.make("CartPole-v1") for _ in range(n_envs)]
        base = seed + 1000 * ctx.actor_id + 100_000 * ctx.run
        obs = np.stack([e.reset(seed=base + i)[0] for i, e in enumerate(envs)]).astype(np.float32)
        rng = np.random.default_rng([seed, ctx.actor_id, ctx.run])
        ep_ret = np.zeros(n_envs)
        while True:
            b_obs = np.empty((unroll + 1, n_envs, 4), np.float32)
            b_act = np.empty((unroll, n_envs), np.int64)
            b_rew, b_done, b_logp = (np.zeros((unroll, n_envs), np.float32) for _ in range(3))
            b_ep = np.full((unroll, n_envs), -1.0, np.float32)
            for t in range(unroll):
                logits, _ = policy(obs)
                logp = log_softmax_np(np.asarray(logits))
                act = (rng.random(n_envs) < np.exp(logp[:, 1])).astype(np.int64)
                b_obs[t], b_act[t], b_logp[t] = obs, act, logp[np.arange(n_envs), act]
                for i, e in enumerate(envs):
                    o, r, term, trunc, _ = e.step(int(act[i]))
                    ep_ret[i] += r
                    b_rew[t, i] = r
                    if term or trunc:
                        b_ep[t, i], ep_ret[i] = ep_ret[i], 0.0
                        if trunc and not term:  # time limit: bootstrap from the last state
                            b_rew[t, i] += gamma * float(policy(o[None].astype(np.float32))[1][0])
                        b_done[t, i] = 1.0
                        o, _ = e.reset()
                    obs[i] = o
            b_obs[unroll] = obs
            yield {"obs": b_obs, "act": b_act, "rew": b_rew, "done": b_done, "logp": b_logp,
                   "episode": b_ep}

    return actor_fn


def vtrace(values, bootstrap, rew, done, log_rho, gamma, lam, rho_bar=1.0, c_bar=1.0):
    """V-trace targets v_s and policy-gradient advantages, (B, T, E) each, without gradient."""
    T = values.shape[1]
    rho = rnp.exp(rnp.stop_gradient(log_rho))
    rho_t = rnp.minimum(rho, rho_bar)
    c = lam * rnp.minimum(rho, c_bar)
    discount = gamma * (1.0 - done)
    values = rnp.stop_gradient(values)
    bootstrap = rnp.stop_gradient(bootstrap)
    next_values = rnp.concatenate([values[:, 1:], rnp.expand_dims(bootstrap, 1)], axis=1)
    delta = rho_t * (rew + discount * next_values - values)
    acc = rnp.zeros_like(bootstrap)
    diffs = [None] * T
    for t in reversed(range(T)):  # vs_t - V(x_t) = delta_t + gamma_t c_t (vs_t+1 - V(x_t+1))
        acc = delta[:, t] + discount[:, t] * c[:, t] * acc
        diffs[t] = acc
    vs = values + rnp.stack(diffs, axis=1)
    next_vs = rnp.concatenate([vs[:, 1:], rnp.expand_dims(bootstrap, 1)], axis=1)
    return vs, rho_t * (rew + discount * next_vs - values)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="graph", choices=["graph", "eager"])
    ap.add_argument("--layout", default="processes", choices=["processes", "threads"],
                    help="processes: the last process acts, the others learn (with more than "
                         "one process); threads: every process learns and runs --actors threads")
    ap.add_argument("--actors", type=int, default=1, help="actor threads per acting process")
    ap.add_argument("--envs", type=int, default=16, help="environments per actor")
    ap.add_argument("--unroll", type=int, default=10, help="trajectory length")
    ap.add_argument("--batch-size", type=int, default=1, help="trajectories per update")
    ap.add_argument("--updates", type=int, default=2000)
    ap.add_argument("--publish-every", type=int, default=1)
    ap.add_argument("--queue-size", type=int, default=None)
    ap.add_argument("--max-lag", type=int, default=None,
                    help="drop trajectories more than this many updates old")
    ap.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    ap.add_argument("--lr-decay", type=float, default=1.0)
    ap.add_argument("--gamma", type=float, default=0.99)
    ap.add_argument("--lam", type=float, default=0.95, help="V-trace lambda")
    ap.add_argument("--entropy", type=float, default=0.0)
    ap.add_argument("--value-coef", type=float, default=0.5)
    ap.add_argument("--max-grad-norm", type=float, default=0.5)
    ap.add_argument("--target", type=float, default=475.0,
                    help="stop once the mean return of the last 20 episodes reaches it (0: "
                         "train all --updates)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default="impala.png")
    ap.add_argument("--log", default=None, help="write the episodes and rates as JSON here")
    args = ap.parse_args(argv)

    n = rp.process_count()
    actor_ranks = [n - 1] if args.layout == "processes" and n > 1 else []
    model = ActorCritic(seed=args.seed)

    def lr(step):
        frac = rnp.cast(step - 1, np.float32) / float(max(args.updates, 1))
        return args.lr * (1.0 - args.lr_decay * rnp.minimum(frac, 1.0))

    opt = rp.wrap_optimizer(rp.optim.Adam(model.parameters(), lr=lr),
                            max_grad_norm=args.max_grad_norm or None)
    actor_fn = make_actor_fn(model, args.envs, args.unroll, args.gamma, args.seed)
    T = args.unroll

    def step_fn(traj, lag):
        obs = traj["obs"]  # (B, T+1, E, 4)
        B, _, E, _ = obs.shape
        logits, v = model(rnp.reshape(obs, (B * (T + 1) * E, 4)))
        logits = rnp.reshape(logits, (B, T + 1, E, 2))[:, :T]
        v = rnp.reshape(v, (B, T + 1, E))
        logp_all = rp.nn.log_softmax(logits)
        logp = rnp.squeeze(rnp.take_along_axis(logp_all, rnp.expand_dims(traj["act"], -1), -1),
                           -1)
        vs, adv = vtrace(v[:, :T], v[:, T], traj["rew"], traj["done"], logp - traj["logp"],
                         args.gamma, args.lam)
        policy_loss = -(logp * adv).mean()
        value_loss = 0.5 * ((vs - v[:, :T]) ** 2).mean()
        entropy = -(rnp.exp(logp_all) * logp_all).sum(-1).mean()
        loss = policy_loss + args.value_coef * value_loss - args.entropy * entropy
        opt.apply(rp.grad(loss, model.parameters()))
        return {"loss": loss, "entropy": entropy, "lag": lag, "episode": traj["episode"]}

    episodes = []  # (wall time, return) of the episodes in the trajectories the learner took

    def track(rep, step, outputs):  # a callback: on every learner process alike
        ended = np.asarray(outputs["episode"]).ravel()
        now = time.perf_counter() - start
        episodes.extend((now, float(r)) for r in ended[ended >= 0])
        last = [r for _, r in episodes[-20:]]
        if args.target and len(last) == 20 and np.mean(last) >= args.target:
            rep.stop()  # the target is reached: every learner stops after this step

    al = rp.ActorLearner(actor_fn, step_fn, params=model.parameters(), actors=args.actors,
                         actor_ranks=actor_ranks, batch_size=args.batch_size,
                         publish_every=args.publish_every, queue_size=args.queue_size,
                         max_lag=args.max_lag, mode=args.mode, outputs="per_replica")
    rp.barrier()
    start = time.perf_counter()
    history = al.run(steps=args.updates, callbacks=[track])
    elapsed = time.perf_counter() - start

    per_update = args.batch_size * T * args.envs * len(np.asarray(history[0]["loss"]))
    env_steps = len(history) * per_update
    returns = np.array([r for _, r in episodes])
    last20 = float(returns[-20:].mean()) if len(returns) else 0.0
    lags = np.concatenate([np.asarray(h["lag"]).ravel() for h in history])
    if rp.is_main_process():
        where = "in 1 actor process" if actor_ranks else "as threads beside the learner(s)"
        print(f"{al.num_actors} actor(s) {where}, {len(history)} updates, {env_steps} "
              f"environment steps in {elapsed:.1f}s: {env_steps / elapsed:.0f} environment "
              f"steps/s; {len(returns)} episodes")
        print(f"policy lag per trajectory: mean {lags.mean():.2f}, max {lags.max():.0f}")
        window = np.convolve(returns, np.ones(20) / 20, "valid") if len(returns) >= 20 else []
        above = np.flatnonzero(np.asarray(window) >= 475)
        if len(above):
            print(f"20-episode mean first >= 475 at {episodes[above[0] + 19][0]:.1f}s "
                  f"(update {_update_of(history, above[0] + 20)})")
        print(f"mean return of the last 20 episodes: {last20:.1f}")
        if args.log:
            with open(args.log, "w") as f:
                json.dump({"example": "impala", "elapsed": elapsed, "env_steps": env_steps,
                           "episodes": episodes}, f)
        _plot(episodes, args.plot)
    return last20, env_steps, history


def _update_of(history, count):
    """The update whose trajectories held the ``count``-th episode."""
    seen = 0
    for update, outputs in enumerate(history, 1):
        seen += int((np.asarray(outputs["episode"]) >= 0).sum())
        if seen >= count:
            return update
    return len(history)


def _plot(episodes, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    t = np.array([e[0] for e in episodes])
    ret = np.array([e[1] for e in episodes])
    ax.plot(t, ret, lw=0.5, alpha=0.5, label="episode return")
    if len(ret) >= 20:
        ax.plot(t[19:], np.convolve(ret, np.ones(20) / 20, "valid"), label="mean of last 20")
    ax.set_xlabel("wall time (s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
