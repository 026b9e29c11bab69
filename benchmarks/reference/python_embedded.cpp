// The Python interpreter as bench_python_envs holds it: Python's own archive linked into the
// program (CMake's anvil_python_in_program, as the mains that take --env.id are linked) where
// the build found it, else as the bridge embeds it (the PIC archive or the shared libpython).
// bench_python_envs runs the bare-loop reference under it and under the python3 program, to
// tell the bridge's own cost from the interpreter's.
#include <Python.h>

int main(int argc, char** argv) { return Py_BytesMain(argc, argv); }
