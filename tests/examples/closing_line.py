"""closing_line.py SUMMARY_JSON LOG: the run's closing line ("done: ... eval return X (best Y)")
shows summary.json's final and best evaluation returns at their own scale (within 1%, so
with three significant digits or more: a Push-T score of 0.0129 is not "0.0")."""
import json
import re
import sys

summary = json.load(open(sys.argv[1]))
lines = [l for l in open(sys.argv[2]) if l.startswith("done:")]
if not lines:
    sys.exit("no closing 'done:' line in " + sys.argv[2])
m = re.search(r"eval return (\S+) \(best (\S+)\)", lines[-1])
if not m:
    sys.exit("the closing line names no eval return: " + lines[-1])
for shown, key in zip(m.groups(), ("final_eval_return", "best_eval_return")):
    true = summary[key]
    if true is None:
        continue
    if abs(float(shown) - true) > max(0.01 * abs(true), 1e-9):
        sys.exit(f"the closing line shows {key} as {shown}; summary.json says {true}")
print("closing line at the metric's scale:", lines[-1].strip())
