"""Prints the total and the slowest dispatches of a Chrome trace written by --trace."""
import json
import sys

events = json.load(open(sys.argv[1]))
events = events["traceEvents"] if isinstance(events, dict) else events
events.sort(key=lambda e: -e.get("dur", 0))
print(f"{len(events)} dispatches, {sum(e.get('dur', 0) for e in events):.1f} us of GPU time")
for event in events[: int(sys.argv[2]) if len(sys.argv) > 2 else 12]:
    print(f"{event['dur']:10.1f} us  {event['name']}")
