"""Where a program's wall-clock time goes, epoch by epoch, from the serialized Chrome trace and the
dispatch list that `--trace` writes beside it (`meganeura bench workloads --trace DIR`).

A traced run makes every dispatch wait for the one before, so the trace's total is the sum of all
dispatches; an untraced run overlaps the dispatches between two barriers. This models each
barrier-separated epoch (a line of the dispatch list starting with '*' opens one) as taking its
longest dispatch, and sums those epochs by the kernel of that longest dispatch (products by their
label, so that a product with an epilogue shows apart). The model leaves out each barrier's own
cost, so it reads somewhat under the measured step time.

With --grids it lists instead each kernel and grid's dispatches (count, median, shortest and
longest, total): the products of one shape apart from the others, whose times a whole-program
trace gives in place, epilogues and all, unlike a kernel benchmark's standalone cells.

usage: python3 bench/trace_epochs.py TRACE.json DISPATCHES.txt [N] [--grids]"""
import collections
import json
import re
import sys

grids = "--grids" in sys.argv[1:]
arguments = [argument for argument in sys.argv[1:] if argument != "--grids"]
if len(arguments) < 2:
    sys.exit(__doc__)
events = json.load(open(arguments[0]))
events = events["traceEvents"] if isinstance(events, dict) else events
events = [e for e in events if "dur" in e]
count = int(arguments[2]) if len(arguments) > 2 else 25
# The dispatch list: "  index [*]kernel  grid  label" a line under a heading; where the program
# has a setup, its dispatches come first under their own heading and the run's follow under
# "every run:", which is what the trace holds.
text = open(arguments[1]).read()
if "\nevery run:\n" in text:
    text = text.split("\nevery run:\n", 1)[1]
lines = [line for line in text.splitlines() if line.strip() and line.split()[0].isdigit()]
if len(lines) != len(events):
    sys.exit(f"{arguments[1]} lists {len(lines)} dispatches, {arguments[0]} holds {len(events)}: "
             "pass the dispatch list written beside that trace")

if grids:
    by_grid = collections.defaultdict(list)
    for line, event in zip(lines, events):
        kernel, grid = line.split()[1:3]
        by_grid[(kernel.lstrip("*"), grid)].append(event["dur"])
    print("  total us  count  median     min     max  kernel grid")
    for (kernel, grid), durations in sorted(by_grid.items(), key=lambda i: -sum(i[1]))[:count]:
        durations.sort()
        print(f"{sum(durations):10.1f} {len(durations):6d} {durations[len(durations) // 2]:7.1f} "
              f"{durations[0]:7.1f} {durations[-1]:7.1f}  {kernel} {grid}")
    sys.exit(0)

epochs = []
for line, event in zip(lines, events):
    kernel = line.split()[1]
    if kernel.startswith("*") or not epochs:
        epochs.append([])
    epochs[-1].append((event["dur"], kernel.lstrip("*"), event["name"]))

modelled = sum(max(dispatch[0] for dispatch in epoch) for epoch in epochs)
print(f"{len(epochs)} epochs, modelled {modelled:.0f} us "
      f"(dispatches one after another: {sum(e['dur'] for e in events):.0f} us)")
by_kernel = collections.defaultdict(lambda: [0, 0.0])
for epoch in epochs:
    duration, kernel, name = max(epoch)
    if kernel.startswith("gemm"):
        kernel += " " + re.sub(r" ?%\d+", "", name)
    by_kernel[kernel][0] += 1
    by_kernel[kernel][1] += duration
for kernel, (epoch_count, duration) in sorted(by_kernel.items(), key=lambda i: -i[1][1])[:count]:
    print(f"{duration:9.1f} us {100 * duration / max(modelled, 1e-9):5.1f} %  "
          f"{epoch_count:5d} epochs  {kernel}")
