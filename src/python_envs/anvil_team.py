"""A PettingZoo-style parallel env as one anvil env in anvil's multi-agent layout.

anvil steps a cooperative team as one env (envs/multi_agent/multi_agent_env.hpp,
core/spaces.hpp `AgentLayout`): one observation row `[obs_0 .. obs_k-1 | avail_0 ..
avail_k-1 | state | first]` and one discrete joint action whose base-`num_actions` digits
are the agents' actions (agent 0 least significant). `Team` gives a PettingZoo parallel env
(`possible_agents`, `observation_space(agent)`, `action_space(agent)`, `state()`, dict-valued
`reset` and `step`) that face, duck-typed as the rest of anvil's Python envs are. The limits
of the layout, which `Team` checks and names when an env passes them:

- agents alike: every agent has an observation of the same size and the same number of
  discrete actions (a Discrete space, `n`);
- the team acts together: the agents are `possible_agents`, all present from reset to the end
  of the episode; the episode ends when any agent's does (terminated if any agent
  terminated, else truncated);
- one team reward: the mean of the agents' rewards (their common reward when they share one);
- action masks, if any, as PettingZoo gives them: observations that are dicts with
  "observation" and "action_mask", or `info[agent]["action_mask"]`; otherwise every action
  is available;
- the global state from `state()` when the env has it, else the agents' observations
  concatenated.

Used by the in-process bridge (src/python_envs/bridge.cpp) and the env workers
(src/python_envs/env_worker.py) for any env that has `possible_agents`.
"""

import numpy as np


class TeamFault(Exception):
    """A PettingZoo env that anvil's multi-agent layout cannot hold, or an action it refuses."""


def is_team(env):
    return hasattr(env, "possible_agents")


class Box:
    """A float32 Box, duck-typed as anvil reads spaces (shape, low, high, dtype)."""

    def __init__(self, low, high):
        self.low = np.asarray(low, dtype=np.float32)
        self.high = np.asarray(high, dtype=np.float32)
        self.shape = self.low.shape
        self.dtype = np.float32


class _Discrete:
    def __init__(self, n):
        self.n = int(n)


def _space(env, kind, agent):
    s = getattr(env, kind)
    return s(agent) if callable(s) else s[agent]


class Team:
    """The team env (see module comment)."""

    def __init__(self, env):
        self.env = env
        self.agents = list(env.possible_agents)
        if not self.agents:
            raise TeamFault("possible_agents is empty")
        k = len(self.agents)
        sizes, actions = set(), set()
        for a in self.agents:
            o = _space(env, "observation_space", a)
            if isinstance(o, dict) or hasattr(o, "spaces"):  # a Dict space: {"observation", "action_mask"}
                o = o["observation"] if isinstance(o, dict) else o.spaces["observation"]
            if not hasattr(o, "shape"):
                raise TeamFault(f"observation_space({a!r}) has no shape (anvil reads Box observations)")
            sizes.add(int(np.prod(o.shape, dtype=np.int64)))
            s = _space(env, "action_space", a)
            if not hasattr(s, "n"):
                raise TeamFault(f"action_space({a!r}) is not Discrete (no `n`): anvil's multi-agent layout takes "
                                "discrete actions")
            actions.add(int(s.n))
        if len(sizes) != 1 or len(actions) != 1:
            raise TeamFault(f"the agents differ (observation sizes {sorted(sizes)}, action counts {sorted(actions)}): "
                            "anvil's multi-agent layout takes agents alike")
        self.obs_dim, self.num_actions = sizes.pop(), actions.pop()
        self.state_dim = None  # known at the first reset
        self._first = True
        self._row = None
        # the layout's spaces; the observation's length is fixed at the first reset (the state's)
        obs, infos = self._reset_raw(seed=None)
        self._probe = (obs, infos)
        self.state_dim = self._state(obs).size
        self.agent_layout = (k, self.obs_dim, self.num_actions, self.state_dim)
        row = k * (self.obs_dim + self.num_actions) + self.state_dim + 1
        low, high = np.full(row, -np.inf, np.float32), np.full(row, np.inf, np.float32)
        low[k * self.obs_dim:k * (self.obs_dim + self.num_actions)] = 0.0
        high[k * self.obs_dim:k * (self.obs_dim + self.num_actions)] = 1.0
        low[-1], high[-1] = 0.0, 1.0
        self.observation_space = Box(low, high)
        if self.num_actions ** k >= 2 ** 62:
            raise TeamFault(f"{self.num_actions} actions ^ {k} agents joint actions do not fit in an int64")
        self.action_space = _Discrete(self.num_actions ** k)

    def _reset_raw(self, seed):
        r = self.env.reset(seed=seed)
        if not (isinstance(r, tuple) and len(r) == 2 and isinstance(r[0], dict)):
            raise TeamFault("reset() did not return (observations, infos) as dicts by agent (PettingZoo's parallel API)")
        return r

    def _split(self, o):
        if isinstance(o, dict):
            return o["observation"], o.get("action_mask")
        return o, None

    def _state(self, obs):
        if hasattr(self.env, "state"):
            return np.asarray(self.env.state(), dtype=np.float32).reshape(-1)
        return np.concatenate([np.asarray(self._split(obs[a])[0], np.float32).reshape(-1) for a in self.agents])

    def _pack(self, obs, infos, first):
        k, d, n = len(self.agents), self.obs_dim, self.num_actions
        row = np.zeros(self.observation_space.low.size, np.float32)
        for i, a in enumerate(self.agents):
            if a not in obs:
                raise TeamFault(f"agent {a!r} has no observation: anvil's multi-agent layout keeps every agent to the "
                                "episode's end")
            o, mask = self._split(obs[a])
            o = np.asarray(o, np.float32).reshape(-1)
            if o.size != d:
                raise TeamFault(f"agent {a!r}'s observation has {o.size} numbers; its space has {d}")
            row[i * d:(i + 1) * d] = o
            if mask is None and isinstance(infos, dict) and isinstance(infos.get(a), dict):
                mask = infos[a].get("action_mask")
            row[k * d + i * n:k * d + (i + 1) * n] = 1.0 if mask is None else np.asarray(mask, np.float32).reshape(-1)
        s = self._state(obs)
        if s.size != self.state_dim:
            raise TeamFault(f"state() has {s.size} numbers; it had {self.state_dim} at the first reset")
        row[k * (d + n):k * (d + n) + self.state_dim] = s
        row[-1] = 1.0 if first else 0.0
        self._row = row
        return row

    def reset(self, seed=None, options=None):
        if self._probe is not None and seed is None:
            obs, infos = self._probe
        else:
            obs, infos = self._reset_raw(seed)
        self._probe = None
        self._last_obs = obs
        return self._pack(obs, infos, True), {}

    def step(self, joint):
        k, d, n = len(self.agents), self.obs_dim, self.num_actions
        joint = int(joint)
        actions = {}
        for i, a in enumerate(self.agents):
            digit = joint % n
            joint //= n
            if self._row[k * d + i * n + digit] < 0.5:
                raise TeamFault(f"agent {i} ({a!r}) took action {digit}, which is not available to it now")
            actions[a] = digit
        r = self.env.step(actions)
        if not (isinstance(r, tuple) and len(r) == 5 and all(isinstance(x, dict) for x in r)):
            raise TeamFault("step() did not return (observations, rewards, terminations, truncations, infos) as dicts "
                            "by agent (PettingZoo's parallel API)")
        obs, rewards, terms, truncs, infos = r
        reward = float(np.mean([float(rewards.get(a, 0.0)) for a in self.agents]))
        terminated = any(bool(terms.get(a, False)) for a in self.agents)
        truncated = not terminated and any(bool(truncs.get(a, False)) for a in self.agents)
        if terminated or truncated:
            # the episode's last row: agents PettingZoo has removed keep their last observation
            obs = {a: obs.get(a, self._last_obs.get(a)) for a in self.agents}
        self._last_obs = obs
        return self._pack(obs, infos, False), reward, terminated, truncated, {}

    def close(self):
        if hasattr(self.env, "close"):
            self.env.close()
