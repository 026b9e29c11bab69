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


def _layers(tensors, prefix):
    """The widths [in, h1, ..., out] of the Linear layers prefix + fc0, fc1, ... in the file."""
    widths, i = [], 0
    while f"{prefix}fc{i}.weight" in tensors:
        w = np.asarray(tensors[f"{prefix}fc{i}.weight"])
        if not widths:
            widths.append(w.shape[1])
        widths.append(w.shape[0])
        i += 1
    return widths


def _linear_layers(torch, module, widths):
    """Adds Linear layers fc0, fc1, ... of `widths` to `module` (anvil's names); their count."""
    for i in range(len(widths) - 1):
        module.add_module(f"fc{i}", torch.nn.Linear(widths[i], widths[i + 1]))
    return len(widths) - 1


def _mlp(torch, widths, act):
    """anvil's nn::Mlp: Linear layers fc0, fc1, ... of `widths`, `act` after each but the last."""

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = _linear_layers(torch, self, widths)

        def forward(self, x):
            for i in range(self.layers - 1):
                x = act(getattr(self, f"fc{i}")(x))
            return getattr(self, f"fc{self.layers - 1}")(x)

    return Mlp()


class _Normaliser:
    """The run's observation normaliser (normalize.obs), frozen: buffers obs_mean, obs_inv_std."""

    def _add_normaliser(self, torch, tensors, meta, obs_dim):
        self.normalised = "obs_mean" in tensors
        if self.normalised:
            self.register_buffer("obs_mean", torch.zeros(obs_dim))
            self.register_buffer("obs_inv_std", torch.zeros(obs_dim))
            self.obs_clip = float(meta["obs_clip"])

    def _normalise(self, x):
        if self.normalised:
            x = ((x - self.obs_mean) * self.obs_inv_std).clamp(-self.obs_clip, self.obs_clip)
        return x


def _activation_of(torch, meta, path):
    if meta.get("activation") not in _ACTIVATIONS:
        raise ValueError(f"{path}: activation {meta.get('activation')!r} is not one anvil knows")
    return _activation(torch, meta["activation"])


def _layout(meta, path):
    """The observation's parts from metadata `layout` (anvil's ObsLayout::describe(): "image
    uint8 [9,64,64], state float32 [3]"): (name, dtype, shape, offset) each, every part at the
    next multiple of 4 bytes after the one before, as anvil packs a row."""
    parts, offset = [], 0
    for item in meta["layout"].split(", "):
        try:
            name, dtype, shape = item.split(" ", 2)
            shape = tuple(int(d) for d in shape.strip("[]").split(","))
        except ValueError:
            raise ValueError(f"{path}: layout part {item!r} is not 'name dtype [sizes]'") from None
        if dtype not in ("uint8", "float32"):
            raise ValueError(f"{path}: layout part {name!r} has dtype {dtype!r}")
        offset = (offset + 3) // 4 * 4
        parts.append((name, dtype, shape, offset))
        offset += int(np.prod(shape)) * (1 if dtype == "uint8" else 4)
    return parts, (offset + 3) // 4 * 4


def _obs_encoder(torch, meta, path):
    """anvil's nn::ObsEncoder: one CNN per image part (the small GroupNorm/spatial-softmax one,
    DQN's, or Diffusion Policy's ResNet-18 with GroupNorm), float parts read as they are, features side by side in the parts' order. Takes
    rows of parts (uint8 [B, row_bytes], as anvil's env hands them out), a dict of parts by
    name, or, when the observation is one image, the image (uint8 [B, C, H, W])."""
    nn, f = torch.nn, torch.nn.functional
    parts, row_bytes = _layout(meta, path)
    kind, features, width = meta["encoder"], int(meta["encoder_features"]), int(meta["encoder_width"])
    if kind not in ("small", "nature", "resnet18"):
        raise ValueError(f"{path}: encoder {kind!r} is not small, nature or resnet18")

    def conv_out(size, k, s, p=0):
        return (size + 2 * p - k) // s + 1

    class SpatialSoftmax(nn.Module):
        def __init__(self, c, h, w, k):
            super().__init__()
            if k != c:
                self.project = nn.Conv2d(c, k, 1)
            xs = torch.linspace(-1.0, 1.0, w) if w > 1 else torch.zeros(1)
            ys = torch.linspace(-1.0, 1.0, h) if h > 1 else torch.zeros(1)
            grid = torch.stack([xs[None, :].expand(h, w), ys[:, None].expand(h, w)], -1)
            self.register_buffer("positions", grid.reshape(h * w, 2).contiguous(), persistent=False)

        def forward(self, x):
            if hasattr(self, "project"):
                x = self.project(x)
            attention = torch.softmax(x.to(torch.float32).flatten(2), -1)
            return torch.matmul(attention, self.positions).flatten(1)

    class SmallCnn(nn.Module):
        def __init__(self, c, h, w):
            super().__init__()
            widths, strides = (width, width, 2 * width, 2 * width), (2, 1, 2, 1)
            for i in range(4):
                self.add_module(f"conv{i}", nn.Conv2d(c if i == 0 else widths[i - 1], widths[i], 3, strides[i], 1))
                self.add_module(f"norm{i}", nn.GroupNorm(8, widths[i]))
            h, w = conv_out(conv_out(h, 3, 2, 1), 3, 2, 1), conv_out(conv_out(w, 3, 2, 1), 3, 2, 1)
            self.pool = SpatialSoftmax(2 * width, h, w, 32)
            self.fc = nn.Linear(64, features)

        def forward(self, x):
            for i in range(4):
                x = f.relu(getattr(self, f"norm{i}")(getattr(self, f"conv{i}")(x)))
            return self.fc(self.pool(x))

    class NatureCnn(nn.Module):
        def __init__(self, c, h, w):
            super().__init__()
            self.conv0, self.conv1, self.conv2 = nn.Conv2d(c, 32, 8, 4), nn.Conv2d(32, 64, 4, 2), nn.Conv2d(64, 64, 3, 1)
            h, w = (conv_out(conv_out(conv_out(d, 8, 4), 4, 2), 3, 1) for d in (h, w))
            self.fc = nn.Linear(64 * h * w, features)

        def forward(self, x):
            x = f.relu(self.conv2(f.relu(self.conv1(f.relu(self.conv0(x))))))
            return f.relu(self.fc(x.flatten(1)))

    class BasicBlock(nn.Module):  # ResNet's basic block, GroupNorm of 16 channels a group
        def __init__(self, i, o, stride):
            super().__init__()
            self.conv0, self.norm0 = nn.Conv2d(i, o, 3, stride, 1, bias=False), nn.GroupNorm(o // 16, o)
            self.conv1, self.norm1 = nn.Conv2d(o, o, 3, 1, 1, bias=False), nn.GroupNorm(o // 16, o)
            if stride != 1 or i != o:
                self.down, self.down_norm = nn.Conv2d(i, o, 1, stride, bias=False), nn.GroupNorm(o // 16, o)

        def forward(self, x):
            h = self.norm1(self.conv1(f.relu(self.norm0(self.conv0(x)))))
            return f.relu(h + (self.down_norm(self.down(x)) if hasattr(self, "down") else x))

    class ResNet18Gn(nn.Module):  # anvil's nn::ResNet18Gn (nn/resnet18_gn.hpp)
        def __init__(self, c, h, w):
            super().__init__()
            self.stem, self.stem_norm = nn.Conv2d(c, 64, 7, 2, 3, bias=False), nn.GroupNorm(4, 64)
            i, k = 64, 0
            for o in (64, 128, 256, 512):
                for b in range(2):
                    self.add_module(f"block{k}", BasicBlock(i, o, 2 if b == 0 and o != 64 else 1))
                    i, k = o, k + 1
            h, w = (conv_out(conv_out(conv_out(conv_out(conv_out(d, 7, 2, 3), 3, 2, 1), 3, 2, 1), 3, 2, 1), 3, 2, 1)
                    for d in (h, w))
            self.pool = SpatialSoftmax(512, h, w, 32)
            self.fc = nn.Linear(64, features)

        def forward(self, x):
            x = f.max_pool2d(f.relu(self.stem_norm(self.stem(x))), 3, 2, 1)
            for k in range(8):
                x = getattr(self, f"block{k}")(x)
            return self.fc(self.pool(x))

    cnn = {"small": SmallCnn, "nature": NatureCnn, "resnet18": ResNet18Gn}[kind]

    class ObsEncoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.parts, self.row_bytes = parts, row_bytes
            for name, dtype, shape, _ in parts:
                if dtype == "uint8":
                    self.add_module(name, cnn(*shape))
            self.output_size = sum(features if d == "uint8" else int(np.prod(s)) for _, d, s, _ in parts)

        def _part(self, obs, name, dtype, shape, offset):
            if isinstance(obs, dict):
                return obs[name]
            if obs.dtype == torch.uint8 and obs.dim() >= 2 and obs.shape[-1] == self.row_bytes:
                n = int(np.prod(shape)) * (1 if dtype == "uint8" else 4)
                piece = obs[..., offset:offset + n].contiguous()
                return piece.view(-1, *shape) if dtype == "uint8" else piece.view(torch.float32)
            if len(self.parts) == 1 and dtype == "uint8":
                return obs  # the one image, [B, C, H, W]
            raise ValueError(f"observations of {meta['layout']} come as rows of uint8 [B, {self.row_bytes}] "
                             f"or a dict of parts; got {tuple(obs.shape)} {obs.dtype}")

        def forward(self, obs):
            out = []
            for name, dtype, shape, offset in self.parts:
                x = self._part(obs, name, dtype, shape, offset)
                if dtype == "uint8":
                    x = x.to(torch.float32) / 255.0 if x.dtype == torch.uint8 else x
                    out.append(getattr(self, name)(x))
                else:
                    out.append(x.to(torch.float32).reshape(x.shape[0], -1))
            return out[0] if len(out) == 1 else torch.cat(out, 1)

    return ObsEncoder()


def _gaussian_actor(torch, tensors, meta, path):
    obs_dim, act_dim = int(meta["obs_dim"]), int(meta["action_dim"])
    hidden = [int(h) for h in meta["hidden"].split(",") if h]
    heads = int(meta.get("heads", "1"))  # > 1: an output head per task, picked by the observation's last `heads` numbers
    if not 1 <= heads <= obs_dim:
        raise ValueError(f"{path}: {heads} heads for observations of {obs_dim} numbers")
    act = _activation_of(torch, meta, path)

    class GaussianPolicy(torch.nn.Module, _Normaliser):
        """anvil's Gaussian actor (SAC) acting deterministically: tanh(mean) in the env's units.
        With several heads (multi-task SAC's `actor.heads`), each observation's task one-hot (its
        last `heads` numbers, the one positive among them) picks its head."""

        def __init__(self):
            super().__init__()
            if "encoder" in meta:  # observations with images: read through the encoder first
                self.encoder = _obs_encoder(torch, meta, path)
            self.net = _mlp(torch, [obs_dim, *hidden, 2 * act_dim * heads], act)
            self.register_buffer("action_scale", torch.zeros(act_dim))
            self.register_buffer("action_offset", torch.zeros(act_dim))
            self._add_normaliser(torch, tensors, meta, obs_dim)

        def forward(self, obs):
            x = self._normalise(self.encoder(obs) if hasattr(self, "encoder") else obs.to(torch.float32))
            out = self.net(x)
            if heads > 1:
                one_hot = x[..., obs_dim - heads:]
                if not bool(((one_hot > 0).sum(-1) == 1).all()):
                    raise ValueError(f"observations' last {heads} numbers are not a task one-hot in every row")
                out = out.unflatten(-1, (heads, 2 * act_dim))
                pick = one_hot.argmax(-1)[..., None, None].expand(*one_hot.shape[:-1], 1, 2 * act_dim)
                out = out.gather(-2, pick).squeeze(-2)
            return torch.tanh(out[..., :act_dim]) * self.action_scale + self.action_offset

    return GaussianPolicy()


def _ppo_actor(torch, tensors, meta, path):
    obs_dim, act_dim, discrete = int(meta["obs_dim"]), int(meta["action_dim"]), meta["discrete"] == "1"
    widths = _layers(tensors, "net.")
    if len(widths) < 2 or widths[0] != obs_dim or widths[-1] != act_dim:
        raise ValueError(f"{path}: the actor's layers {widths} do not take {obs_dim} observations to {act_dim} actions")
    act = _activation_of(torch, meta, path)

    class PpoPolicy(torch.nn.Module, _Normaliser):
        """anvil's PPO actor acting deterministically: the most likely action (int64) for discrete
        actions; for continuous ones the mean, clipped to [action_low, action_high] and scaled to
        the env's units as the run's collector does."""

        def __init__(self):
            super().__init__()
            if "encoder" in meta:  # observations with images: read through the encoder first
                self.encoder = _obs_encoder(torch, meta, path)
            self.net = _mlp(torch, widths, act)
            if not discrete:
                for name in ("action_scale", "action_offset", "action_low", "action_high"):
                    self.register_buffer(name, torch.zeros(act_dim))
            self._add_normaliser(torch, tensors, meta, obs_dim)

        def forward(self, obs):
            x = self.encoder(obs) if hasattr(self, "encoder") else obs.to(torch.float32)
            out = self.net(self._normalise(x))
            if discrete:
                return out.argmax(-1)
            return torch.maximum(torch.minimum(out, self.action_high), self.action_low) * self.action_scale + self.action_offset

    return PpoPolicy()


def _gru_net(torch, widths, memory, out, act):
    """anvil's nn::GruActor: Linear layers fc0, fc1, ... of `widths` (`act` after each), a GRU
    cell `gru` of `memory`, a Linear head to `out`; forward(x, h) gives (output, next h)."""

    class GruNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = _linear_layers(torch, self, widths)
            self.gru = torch.nn.GRUCell(widths[-1], memory)
            self.head = torch.nn.Linear(memory, out)

        def forward(self, x, h):
            for i in range(self.layers):
                x = act(getattr(self, f"fc{i}")(x))
            h = self.gru(x, h)
            return self.head(h), h

    return GruNet()


def _recurrent_ppo_actor(torch, tensors, meta, path):
    obs_dim, act_dim, memory = int(meta["obs_dim"]), int(meta["action_dim"]), int(meta["memory"])
    discrete = meta["discrete"] == "1"
    widths = _layers(tensors, "net.") or [obs_dim]
    if widths[0] != obs_dim:
        raise ValueError(f"{path}: the actor's first layer does not take {obs_dim} observations")
    net = _gru_net(torch, widths, memory, act_dim, _activation_of(torch, meta, path))

    class RecurrentPpoPolicy(torch.nn.Module, _Normaliser):
        """anvil's recurrent PPO actor acting deterministically: `forward(obs, memory=None)` takes
        observations [..., obs_dim] and the actor's memory [..., memory] (None: zeros, an
        episode's first step; then what the last step returned, zeroed where an episode starts)
        and gives (action, next memory): the most likely action (int64) for discrete actions;
        for continuous ones the mean, clipped and scaled to the env's units as the run does."""

        recurrent = True

        def __init__(self):
            super().__init__()
            self.net = net
            if not discrete:
                for name in ("action_scale", "action_offset", "action_low", "action_high"):
                    self.register_buffer(name, torch.zeros(act_dim))
            self._add_normaliser(torch, tensors, meta, obs_dim)

        def forward(self, obs, memory=None):
            x = self._normalise(obs.to(torch.float32))
            lead = x.shape[:-1]
            h = torch.zeros(*lead, net.gru.hidden_size) if memory is None else memory.to(torch.float32)
            out, h = self.net(x.reshape(-1, obs_dim), h.reshape(-1, net.gru.hidden_size))
            out, h = out.reshape(*lead, act_dim), h.reshape(*lead, -1)
            if discrete:
                return out.argmax(-1), h
            return torch.maximum(torch.minimum(out, self.action_high), self.action_low) * self.action_scale + self.action_offset, h

    return RecurrentPpoPolicy()


def _map_encoder(torch, meta, size):
    """COMA's map encoder (nn/map_encoder.hpp): the first C x H x W numbers of a vector of `size`
    through three convolutions (5x5, 4x4, 4x4, ReLU), flattened, then the other numbers."""
    c, h, w = (int(v) for v in meta["map"].split(","))
    width = int(meta["map_channels"])

    class MapEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv0 = torch.nn.Conv2d(c, width, 5)
            self.conv1 = torch.nn.Conv2d(width, width, 4)
            self.conv2 = torch.nn.Conv2d(width, width, 4)
            self.output_size = width * (h - 10) * (w - 10) + size - c * h * w

        def forward(self, x):
            lead = x.shape[:-1]
            flat = x.reshape(-1, x.shape[-1])
            y = flat[:, : c * h * w].reshape(-1, c, h, w)
            for conv in (self.conv0, self.conv1, self.conv2):
                y = conv(y).relu()
            return torch.cat([y.flatten(1), flat[:, c * h * w:]], 1).reshape(*lead, -1)

    return MapEncoder()


def _coma_actor(torch, tensors, meta, path):
    agents, obs_dim, actions, memory = (int(meta[k]) for k in ("agents", "obs_dim", "actions", "memory"))
    act = _activation_of(torch, meta, path)
    widths = _layers(tensors, "net.")
    encoder = _map_encoder(torch, meta, obs_dim + agents) if "map" in meta else None
    features = encoder.output_size if encoder is not None else obs_dim + agents
    if encoder is not None and widths:
        if widths[0] != features:
            raise ValueError(f"{path}: the actor's first layer takes {widths[0]} numbers, not the map encoder's {features}")
        widths = [obs_dim + agents, *widths[1:]]  # the checks below are of the observation; the MLP reads features
    if memory > 0:
        if not widths or widths[0] != obs_dim + agents:
            raise ValueError(f"{path}: the actor's first layer does not take {obs_dim} observations and {agents} ids")

        net = _gru_net(torch, [features, *widths[1:]], memory, actions, act)
    else:
        if len(widths) < 2 or widths[0] != obs_dim + agents or widths[-1] != actions:
            raise ValueError(f"{path}: the actor's layers {widths} do not take {obs_dim} observations and {agents} "
                             f"ids to {actions} actions")
        net = _mlp(torch, [features, *widths[1:]], act)

    class ComaPolicy(torch.nn.Module):
        """anvil's COMA actor, shared by the agents: `forward(obs, avail=None, memory=None)` takes
        each agent's observation [..., agents, obs_dim] (and its available actions [..., agents,
        actions], 1/0) and gives each agent's most likely available action [..., agents] (int64).
        A recurrent actor (metadata memory > 0) also takes and returns its memory [..., agents,
        memory]: None (zeros) at an episode's first step, then what the last step returned."""

        recurrent = memory > 0

        def __init__(self):
            super().__init__()
            self.net = net
            if encoder is not None:  # the observation's maps through a CNN (metadata map)
                self.encoder = encoder
            self.register_buffer("ids", torch.eye(agents), persistent=False)

        def forward(self, obs, avail=None, memory=None):
            x = obs.to(torch.float32)
            x = torch.cat([x, self.ids.expand(*x.shape[:-1], agents)], -1)
            if encoder is not None:
                x = self.encoder(x)
            if self.recurrent:
                lead = x.shape[:-1]
                h = torch.zeros(*lead, net.gru.hidden_size) if memory is None else memory.to(torch.float32)
                logits, h = self.net(x.reshape(-1, x.shape[-1]), h.reshape(-1, h.shape[-1]))
                logits, h = logits.reshape(*lead, actions), h.reshape(*lead, -1)
            else:
                logits = self.net(x)
            if avail is not None:
                logits = logits.masked_fill(avail < 0.5, -1e10)
            u = logits.argmax(-1)
            return (u, h) if self.recurrent else u

    return ComaPolicy()


def _diffusion_policy(torch, tensors, meta, path):
    import math

    F = torch.nn.functional
    od, ad = int(meta["obs_dim"]), int(meta["action_dim"])
    oh, h, ah = int(meta["obs_horizon"]), int(meta["horizon"]), int(meta["action_horizon"])
    widths = [int(w) for w in meta["widths"].split(",")]
    d, kernel, groups = int(meta["step_embed"]), int(meta["kernel"]), int(meta["groups"])
    sampler, objective = meta["sampler"], meta["objective"]
    train_steps, inference = int(meta["train_steps"]), int(meta["inference_steps"])
    eta, clip = float(meta["ddim_eta"]), meta["clip_sample"] == "1"
    alpha_bars = [float(x) for x in np.asarray(tensors["schedule.alpha_bars"], np.float64)]
    if len(alpha_bars) != train_steps:
        raise ValueError(f"{path}: the schedule has {len(alpha_bars)} steps, the metadata says {train_steps}")
    if sampler == "ddpm":
        steps = list(range(train_steps - 1, -1, -1))
    else:
        c = train_steps // inference
        steps = [i * c for i in range(inference - 1, -1, -1)]
    encoder = None
    if "encoder" in meta:  # image observations: each step's images cropped and encoded
        encoder = _obs_encoder(torch, meta, path)
        step_parts, step_row = _layout({"layout": meta["step_layout"]}, path)
        crop = int(meta["crop"])
        cond_dim = d + oh * encoder.output_size
    else:
        cond_dim = d + oh * od

    class ConvBlock(torch.nn.Module):  # Conv1d (same padding) -> GroupNorm -> Mish
        def __init__(self, i, o):
            super().__init__()
            self.conv = torch.nn.Conv1d(i, o, kernel, padding=kernel // 2)
            self.norm = torch.nn.GroupNorm(groups, o)

        def forward(self, x):
            return F.mish(self.norm(self.conv(x)))

    class FilmBlock(torch.nn.Module):  # two conv blocks, FiLM between, a residual
        def __init__(self, i, o):
            super().__init__()
            self.block0, self.block1 = ConvBlock(i, o), ConvBlock(o, o)
            self.film = torch.nn.Linear(cond_dim, 2 * o)
            self.residual = torch.nn.Conv1d(i, o, 1) if i != o else None
            self.o = o

        def forward(self, x, cond):
            y = self.block0(x)
            sb = self.film(F.mish(cond)).view(-1, 2, self.o, 1)
            y = self.block1(sb[:, 0] * y + sb[:, 1])
            return y + (self.residual(x) if self.residual is not None else x)

    class Unet(torch.nn.Module):
        """anvil's nn::Unet1d (Diffusion Policy's temporal U-Net with FiLM), the same names."""

        def __init__(self):
            super().__init__()
            self.step0, self.step1 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
            self.down, self.mid, self.up = torch.nn.ModuleList(), torch.nn.ModuleList(), torch.nn.ModuleList()
            i = ad
            for level, w in enumerate(widths):
                self.down.extend([FilmBlock(i, w), FilmBlock(w, w)])
                if level + 1 < len(widths):
                    self.down.append(torch.nn.Conv1d(w, w, 3, stride=2, padding=1))
                i = w
            self.mid.extend([FilmBlock(widths[-1], widths[-1]), FilmBlock(widths[-1], widths[-1])])
            for j in range(len(widths) - 1, 0, -1):
                self.up.extend([FilmBlock(2 * widths[j], widths[j - 1]), FilmBlock(widths[j - 1], widths[j - 1]),
                                torch.nn.ConvTranspose1d(widths[j - 1], widths[j - 1], 4, stride=2, padding=1)])
            self.out_block = ConvBlock(widths[0], widths[0])
            self.out_conv = torch.nn.Conv1d(widths[0], ad, 1)

        def forward(self, x, k, obs):
            half = d // 2
            freq = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000.0) / max(half - 1, 1)))
            arg = k.to(torch.float32).unsqueeze(-1) * freq.unsqueeze(0)
            e = self.step1(F.mish(self.step0(torch.cat([arg.sin(), arg.cos()], -1))))
            cond = torch.cat([e, obs], -1)
            y, skips, levels = x.transpose(1, 2), [], len(widths)
            n = 0
            for level in range(levels):
                y = self.down[n](y, cond)
                y = self.down[n + 1](y, cond)
                skips.append(y)
                n += 2
                if level + 1 < levels:
                    y = self.down[n](y)
                    n += 1
            for m in self.mid:
                y = m(y, cond)
            for u in range(levels - 1):
                y = torch.cat([y, skips[levels - 1 - u]], 1)
                y = self.up[3 * u](y, cond)
                y = self.up[3 * u + 1](y, cond)
                y = self.up[3 * u + 2](y)
            return self.out_conv(self.out_block(y)).transpose(1, 2)

    def ab(t):
        return 1.0 if t < 0 else alpha_bars[t]

    class DiffusionPolicyModule(torch.nn.Module):
        """anvil's Diffusion Policy acting: `forward(obs, noise=None, step_noise=None)` takes the
        last obs_horizon observations [N, obs_horizon * obs_dim] as the env gives them and
        returns the executed chunk [N, action_horizon * action_dim] in the env's units, from
        the sampler's loop (DDIM or DDPM, as the run's metadata says) started at `noise`
        [N, horizon, action_dim] (default: standard normal) with `step_noise` [steps, N,
        horizon, action_dim] for a stochastic sampler's steps."""

        def __init__(self):
            super().__init__()
            self.net = Unet()
            if encoder is not None:
                self.encoder = encoder
            self.norm, self.schedule = torch.nn.Module(), torch.nn.Module()
            for name, size in (("obs_scale", od), ("obs_offset", od), ("action_scale", ad), ("action_offset", ad)):
                self.norm.register_buffer(name, torch.zeros(size))
            self.schedule.register_buffer("alpha_bars", torch.zeros(train_steps, dtype=torch.float64))
            for name in ("chunk_low", "chunk_high"):
                self.register_buffer(name, torch.zeros(ad))
            for name in ("action_scale", "action_offset", "action_low", "action_high"):
                self.register_buffer(name, torch.zeros(ah * ad))
            self.steps = steps

        def condition(self, obs):
            n = obs.shape[0]
            if encoder is None:
                return (obs.to(torch.float32).view(n, oh, od) * self.norm.obs_scale + self.norm.obs_offset).reshape(n, -1)
            # rows of parts [N, obs_horizon * row_bytes] (uint8): per step, the images
            # centre-cropped, encoded; the float parts min-max scaled after the encoder
            if obs.dtype != torch.uint8 or obs.shape[-1] != oh * step_row:
                raise ValueError(f"observations of {meta['step_layout']} per step come as uint8 rows [N, {oh * step_row}]; "
                                 f"got {tuple(obs.shape)} {obs.dtype}")
            rows, parts, scale, offset, k = obs.reshape(n * oh, step_row), {}, [], [], 0
            for name, dtype, shape, off in step_parts:
                size = int(np.prod(shape)) * (1 if dtype == "uint8" else 4)
                piece = rows[:, off:off + size].contiguous()
                if dtype == "uint8":
                    x = piece.view(-1, *shape)
                    if crop:
                        top, left = (shape[1] - crop) // 2, (shape[2] - crop) // 2
                        x = x[:, :, top:top + crop, left:left + crop]
                    parts[name] = x
                    scale.append(torch.ones(int(meta["encoder_features"])))
                    offset.append(torch.zeros(scale[-1].shape))
                else:
                    m = int(np.prod(shape))
                    parts[name] = piece.view(torch.float32)
                    scale.append(self.norm.obs_scale[k:k + m])
                    offset.append(self.norm.obs_offset[k:k + m])
                    k += m
            f = self.encoder(parts)
            return (f * torch.cat(scale) + torch.cat(offset)).reshape(n, -1)

        def forward(self, obs, noise=None, step_noise=None):
            n = obs.shape[0]
            cond = self.condition(obs)
            if objective == "mse":
                x = self.net(torch.zeros(n, h, ad), torch.zeros(n, dtype=torch.long), cond)
            else:
                x = torch.randn(n, h, ad) if noise is None else noise.to(torch.float32)
                for i, t in enumerate(self.steps):
                    prev = self.steps[i + 1] if i + 1 < len(self.steps) else -1
                    eps = self.net(x, torch.full((n,), t, dtype=torch.long), cond).to(torch.float32)
                    z = step_noise[i] if step_noise is not None else None
                    a, a_prev = ab(t), ab(t - 1 if sampler == "ddpm" else prev)
                    x0 = (x - math.sqrt(1.0 - a) * eps) / math.sqrt(a)
                    if clip:
                        x0 = x0.clamp(-1.0, 1.0)
                    if sampler == "ddpm":
                        a_t = a / a_prev
                        b_t = 1.0 - a_t
                        x = math.sqrt(a_prev) * b_t / (1.0 - a) * x0 + math.sqrt(a_t) * (1.0 - a_prev) / (1.0 - a) * x
                        if t > 0 and z is not None:
                            x = x + math.sqrt(max((1.0 - a_prev) / (1.0 - a) * b_t, 1e-20)) * z
                    else:
                        e = (x - math.sqrt(a) * x0) / math.sqrt(1.0 - a) if clip else eps
                        var = eta * eta * (1.0 - a_prev) / (1.0 - a) * (1.0 - a / a_prev)
                        x = math.sqrt(a_prev) * x0 + math.sqrt(max(1.0 - a_prev - var, 0.0)) * e
                        if var > 0 and z is not None:
                            x = x + math.sqrt(var) * z
            seq = (x.to(torch.float32) - self.norm.action_offset) / self.norm.action_scale
            chunk = seq[:, oh - 1:oh - 1 + ah]
            unit = ((chunk - self.chunk_low) / (self.chunk_high - self.chunk_low) * 2.0 - 1.0).reshape(n, -1)
            return torch.maximum(torch.minimum(unit, self.action_high), self.action_low) * self.action_scale + self.action_offset

    return DiffusionPolicyModule()


def _collective(torch, tensors, meta, path):
    import math

    F = torch.nn.functional
    od, ad, h = int(meta["obs_dim"]), int(meta["action_dim"]), int(meta["history"])
    d, heads, layers, ff = (int(meta[k]) for k in ("d_model", "heads", "layers", "feedforward"))
    hidden = [int(x) for x in meta["hidden"].split(",") if x]
    act = _activation_of(torch, meta, path)
    td, dh = od + ad + 1, d // heads
    normalised = "norm.obs_shift" in tensors

    class Collective(torch.nn.Module):
        """anvil's nn::CollectiveTransformer: a pre-norm Transformer encoder over the history's
        tokens behind a learned summary token, and the policy and twin Q heads."""

        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Linear(td, d)
            self.position = torch.nn.Parameter(torch.zeros(h + 1, d))
            self.summary = torch.nn.Parameter(torch.zeros(1, 1, d))
            for i in range(layers):
                for name, m in (("norm1", torch.nn.LayerNorm(d)), ("qkv", torch.nn.Linear(d, 3 * d)),
                                ("out", torch.nn.Linear(d, d)), ("norm2", torch.nn.LayerNorm(d)),
                                ("ff1", torch.nn.Linear(d, ff)), ("ff2", torch.nn.Linear(ff, d))):
                    self.add_module(f"block{i}_{name}", m)
            self.final_norm = torch.nn.LayerNorm(d)
            self.policy = _mlp(torch, [d + od, *hidden, 2 * ad], act)
            self.q1 = _mlp(torch, [d + od + ad, *hidden, 1], act)
            self.q2 = _mlp(torch, [d + od + ad, *hidden, 1], act)

        def represent(self, tokens, mask, normalise):
            b = tokens.shape[0]
            t = torch.cat([normalise(tokens[..., :od]), tokens[..., od:]], -1)
            x = torch.cat([self.summary.expand(b, 1, d), self.embed(t)], 1) + self.position
            keep = torch.cat([torch.ones(b, 1), mask], 1).to(torch.float32)
            bias = ((1.0 - keep) * -1e9).view(b, 1, 1, h + 1)
            scale = 1.0 / math.sqrt(dh)
            for i in range(layers):
                blk = lambda name: getattr(self, f"block{i}_{name}")  # noqa: E731
                qkv = blk("qkv")(blk("norm1")(x)).view(b, h + 1, 3, heads, dh).permute(2, 0, 3, 1, 4)
                att = (torch.matmul(qkv[0], qkv[1].transpose(-2, -1)) * scale + bias).softmax(-1)
                y = torch.matmul(att, qkv[2]).permute(0, 2, 1, 3).reshape(b, h + 1, d)
                x = x + blk("out")(y)
                x = x + blk("ff2")(F.gelu(blk("ff1")(blk("norm2")(x))))
            return self.final_norm(x[:, 0])

    class CollectivePolicy(torch.nn.Module):
        """anvil's collective acting deterministically: `forward(obs)` takes observations as the
        env wrapped in envs::History gives them ([N, history x (obs_dim + action_dim + 1)
        tokens, history validity flags, state]) and returns tanh(mean) in the env's units."""

        def __init__(self):
            super().__init__()
            self.net = Collective()
            self.norm = torch.nn.Module()
            if normalised:
                self.norm.register_buffer("obs_shift", torch.zeros(od))
                self.norm.register_buffer("obs_scale", torch.ones(od))
            self.register_buffer("action_scale", torch.zeros(ad))
            self.register_buffer("action_offset", torch.zeros(ad))

        def _normalise(self, s):
            return (s - self.norm.obs_shift) * self.norm.obs_scale if normalised else s

        def forward(self, obs):
            x = obs.to(torch.float32)
            n = x.shape[0]
            tokens = x[:, :h * td].reshape(n, h, td)
            mask = x[:, h * td:h * td + h]
            state = x[:, h * td + h:h * td + h + od]
            rep = self.net.represent(tokens, mask, self._normalise)
            mean = self.net.policy(torch.cat([rep, self._normalise(state)], -1))[..., :ad]
            return torch.tanh(mean) * self.action_scale + self.action_offset

    return CollectivePolicy()


# Discrete SAC's actor is an MLP to one logit per action, acting by the most likely one: PPO's
# discrete actor in shape and in how it acts.
_KINDS = {"GaussianActor": _gaussian_actor, "PpoActor": _ppo_actor, "DiscreteSacActor": _ppo_actor,
          "RecurrentPpoActor": _recurrent_ppo_actor, "ComaActor": _coma_actor,
          "DiffusionPolicy": _diffusion_policy, "CollectiveTransformer": _collective}


def load_policy(path):
    """The policy a run wrote (its policy.safetensors) as a torch.nn.Module in eval mode whose
    forward gives the deterministic action in the env's units: SAC, multi-task SAC and PPO
    policies take observations [..., obs_dim] (a recurrent PPO actor also its memory); a COMA
    actor takes each agent's observation
    (and available actions, and a recurrent actor's memory). `module.metadata` names the env,
    the kind and the architecture."""
    torch = _torch()
    tensors, meta = safetensors.load(path)
    if meta.get("format") != "anvil policy 1":
        raise ValueError(f"{path}: not an anvil policy (metadata format is {meta.get('format')!r})")
    build = _KINDS.get(meta.get("kind"))
    if build is None:
        raise ValueError(f"{path}: policy kind {meta.get('kind')!r} is not one this anvil loads "
                         f"({', '.join(_KINDS)})")
    module = build(torch, tensors, meta, path)
    state = {k: torch.from_numpy(np.array(v, np.float64 if np.asarray(v).dtype == np.float64 else np.float32))
             for k, v in tensors.items()}
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{path}: tensors missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    module.metadata = dict(meta)
    return module.eval()
