"""anvil.load_policy(POLICY) against a C++ policy: CASES (safetensors a C++ test wrote) holds
the inputs and the actions the C++ policy took; the torch module acts on the same inputs.
Prints one JSON line; exits 1 when an action differs by more than 1e-5 times the largest
action's size (at least 1e-5: float rounding, in the env's units, so a bound of 2 allows 2e-5;
discrete ones at all) or the module's parameter names are not the file's.

    policy_check.py POLICY CASES"""

import json
import sys

import numpy as np
import torch

import anvil

policy, cases = sys.argv[1:3]
module = anvil.load_policy(policy)
file_names = set(anvil.safetensors.load(policy)[0])
if set(module.state_dict()) != file_names:
    sys.exit(f"the module's names {sorted(module.state_dict())} are not the file's {sorted(file_names)}")
t = {k: torch.from_numpy(np.array(v)) for k, v in anvil.safetensors.load(cases)[0].items()}
kind = module.metadata["kind"]
with torch.no_grad():
    if kind == "ComaActor" and module.recurrent:
        # obs [T, N, k, od], avail [T, N, k, n], first [T, N]: one step of N envs at a time
        memory, steps = None, []
        for s in range(t["obs"].shape[0]):
            if memory is not None:
                memory = memory * (1 - t["first"][s].to(torch.float32))[:, None, None]
            u, memory = module(t["obs"][s], t["avail"][s], memory)
            steps.append(u)
        ours = torch.stack(steps)
    elif kind == "RecurrentPpoActor":
        # obs [T, N, od], first [T, N]: one step of N envs at a time, as the C++ policy acted
        memory, steps = None, []
        for s in range(t["obs"].shape[0]):
            if memory is not None:
                memory = memory * (1 - t["first"][s].to(torch.float32))[:, None]
            u, memory = module(t["obs"][s], memory)
            steps.append(u)
        ours = torch.stack(steps)
    elif kind == "ComaActor":
        ours = module(t["obs"], t["avail"])
    elif kind == "DiffusionPolicy":  # the same noise as the C++ sampler drew
        ours = module(t["obs"], t["noise"], t["step_noise"])
    else:
        ours = module(t["obs"])
cxx = t["action"]
if ours.shape != cxx.shape:
    sys.exit(f"{kind}: the module's actions have shape {tuple(ours.shape)}, the C++ policy's {tuple(cxx.shape)}")
exact = not ours.is_floating_point()
diff = float((ours.to(torch.float64) - cxx.to(torch.float64)).abs().max())
print(json.dumps({"kind": kind, "actions": int(cxx.numel()), "max_abs_diff": diff,
                  "largest_action": float(cxx.to(torch.float64).abs().max())}))
scale = max(1.0, float(cxx.to(torch.float64).abs().max())) if cxx.numel() else 1.0
sys.exit(1 if diff > (0 if exact else 1e-5 * scale) else 0)
