"""The Python test envs themselves (tests/python/envs): the numpy Pendulum against
Gymnasium's published Pendulum-v1 step, worked by hand; seeding; the time limit."""

import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent / "envs"))

import pendulum  # noqa: E402


def test_one_step_is_the_published_formula():
    env = pendulum.make(theta0=1.0, theta_dot0=-0.5)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(np.array([1.5], dtype=np.float32))
    th, thdot, u, g, dt = 1.0, -0.5, 1.5, 10.0, 0.05
    cost = th ** 2 + 0.1 * thdot ** 2 + 0.001 * u ** 2
    newthdot = thdot + (3 * g / 2 * math.sin(th) + 3.0 * u) * dt
    newth = th + newthdot * dt
    assert reward == -cost
    assert np.allclose(obs, [math.cos(newth), math.sin(newth), newthdot], atol=1e-7)
    assert not terminated and not truncated and info == {}


def test_torque_and_speed_are_clipped():
    env = pendulum.make(theta0=0.0, theta_dot0=7.9)
    env.reset()
    obs, reward, *_ = env.step([100.0])
    assert obs[2] == np.float32(8.0)  # the speed clip
    assert math.isclose(reward, -(0.1 * 7.9 ** 2 + 0.001 * 4.0))  # the torque clipped to 2


def test_seeded_resets_repeat_and_differ():
    a, b = pendulum.make(), pendulum.make()
    assert np.array_equal(a.reset(seed=5)[0], b.reset(seed=5)[0])
    assert not np.array_equal(a.reset(seed=5)[0], a.reset(seed=6)[0])


def test_truncated_after_200_steps():
    env = pendulum.make()
    env.reset(seed=1)
    flags = [env.step([0.0])[3] for _ in range(200)]
    assert flags[-1] and not any(flags[:-1])
