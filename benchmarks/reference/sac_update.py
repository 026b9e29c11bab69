#!/usr/bin/python3
"""Python/PyTorch reference for one Soft Actor-Critic gradient update (CPU).

The same work as anvil's `bench_sac_update` (benchmarks/bench_sac_update.cpp), written the
way a competent researcher writes SAC in eager PyTorch:

  Pendulum shapes (obs 3, action 1); actor and twin-critic MLPs with two H-wide ReLU layers;
  tanh-squashed Gaussian actor whose log std is squashed smoothly into [-5, 2]; learned
  temperature (log alpha = 0, target entropy -|A|); Adam at 3e-4 for all three; gamma 0.99,
  tau 0.005. One update = sample a batch from a 100k-transition replay, soft Bellman target,
  critic step, actor step (gradients into the actor only), temperature step, Polyak update.

Run with Debian's interpreter (it has torch 1.13):
    /usr/bin/python3 benchmarks/reference/sac_update.py --hidden 256 --batch 256 --threads 1
Prints one JSON line (the median wall-clock updates/s over --repeats timed runs) to stdout;
the individual repeats, the median updates per CPU-second of this process and the OpenBLAS
kernel family in use go to stderr.
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time

import torch
from torch import nn
import torch.nn.functional as F

OBS_DIM, ACT_DIM = 3, 1
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
LOG_2 = math.log(2.0)


def mlp(inp, hidden, out):
    return nn.Sequential(
        nn.Linear(inp, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, out),
    )


class Actor(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.net = mlp(OBS_DIM, hidden, 2 * ACT_DIM)

    def forward(self, obs):
        """Reparameterised tanh-Gaussian sample and its log-density, [B, A] and [B]."""
        mean, raw = self.net(obs).chunk(2, dim=-1)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(raw) + 1.0)
        eps = torch.randn_like(mean)
        u = mean + log_std.exp() * eps
        # log N(u; mean, std) with (u - mean) / std == eps, minus log|d tanh(u)/du| written as
        # 2 (log 2 - u - softplus(-2u)) for numerical stability.
        log_prob = (-0.5 * eps.square() - log_std - HALF_LOG_2PI).sum(-1)
        log_prob = log_prob - (2.0 * (LOG_2 - u - F.softplus(-2.0 * u))).sum(-1)
        return torch.tanh(u), log_prob


class TwinQ(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.q1 = mlp(OBS_DIM + ACT_DIM, hidden, 1)
        self.q2 = mlp(OBS_DIM + ACT_DIM, hidden, 1)

    def forward(self, obs, act):
        x = torch.cat([obs, act], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


class Replay:
    """A preallocated, already-full uniform replay of random transitions."""

    def __init__(self, n):
        self.n = n
        self.obs = torch.randn(n, OBS_DIM)
        self.act = torch.rand(n, ACT_DIM) * 2 - 1
        self.rew = torch.randn(n)
        self.next_obs = torch.randn(n, OBS_DIM)
        self.done = (torch.rand(n) < 0.01).float()

    def sample(self, batch):
        idx = torch.randint(self.n, (batch,))
        return (self.obs.index_select(0, idx), self.act.index_select(0, idx),
                self.rew.index_select(0, idx), self.next_obs.index_select(0, idx),
                self.done.index_select(0, idx))


class SAC:
    def __init__(self, hidden, lr=3e-4, gamma=0.99, tau=0.005, init_alpha=1.0, foreach=True):
        self.gamma, self.tau = gamma, tau
        self.actor = Actor(hidden)
        self.critic = TwinQ(hidden)
        self.critic_target = TwinQ(hidden)
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.critic_target.requires_grad_(False)
        self.log_alpha = torch.tensor([math.log(init_alpha)], requires_grad=True)
        self.target_entropy = -float(ACT_DIM)
        self.actor_params = list(self.actor.parameters())
        self.critic_params = list(self.critic.parameters())
        self.target_params = list(self.critic_target.parameters())
        self.actor_opt = torch.optim.Adam(self.actor_params, lr=lr, foreach=foreach)
        self.critic_opt = torch.optim.Adam(self.critic_params, lr=lr, foreach=foreach)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=lr, foreach=foreach)

    def update(self, obs, act, rew, next_obs, done):
        alpha = self.log_alpha.detach().exp()

        # (2) soft Bellman target, no graph.
        with torch.no_grad():
            next_act, next_logp = self.actor(next_obs)
            tq1, tq2 = self.critic_target(next_obs, next_act)
            y = rew + self.gamma * (1.0 - done) * (torch.min(tq1, tq2) - alpha * next_logp)

        # (3) critic.
        q1, q2 = self.critic(obs, act)
        critic_loss = 0.5 * (F.mse_loss(q1, y) + F.mse_loss(q2, y))
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_opt.step()

        # (4) actor: differentiate through the critic, but write gradients only into the
        # actor's parameters (the critic's weight-gradient products are never computed).
        new_act, logp = self.actor(obs)
        q1_pi, q2_pi = self.critic(obs, new_act)
        actor_loss = (alpha * logp - torch.min(q1_pi, q2_pi)).mean()
        grads = torch.autograd.grad(actor_loss, self.actor_params)
        for p, g in zip(self.actor_params, grads):
            p.grad = g
        self.actor_opt.step()

        # (5) temperature.
        alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
        self.alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_opt.step()

        # (6) Polyak average of the target critic: t <- (1 - tau) t + tau p.
        # (torch._foreach_lerp_ arrived after 1.13; mul_ + add_ is the 1.13 spelling.)
        with torch.no_grad():
            torch._foreach_mul_(self.target_params, 1.0 - self.tau)
            torch._foreach_add_(self.target_params, self.critic_params, alpha=self.tau)


def openblas_core():
    """OpenBLAS's kernel family in this process (e.g. 'Haswell', 'SkylakeX'), or None."""
    try:
        fn = ctypes.CDLL(None).openblas_get_corename
    except AttributeError:
        try:
            fn = ctypes.CDLL("libopenblas.so.0").openblas_get_corename
        except (OSError, AttributeError):
            return None
    fn.restype = ctypes.c_char_p
    return fn().decode()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds per timed repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-foreach", dest="foreach", action="store_false",
                    help="per-tensor Adam instead of the multi-tensor (foreach) one")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    replay = Replay(100_000)
    sac = SAC(args.hidden, foreach=args.foreach)

    def one_update():
        sac.update(*replay.sample(args.batch))

    for _ in range(args.warmup):
        one_update()
    # Each repeat runs whole updates until --seconds of wall time have passed (the same
    # scheme as anvil's bench::median_rate), so a stall cannot shrink the later repeats.
    rates, cpu_rates, counts = [], [], []
    for _ in range(args.repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        n, t1 = 0, t0
        while t1 - t0 < args.seconds:
            one_update()
            n += 1
            t1 = time.perf_counter()
        c1 = time.process_time()
        rates.append(n / (t1 - t0))
        cpu_rates.append(n / (c1 - c0))
        counts.append(n)

    print(f"# repeats: {' '.join(f'{r:.1f}' for r in rates)} updates/s ({sum(counts)} updates); "
          f"per CPU-second of this process (all threads; less sensitive to other load): "
          f"{statistics.median(cpu_rates):.1f}; OpenBLAS core: {openblas_core()}", file=sys.stderr)
    print(json.dumps({
        "name": "python_sac_update",
        "value": round(statistics.median(rates), 2),
        "unit": "updates/s",
        "config": {
            "hidden": args.hidden,
            "batch": args.batch,
            "threads": args.threads,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "default"),
        },
        "device": "cpu",
        "torch": torch.__version__,
        "impl": "pytorch-python",
    }), flush=True)


if __name__ == "__main__":
    main()
