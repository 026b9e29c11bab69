"""One evaluation for every side of a Pendulum learning comparison: a run's final policy acting
deterministically from the same fixed start states, through the same numpy Pendulum
(tests/python/envs/pendulum.py) and the same code, whichever program trained it.

Each run's own evaluation draws its start states from its own random stream, so two runs'
figures differ by the start states as well as by the policies: on Pendulum a good policy's
episode returns spread by 80-90 over start states, about 9 of noise on a 100-episode mean.
Scored on one shared set of start states, that noise is the same on every side and drops
out of the comparison; what is left is the policies.

    starts = start_states(1000)          # fixed by START_SEED: the same on every side and seed
    mean, per_episode = evaluate(policy, starts)

`policy` maps a float32 tensor [n, 3] of observations to actions [n, 1] in the env's units
(torque); it is called once per step for all the episodes together. Imported by
python_module_sac.py's anvil side and by reference/sac_pendulum_train.py.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python", "envs"))
import pendulum  # noqa: E402

START_SEED = 12345  # chosen before any run was scored on it; not tuned


def start_states(n, seed=START_SEED):
    """n start states (theta, theta_dot) from Pendulum-v1's own start distribution:
    theta ~ U(-pi, pi), theta_dot ~ U(-1, 1)."""
    if n < 1:
        raise ValueError(f"start_states: n is {n}; it must be at least 1")
    return np.random.default_rng(seed).uniform(low=[-np.pi, -1.0], high=[np.pi, 1.0], size=(n, 2))


def evaluate(policy, starts):
    """The mean undiscounted return of `policy` over one episode (200 steps) from each start
    state, and the per-episode returns."""
    import torch
    envs = [pendulum.Pendulum(theta0=th, theta_dot0=thd) for th, thd in starts]
    obs = np.stack([e.reset()[0] for e in envs])
    returns = np.zeros(len(envs))
    # Pendulum never terminates: every episode runs its 200 steps, all in step with each other
    for step in range(pendulum.Pendulum.max_episode_steps):
        with torch.no_grad():
            act = policy(torch.from_numpy(obs)).numpy().reshape(len(envs), -1)
        if not np.all(np.isfinite(act)):
            raise ValueError(f"evaluate: the policy returned a non-finite action at step {step}")
        for i, e in enumerate(envs):
            obs[i], r, _, _, _ = e.step(act[i])
            returns[i] += r
    return float(returns.mean()), returns
