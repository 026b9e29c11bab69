"""What CMake needs to build against the LibTorch inside a PyTorch installation
(cmake/anvil_dependencies.cmake): one `key=value` line each, lists joined with ','.

Reads the installation only (no CUDA call): the machine that builds needs no GPU.
"""
import glob
import os
import sys

try:
    import torch
except ImportError as e:  # the caller tries the next interpreter
    sys.exit(f"no torch: {e}")

root = os.path.dirname(torch.__file__)
cuda = torch.version.cuda or ""
dist = torch.distributed.is_available()


def available(name):
    return int(dist and getattr(torch.distributed, name)())


includes = []
if cuda:
    # CUDA's runtime headers (LibTorch's CUDA headers include them): the toolkit's, else those
    # of the nvidia-* wheels PyTorch installs beside itself.
    homes = [os.environ.get("CUDA_HOME", "/usr/local/cuda"), os.environ.get("CUDA_PATH", "")]
    for home in filter(None, homes):
        if os.path.isfile(os.path.join(home, "include", "cuda_runtime.h")):
            includes.append(os.path.join(home, "include"))
            break
    else:
        wheels = os.path.join(os.path.dirname(root), "nvidia")
        includes = sorted(d for d in glob.glob(os.path.join(wheels, "*", "include")) if os.path.isdir(d))

# CUDA's runtime library, the one PyTorch loads (c10's CUDA headers call it inline).
cudart = ""
if cuda:
    found = sorted(glob.glob(os.path.join(os.path.dirname(root), "nvidia", "*", "lib", "libcudart.so*")))
    found += sorted(glob.glob(os.path.join(root, "lib", "libcudart*.so*")))
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    found += sorted(glob.glob(os.path.join(home, "lib64", "libcudart.so*")))
    cudart = found[0] if found else ""

print(f"dir={root}")
print(f"version={torch.__version__}")
print(f"cuda={cuda}")
print(f"abi={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
print(f"distributed={int(dist)}")
print(f"gloo={available('is_gloo_available')}")
print(f"nccl={available('is_nccl_available')}")
print(f"cuda_includes={','.join(includes)}")
print(f"cudart={cudart}")
