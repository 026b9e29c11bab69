#!/usr/bin/env python3
"""The C++ snippets of anvil's docs (README.md and docs/*.md, ```cpp blocks) as one
translation unit (and each whole program as its own), so a test compiles every one as
written: `doc_snippets.py --out-dir DIR` writes them (CMake does, at configure time;
tests/CMakeLists.txt builds them).

A snippet is a fragment of a program, so each has a context below, keyed by its page and
first line: where it goes (inside a function that has `argc` and `argv`, at namespace
scope, inside a struct, or a whole program), the lines a reader would have written before
it (the `cfg` it uses, the env type it names), and checks after it of what the page says
of it (that a type is an env, that a Trainer type is well-formed). A snippet with no
context is an error that the test reports (the generated file says `#error`): a new snippet
must be given one here, and so is compiled from the day it is written.
"""
import argparse
import pathlib
import re
import sys

from doc_blocks import code_blocks, doc_pages

# (page, first line) -> (where, before, after). where: "function" (statements), "namespace"
# (declarations), "struct" (members), "main" (a whole program, in a file of its own).
CONTEXTS = {
    ("README.md", "using Trainer = anvil::Trainer<anvil::SAC, anvil::UniformBuffer>;"): ("function", "", ""),
    ("docs/loops.md", "// Learn from a dataset first, then go on online with the dataset in the replay buffer."):
        ("namespace", "", "[[maybe_unused]] inline T::Config config{};  // the Trainer type is well-formed"),
    ("docs/configuration.md", 'Param<int, "batch_size", "transitions per gradient update", at_least(1)> batch_size{256};'):
        ("struct", "", ""),
    ("docs/getting-started.md", "#include <anvil/compiled.hpp>"): ("main", "", ""),
    ("docs/getting-started.md", "Trainer trainer(MyEnv{}, anvil::start<Trainer>(argc, argv));"):
        ("function", "using Trainer = anvil::compiled::Trainer<anvil::SAC, anvil::UniformBuffer>;\n"
                     "using MyEnv = anvil::envs::Pendulum;  // the page's env, written in its file", ""),
    ("docs/pixels.md", "struct MyCamera {"):
        ("namespace", "", "static_assert(anvil::envs::Env<MyCamera> && anvil::envs::ByteObservations<MyCamera>);"),
    ("docs/pixels.md", "anvil::DemoReadOptions o;"): ("function", "#hdf5", ""),
    ("docs/ppo.md", "anvil::Trainer<anvil::PPO, anvil::RolloutBuffer> trainer(anvil::envs::CartPole{}, cfg);"):
        ("function", "const auto cfg = anvil::start<anvil::Trainer<anvil::PPO, anvil::RolloutBuffer>>(argc, argv);", ""),
    ("docs/sac.md", "anvil::Trainer<anvil::SAC, anvil::PrioritizedBuffer> trainer(anvil::envs::Pendulum{}, cfg);"):
        ("function", "const auto cfg = anvil::start<anvil::Trainer<anvil::SAC, anvil::PrioritizedBuffer>>(argc, argv);", ""),
    ("docs/sac.md", "anvil::Trainer<anvil::DiscreteSAC, anvil::PrioritizedBuffer> trainer(anvil::envs::CartPole{}, cfg);"):
        ("function", "const auto cfg = anvil::start<anvil::Trainer<anvil::DiscreteSAC, anvil::PrioritizedBuffer>>(argc, argv);", ""),
    ("docs/ppo.md", "anvil::Trainer<anvil::RecurrentPPO, anvil::RolloutBuffer> trainer(anvil::envs::CartPoleNoVel{}, cfg);"):
        ("function", "const auto cfg = anvil::start<anvil::Trainer<anvil::RecurrentPPO, anvil::RolloutBuffer>>(argc, argv);", ""),
}


def snippets(root):
    for page in doc_pages(root):
        for start, lines in code_blocks(page, "cpp"):
            yield page.relative_to(root).as_posix(), start, lines


def units(root):
    """{file name: text}: snippets.cpp with every fragment, and main_<k>.cpp per whole program."""
    includes = {"#include <anvil/anvil.hpp>", "#include <anvil/compiled.hpp>"}
    body, files, faults = [], {}, []
    for k, (page, line, lines) in enumerate(snippets(root)):
        key = (page, lines[0] if lines else "")
        if key not in CONTEXTS:
            faults.append(f"{page}:{line}: a C++ snippet with no context in scripts/doc_snippets.py "
                          f"(first line: {key[1]!r}); add one so that it is compiled")
            continue
        where, before, after = CONTEXTS[key]
        hdf5 = before == "#hdf5"
        before = "" if hdf5 else before
        tag = f"// {page}:{line}"
        if where == "main":
            files[f"main_{k}.cpp"] = "\n".join([tag, *lines]) + "\n"
            continue
        code = [ln for ln in lines if not ln.startswith("#include")]
        includes.update(ln.strip() for ln in lines if ln.startswith("#include"))
        name = f"snippet_{k}"
        out = [tag] + (["#ifdef ANVIL_WITH_HDF5"] if hdf5 else [])
        if where == "function":
            out += [f"[[maybe_unused]] void {name}(int argc, char** argv) {{", before, *code, after, "}"]
        elif where == "namespace":
            out += [f"namespace {name} {{", before, *code, after, "}"]
        elif where == "struct":
            out += [f"namespace {name} {{", "using namespace anvil;", "struct Section {", before, *code, "};", after, "}"]
        out += ["#endif"] if hdf5 else []
        body += out + [""]
    head = ["// Generated by scripts/doc_snippets.py from the docs' C++ snippets: do not edit."]
    head += [f'#error "{f}"' for f in faults]
    files["snippets.cpp"] = "\n".join([*head, *sorted(includes), "#ifdef ANVIL_WITH_HDF5",
                                       "#include <anvil/data/demonstrations.hpp>", "#endif", "", *body]) + "\n"
    return files, faults


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent))
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args()
    files, faults = units(pathlib.Path(args.root).resolve())
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.cpp"):
        if old.name not in files:
            old.unlink()
    for name, text in files.items():  # rewritten only when changed, so a rebuild compiles only what changed
        if not (out / name).exists() or (out / name).read_text() != text:
            (out / name).write_text(text)
    for f in faults:
        print(f, file=sys.stderr)
    return 0  # a fault is an #error in snippets.cpp: the test that compiles it fails naming it


if __name__ == "__main__":
    sys.exit(main())
