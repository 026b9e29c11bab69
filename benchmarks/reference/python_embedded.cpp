// The Python interpreter as anvil's bridge embeds it (linked as the bridge links it: the
// interpreter's PIC archive where the build found one, else the shared libpython), not the
// python3 program (which Debian links from its own, profile-guided build). bench_python_envs
// runs the bare-loop reference under both, to tell the bridge's own cost from the interpreter's.
#include <Python.h>

int main(int argc, char** argv) { return Py_BytesMain(argc, argv); }
