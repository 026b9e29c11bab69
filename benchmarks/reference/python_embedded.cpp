// The Python interpreter as anvil's bridge embeds it: libpython (the shared library), not the
// python3 program (which Debian links statically). bench_python_envs runs the bare-loop
// reference under both, to tell the bridge's own cost from the shared library's.
#include <Python.h>

int main(int argc, char** argv) { return Py_BytesMain(argc, argv); }
