#!/usr/bin/env python3
"""Checks that anvil's headers include only from their own layer or the layers below.

The layers, bottom up (docs/design.md, "Layers and layout"):

  0 core          spaces, config, state protocol, errors, seeding, ...
  1 optim nn envs precision observe parallel
  2 buffers data
  3 algorithms
  4 train/loops, train/clock.hpp, train/run_config.hpp, train/init_config.hpp
  5 train/hooks
  6 train/run.hpp, train/trainer.hpp, train/start.hpp, train/signals.hpp, train/sweep.hpp,
    train/trainer_config.hpp, train/compiled_trainer.hpp, train/compiled_trainer_impl.hpp,
    train/trainer_select.hpp, train/run_envs.hpp, train/process_settings.hpp, train/trainer_parts.hpp
  7 anvil.hpp (the umbrella header), compiled.hpp (a main's header on prebuilt Trainers)

Every header also begins with `#pragma once`.

Usage: scripts/check_layers.py [--include DIR]   (exit 1 naming each include that goes up)
"""
import argparse
import pathlib
import re
import sys

LAYERS = [
    ("core/", 0),
    ("optim/", 1), ("nn/", 1), ("envs/", 1), ("precision/", 1), ("observe/", 1), ("parallel/", 1),
    ("buffers/", 2), ("data/", 2),
    ("algorithms/", 3),
    ("train/loops/", 4), ("train/clock.hpp", 4), ("train/run_config.hpp", 4), ("train/init_config.hpp", 4),
    ("train/hooks/", 5),
    ("train/run.hpp", 6), ("train/trainer.hpp", 6), ("train/start.hpp", 6), ("train/signals.hpp", 6),
    ("train/sweep.hpp", 6), ("train/trainer_config.hpp", 6), ("train/compiled_trainer.hpp", 6),
    ("train/compiled_trainer_impl.hpp", 6), ("train/trainer_select.hpp", 6), ("train/run_envs.hpp", 6),
    ("train/process_settings.hpp", 6), ("train/trainer_parts.hpp", 6),
    ("anvil.hpp", 7), ("compiled.hpp", 7),
]
NAMES = {0: "core", 1: "optim/nn/envs/precision/observe/parallel", 2: "buffers/data", 3: "algorithms",
         4: "train/loops", 5: "train/hooks", 6: "train (trainer, run, start)", 7: "the umbrella header"}


def layer_of(rel):
    """The layer of a header given by its path under include/anvil/, or None."""
    best = None
    for prefix, layer in LAYERS:
        if rel == prefix or rel.startswith(prefix):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, layer)
    return None if best is None else best[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--include", default=str(pathlib.Path(__file__).resolve().parent.parent / "include"))
    args = ap.parse_args()
    root = pathlib.Path(args.include) / "anvil"
    include = re.compile(r'^\s*#\s*include\s*<anvil/([^>]+)>', re.M)
    problems, unknown, checked = [], [], 0
    for header in sorted(root.rglob("*.hpp")):
        rel = header.relative_to(root).as_posix()
        mine = layer_of(rel)
        if mine is None:
            unknown.append(rel)
            continue
        checked += 1
        if not header.read_text().startswith("#pragma once\n"):
            problems.append(f"include/anvil/{rel}:1: does not begin with #pragma once (a header includes "
                            f"cleanly twice; the self-sufficiency check relies on it)")
        for m in include.finditer(header.read_text()):
            target = m.group(1)
            theirs = layer_of(target)
            if theirs is None:
                unknown.append(f"{target} (included by {rel})")
            elif theirs > mine:
                line = header.read_text()[: m.start()].count("\n") + 1
                problems.append(f"include/anvil/{rel}:{line}: includes <anvil/{target}>, a layer above it "
                                f"({NAMES[theirs]} is above {NAMES[mine]})")
    for u in unknown:
        problems.append(f"{u}: in no layer; add its directory to scripts/check_layers.py")
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"check_layers: {checked} headers include only their own layer or those below")
    return 0


if __name__ == "__main__":
    sys.exit(main())
