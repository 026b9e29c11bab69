"""`anvil.load_policy(path)`: a run's policy.safetensors as a torch.nn.Module (python3-torch)
whose `forward(obs)` is the policy's deterministic action in the env's units, as anvil's C++
`load_policy(...).act(obs)` computes it."""

import numpy as np

from . import safetensors

_ACTIVATIONS = ("relu", "tanh", "elu", "gelu", "silu", "leaky_relu")


def _torch():
    try:
        import torch
    except ImportError:
        raise ImportError("anvil.load_policy builds a torch.nn.Module: install PyTorch (Debian: python3-torch)") from None
    return torch


def _activation(torch, name):
    f = torch.nn.functional
    return {"relu": f.relu, "tanh": torch.tanh, "elu": f.elu, "gelu": f.gelu, "silu": f.silu,
            "leaky_relu": lambda x: f.leaky_relu(x, 0.01)}[name]


def _gaussian_actor(torch, tensors, meta, path):
    obs_dim, act_dim = int(meta["obs_dim"]), int(meta["action_dim"])
    hidden = [int(h) for h in meta["hidden"].split(",") if h]
    if meta["activation"] not in _ACTIVATIONS:
        raise ValueError(f"{path}: activation '{meta['activation']}' is not one anvil knows")
    act = _activation(torch, meta["activation"])

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            widths = [obs_dim, *hidden, 2 * act_dim]
            for i in range(len(widths) - 1):
                self.add_module(f"fc{i}", torch.nn.Linear(widths[i], widths[i + 1]))
            self.layers = len(widths) - 1

        def forward(self, x):
            for i in range(self.layers - 1):
                x = act(getattr(self, f"fc{i}")(x))
            return getattr(self, f"fc{self.layers - 1}")(x)

    class GaussianPolicy(torch.nn.Module):
        """anvil's Gaussian actor acting deterministically: tanh(mean) in the env's units."""

        def __init__(self):
            super().__init__()
            self.net = Mlp()
            self.register_buffer("action_scale", torch.zeros(act_dim))
            self.register_buffer("action_offset", torch.zeros(act_dim))
            self.normalised = "obs_mean" in tensors
            if self.normalised:
                self.register_buffer("obs_mean", torch.zeros(obs_dim))
                self.register_buffer("obs_inv_std", torch.zeros(obs_dim))
                self.obs_clip = float(meta["obs_clip"])
            self.metadata = dict(meta)

        def forward(self, obs):
            x = obs.to(torch.float32)
            if self.normalised:
                x = ((x - self.obs_mean) * self.obs_inv_std).clamp(-self.obs_clip, self.obs_clip)
            mean = self.net(x)[..., :act_dim]
            return torch.tanh(mean) * self.action_scale + self.action_offset

    module = GaussianPolicy()
    state = {k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in tensors.items()}
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{path}: tensors missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    return module.eval()


def load_policy(path):
    """The policy a run wrote (its policy.safetensors) as a torch.nn.Module in eval mode:
    `module(obs)` gives the deterministic action for observations [..., obs_dim] in the
    env's units. The metadata (`module.metadata`) names the env and the architecture."""
    torch = _torch()
    tensors, meta = safetensors.load(path)
    if meta.get("format") != "anvil policy 1":
        raise ValueError(f"{path}: not an anvil policy (metadata format is {meta.get('format')!r})")
    if meta.get("kind") == "GaussianActor":
        return _gaussian_actor(torch, tensors, meta, path)
    raise ValueError(f"{path}: policy kind {meta.get('kind')!r} is not one this anvil loads")
