"""exit_fast_check.py PROGRAM DIR: runs tests/train/exit_fast_program.cpp's program, which
ends with anvil::exit_fast right after an evaluation, and checks that the run's files hold
all it wrote: training.log ends with the evaluation's line, and the TensorBoard events file
is whole records (length, CRC, data, CRC) up to its end, the last of them the evaluation's."""
import glob
import os
import shutil
import struct
import subprocess
import sys

program, run = sys.argv[1], sys.argv[2]
shutil.rmtree(run, ignore_errors=True)
r = subprocess.run([program, run], capture_output=True, text=True)
if r.returncode != 0:
    sys.exit(f"the program exited {r.returncode}: {r.stdout}{r.stderr}")
log = open(os.path.join(run, "training.log")).read()
if "eval at step 400: return" not in log.splitlines()[-1]:
    sys.exit("training.log does not end with the evaluation's line: ..." + log[-300:])
events = glob.glob(os.path.join(run, "events.out.tfevents.*"))
if len(events) != 1:
    sys.exit(f"expected one events file, found {events}")
data = open(events[0], "rb").read()
at, last = 0, b""
while at < len(data):
    if at + 12 > len(data):
        sys.exit(f"the events file ends inside a record header at byte {at} of {len(data)}")
    (n,) = struct.unpack("<Q", data[at:at + 8])
    if at + 12 + n + 4 > len(data):
        sys.exit(f"the events file ends inside a record of {n} bytes at byte {at} of {len(data)}")
    last = data[at + 12:at + 12 + n]
    at += 12 + n + 4
if b"return/eval_max" not in last:
    sys.exit("the last TensorBoard record is not the evaluation's")
shutil.rmtree(run)
print("exit_fast: training.log and the events file hold everything written")
