"""Joins the JSON lines of `meganeura bench kernels` and bench/kernels_pytorch.py into one table
with the ratio ours / PyTorch (time ratio: below 1 means Meganeura is faster)."""
import json
import sys


def load(path):
    rows = {}
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            record = json.loads(line)
            rows[record["case"]] = record
    return rows


ours, theirs = load(sys.argv[1]), load(sys.argv[2])
print(f"{'case':34} {'meganeura ms':>12} {'pytorch ms':>11} {'ratio':>7} {'ours rate':>12}")
for name, record in ours.items():
    other = theirs.get(name)
    rate = f"{record['gflops']:.0f} GFLOP/s" if "gflops" in record else f"{record['gbps']:.0f} GB/s"
    if other:
        print(f"{name:34} {record['ms']:12.4f} {other['ms']:11.4f} {record['ms'] / other['ms']:7.2f} {rate:>12}")
    else:
        print(f"{name:34} {record['ms']:12.4f} {'-':>11} {'-':>7} {rate:>12}")
