#!/usr/bin/python3
"""Python/PyTorch reference for a whole SAC training run on the numpy Pendulum
(tests/python/envs/pendulum.py, Gymnasium's published Pendulum-v1 dynamics): the comparison
point of `anvil.train("sac", pendulum.Pendulum, ...)` (benchmarks/python_module_sac.py).

The same work as anvil's run with the settings that script gives both: 20,000 env steps, one
env; 1,000 steps of uniform random actions first, then one gradient update per env step;
networks, losses and optimiser of `sac_update.py` (actor and twin critic 256x256 ReLU,
tanh-squashed Gaussian, learned temperature, Adam), learning rate 1e-3 for all three, batch
256, gamma 0.99, tau 0.005, a 1M-transition replay; every 2,000 steps and at the end, 10
deterministic evaluation episodes (tanh of the mean) on an env of its own, and a log line.
Bootstraps through truncation (time limit), not through termination, as anvil does.

    /usr/bin/python3 benchmarks/reference/sac_pendulum_train.py --seed 0 --threads 1

Prints one JSON line: final evaluation return, training seconds (first reset to the end of
the last evaluation), updates. With --common-eval N, after the timed run, also the final
actor's return over benchmarks/pendulum_eval.py's N fixed start states, the evaluation every
side of a comparison shares (`common_eval_return`).
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, ".."), os.path.join(HERE, "..", "..", "tests", "python", "envs")]
import pendulum  # noqa: E402
import pendulum_eval  # noqa: E402
from sac_update import SAC, openblas_core  # noqa: E402


class Replay:
    """A uniform replay preallocated in numpy, sampled into torch tensors."""

    def __init__(self, capacity, obs_dim, act_dim, rng):
        self.obs = np.zeros((capacity, obs_dim), np.float32)
        self.act = np.zeros((capacity, act_dim), np.float32)
        self.rew = np.zeros(capacity, np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), np.float32)
        self.done = np.zeros(capacity, np.float32)
        self.n, self.i, self.capacity, self.rng = 0, 0, capacity, rng

    def add(self, o, a, r, o2, terminated):
        self.obs[self.i], self.act[self.i], self.rew[self.i] = o, a, r
        self.next_obs[self.i], self.done[self.i] = o2, float(terminated)
        self.i = (self.i + 1) % self.capacity
        self.n = min(self.n + 1, self.capacity)

    def sample(self, batch):
        idx = self.rng.integers(self.n, size=batch)
        return tuple(torch.from_numpy(x[idx]) for x in (self.obs, self.act, self.rew, self.next_obs, self.done))


def deterministic(sac, obs, scale):
    """The actor's deterministic action for observations [n, 3]: tanh of the mean, in the env's units."""
    return torch.tanh(sac.actor.net(obs).chunk(2, dim=-1)[0]) * scale


def evaluate(sac, env, episodes, scale):
    total = 0.0
    for _ in range(episodes):
        obs, _ = env.reset()
        done = False
        while not done:
            with torch.no_grad():
                a = deterministic(sac, torch.from_numpy(obs).unsqueeze(0), scale)[0].numpy()
            obs, r, terminated, truncated, _ = env.step(a)
            total += r
            done = terminated or truncated
    return total / episodes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--learning-starts", type=int, default=1_000)
    ap.add_argument("--eval-interval", type=int, default=2_000)
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--common-eval", type=int, default=0, metavar="N",
                    help="after the timed run, score the final actor on pendulum_eval.py's N fixed start states")
    ap.add_argument("--flush-denormal", action="store_true",
                    help="torch.set_flush_denormal(True): PyTorch's own switch for the CPUs where arithmetic on "
                         "denormal floats (Adam's decayed moments) is slow")
    args = ap.parse_args()
    if args.common_eval < 0:
        ap.error(f"--common-eval: {args.common_eval} start states; give 0 (off) or more")

    torch.set_num_threads(args.threads)
    if args.flush_denormal and not torch.set_flush_denormal(True):
        sys.exit("--flush-denormal: this CPU cannot flush denormals (torch.set_flush_denormal returned False)")
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    env, eval_env = pendulum.Pendulum(), pendulum.Pendulum()
    scale = float(env.action_space.high[0])  # the actor acts in [-1, 1]
    sac = SAC(256, lr=args.lr)
    replay = Replay(1_000_000, 3, 1, rng)

    start = time.perf_counter()
    obs, _ = env.reset(seed=args.seed)
    eval_env.reset(seed=args.seed + 1_000_003)
    updates, ret = 0, float("nan")
    for t in range(1, args.steps + 1):
        if t <= args.learning_starts:
            a = rng.uniform(-1.0, 1.0, size=1).astype(np.float32)
        else:
            with torch.no_grad():
                a = sac.actor(torch.from_numpy(obs).unsqueeze(0))[0][0].numpy()
        next_obs, r, terminated, truncated, _ = env.step(a * scale)
        replay.add(obs, a, r, next_obs, terminated)
        obs = next_obs
        if terminated or truncated:
            obs, _ = env.reset()
        if t > args.learning_starts:
            sac.update(*replay.sample(args.batch))
            updates += 1
        if t % args.eval_interval == 0 or t == args.steps:
            ret = evaluate(sac, eval_env, args.eval_episodes, scale)
            print(f"step {t}/{args.steps}  {updates} updates  eval {ret:.1f}  {time.perf_counter() - start:.1f} s",
                  file=sys.stderr, flush=True)
    seconds = time.perf_counter() - start
    out = {"name": "sac_pendulum_pytorch_reference", "seed": args.seed, "final_eval_return": ret,
           "train_seconds": seconds, "updates": updates, "threads": args.threads,
           "torch": torch.__version__, "openblas_core": openblas_core()}
    if args.common_eval:
        out["common_eval_return"], _ = pendulum_eval.evaluate(lambda obs: deterministic(sac, obs, scale),
                                                              pendulum_eval.start_states(args.common_eval))
        out["common_eval_episodes"] = args.common_eval
    print(json.dumps(out))


if __name__ == "__main__":
    main()
