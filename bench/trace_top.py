"""Prints the total, the time by kernel and the slowest dispatches of a Chrome trace written by
--trace (`meganeura train --trace`, `meganeura bench workloads --trace`), with the achieved
bandwidth (GB/s) and rate (TFLOP/s) where the trace holds each dispatch's bytes and FLOPs.

usage: python3 bench/trace_top.py TRACE.json [N]"""
import collections
import json
import sys

events = json.load(open(sys.argv[1]))
events = events["traceEvents"] if isinstance(events, dict) else events
events = [e for e in events if "dur" in e]
count = int(sys.argv[2]) if len(sys.argv) > 2 else 12
total = sum(e["dur"] for e in events)
print(f"{len(events)} dispatches, {total:.1f} us of GPU time")


def rates(us, args):
    """' 1234 GB/s  56.7 TFLOP/s' for a time in us and a dispatch's (or a sum's) bytes and FLOPs."""
    if "bytes" not in args or us <= 0:
        return ""
    return f"  {args['bytes'] / us / 1e3:6.0f} GB/s {args['flops'] / us / 1e6:7.1f} TFLOP/s"


by_kernel = collections.defaultdict(lambda: {"n": 0, "us": 0.0, "bytes": 0.0, "flops": 0.0})
costed = all("bytes" in event.get("args", {}) for event in events)
for event in events:
    kernel = event.get("args", {}).get("kernel") or event["name"].split()[0]
    entry = by_kernel[kernel]
    entry["n"] += 1
    entry["us"] += event["dur"]
    if costed:
        entry["bytes"] += event["args"]["bytes"]
        entry["flops"] += event["args"]["flops"]
print("by kernel:")
for kernel, entry in sorted(by_kernel.items(), key=lambda item: -item[1]["us"])[:count]:
    share = 100 * entry["us"] / max(total, 1e-9)
    print(f"{entry['us']:10.1f} us {share:5.1f} %  {entry['n']:4d} x  {kernel:24s}"
          + (rates(entry["us"], entry) if costed else ""))
print("slowest dispatches:")
for event in sorted(events, key=lambda e: -e["dur"])[:count]:
    print(f"{event['dur']:10.1f} us{rates(event['dur'], event.get('args', {}))}  {event['name']}")
