#!/usr/bin/python3
"""Python/PyTorch reference for PPO's throughput on CartPole (CPU).

The same work as anvil's `bench_ppo` (benchmarks/bench_ppo.cpp) at one setting, written the
way a competent researcher writes PPO in eager PyTorch with a numpy-vectorised env:

  CartPole-v1 dynamics (Gymnasium's constants, Euler integration, termination at |x| > 2.4
  or |theta| > 12 degrees, truncation at 500 steps, autoreset) for N envs as numpy arrays;
  separate 64x64 tanh actor (categorical) and critic MLPs, orthogonal init; Adam 3e-4
  (eps 1e-5) annealed linearly to 0; rollouts of --rollout rows (--rollout / N steps per
  env); GAE (gamma 0.99, lambda 0.95) with truncated episodes bootstrapped from their last
  state; --epochs passes in shuffled minibatches of --minibatch, advantages normalised per
  minibatch, clipped surrogate (0.2), value loss 0.5, gradient norm 0.5.

Run with Debian's interpreter (it has torch 1.13 and numpy):
    /usr/bin/python3 benchmarks/reference/ppo_cartpole.py --num-envs 8 --steps 65536
Prints one JSON line (env steps per wall-clock second of the whole run) to stdout; the
mean return of the last 20 episodes goes to stderr, to show it learns.
"""
import argparse
import json
import math
import sys
import time

import numpy as np
import torch
from torch import nn


class CartPoles:
    """N CartPole-v1 envs stepped together (the published dynamics; Barto et al. 1983)."""

    def __init__(self, n, seed):
        self.n = n
        self.rng = np.random.default_rng(seed)
        self.state = self.rng.uniform(-0.05, 0.05, (n, 4))
        self.t = np.zeros(n, dtype=np.int64)
        self.ret = np.zeros(n)
        self.finished = []

    def step(self, action):
        x, x_dot, th, th_dot = self.state.T
        force = np.where(action == 1, 10.0, -10.0)
        cos, sin = np.cos(th), np.sin(th)
        temp = (force + 0.05 * th_dot**2 * sin) / 1.1
        th_acc = (9.8 * sin - cos * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos**2 / 1.1))
        x_acc = temp - 0.05 * th_acc * cos / 1.1
        x = x + 0.02 * x_dot
        x_dot = x_dot + 0.02 * x_acc
        th = th + 0.02 * th_dot
        th_dot = th_dot + 0.02 * th_acc
        self.state = np.stack([x, x_dot, th, th_dot], 1)
        self.t += 1
        self.ret += 1.0
        terminated = (np.abs(x) > 2.4) | (np.abs(th) > 12 * 2 * math.pi / 360)
        truncated = (self.t >= 500) & ~terminated
        final = self.state.copy()
        done = terminated | truncated
        if done.any():
            self.finished.extend(self.ret[done].tolist())
            k = int(done.sum())
            self.state[done] = self.rng.uniform(-0.05, 0.05, (k, 4))
            self.t[done] = 0
            self.ret[done] = 0.0
        return self.state.astype(np.float32), np.ones(self.n, np.float32), terminated, truncated, final.astype(np.float32)


def mlp(out, gain):
    net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, out))
    for i, layer in enumerate([net[0], net[2], net[4]]):
        nn.init.orthogonal_(layer.weight, math.sqrt(2) if i < 2 else gain)
        nn.init.zeros_(layer.bias)
    return net


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--steps", type=int, default=65536)
    p.add_argument("--rollout", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--minibatch", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    n, T = a.num_envs, max(1, a.rollout // a.num_envs)
    envs = CartPoles(n, a.seed)
    actor, critic = mlp(2, 0.01), mlp(1, 1.0)
    params = list(actor.parameters()) + list(critic.parameters())
    opt = torch.optim.Adam(params, lr=3e-4, eps=1e-5)
    gamma, lam = 0.99, 0.95
    obs_buf = torch.zeros(T, n, 4)
    act_buf = torch.zeros(T, n, dtype=torch.long)
    logp_buf, val_buf, rew_buf = torch.zeros(T, n), torch.zeros(T, n), torch.zeros(T, n)
    term_buf, trunc_buf, boot_buf = torch.zeros(T, n), torch.zeros(T, n), torch.zeros(T, n)
    obs = torch.from_numpy(envs.state.astype(np.float32))
    steps = 0
    t0 = time.perf_counter()
    while steps < a.steps:
        for g in opt.param_groups:
            g["lr"] = 3e-4 * max(0.0, 1.0 - steps / a.steps)
        with torch.no_grad():
            for t in range(T):
                logits = actor(obs)
                action = torch.multinomial(logits.softmax(-1), 1).squeeze(-1)
                obs_buf[t] = obs
                act_buf[t] = action
                logp_buf[t] = logits.log_softmax(-1).gather(-1, action.unsqueeze(-1)).squeeze(-1)
                val_buf[t] = critic(obs).squeeze(-1)
                nxt, rew, term, trunc, final = envs.step(action.numpy())
                rew_buf[t] = torch.from_numpy(rew)
                term_buf[t] = torch.from_numpy(term.astype(np.float32))
                trunc_buf[t] = torch.from_numpy(trunc.astype(np.float32))
                if trunc.any():
                    boot_buf[t] = critic(torch.from_numpy(final)).squeeze(-1) * trunc_buf[t]
                else:
                    boot_buf[t].zero_()
                obs = torch.from_numpy(nxt)
                steps += n
            last = critic(obs).squeeze(-1)
            adv = torch.zeros(T, n)
            later = torch.zeros(n)
            for t in reversed(range(T)):
                nv = last if t == T - 1 else val_buf[t + 1]
                ended = torch.clamp(term_buf[t] + trunc_buf[t], max=1.0)
                delta = rew_buf[t] + gamma * ((1 - ended) * nv + boot_buf[t]) - val_buf[t]
                later = delta + gamma * lam * (1 - ended) * later
                adv[t] = later
            ret = adv + val_buf
        b_obs, b_act, b_logp = obs_buf.reshape(-1, 4), act_buf.reshape(-1), logp_buf.reshape(-1)
        b_adv, b_ret = adv.reshape(-1), ret.reshape(-1)
        m = b_obs.shape[0]
        for _ in range(a.epochs):
            perm = torch.randperm(m)
            for s in range(0, m, a.minibatch):
                i = perm[s : s + a.minibatch]
                mb_adv = b_adv[i]
                if i.numel() > 1:
                    mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                lp_all = actor(b_obs[i]).log_softmax(-1)
                lp = lp_all.gather(-1, b_act[i].unsqueeze(-1)).squeeze(-1)
                ratio = (lp - b_logp[i]).exp()
                pg = torch.max(-mb_adv * ratio, -mb_adv * ratio.clamp(0.8, 1.2)).mean()
                v = critic(b_obs[i]).squeeze(-1)
                loss = pg + 0.5 * 0.5 * (v - b_ret[i]).pow(2).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(params, 0.5)
                opt.step()
    wall = time.perf_counter() - t0
    recent = envs.finished[-20:]
    print(f"mean return of the last {len(recent)} episodes: {np.mean(recent) if recent else float('nan'):.1f}",
          file=sys.stderr)
    print(json.dumps({"name": "python_ppo_env_steps_per_s", "value": steps / wall, "unit": "env steps/s",
                      "config": {"num_envs": n, "rollout_rows": T * n, "epochs": a.epochs,
                                 "minibatch": a.minibatch, "steps": steps, "threads": a.threads}}))


if __name__ == "__main__":
    main()
