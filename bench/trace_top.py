"""Prints the total, the time by kernel and the slowest dispatches of a Chrome trace written by
--trace (`meganeura train --trace`, `meganeura bench workloads --trace`).

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
by_kernel = collections.defaultdict(lambda: [0, 0.0])
for event in events:
    kernel = event.get("args", {}).get("kernel") or event["name"].split()[0]
    by_kernel[kernel][0] += 1
    by_kernel[kernel][1] += event["dur"]
print("by kernel:")
for kernel, (n, us) in sorted(by_kernel.items(), key=lambda item: -item[1][1])[:count]:
    print(f"{us:10.1f} us {100 * us / max(total, 1e-9):5.1f} %  {n:4d} x  {kernel}")
print("slowest dispatches:")
for event in sorted(events, key=lambda e: -e["dur"])[:count]:
    print(f"{event['dur']:10.1f} us  {event['name']}")
