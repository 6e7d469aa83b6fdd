#!/usr/bin/env python3
"""The session example's input and its expected output, computed without the operator.

  python3 model.py gen    # writes input.jsonl (deterministic)
  python3 model.py        # writes expected.jsonl from input.jsonl

A session of a user is a maximal run of their clicks, sorted by time, in which consecutive
clicks are less than GAP apart; it is emitted as {"key","start","end","count"} with end = the
last click + GAP. The input is out of order by at most 4 s (the spec allows 5 s), so no click
is late and arrival order does not matter."""
import json, random, sys

GAP = 30_000

def gen():
    rng = random.Random(7)
    rows = []
    for u in ["ann", "bob", "cho", "dee", "eve", "fay"]:
        t = -45_000 + rng.randrange(0, 20_000)   # some sessions start before the epoch
        for _ in range(rng.randrange(30, 70)):
            rows.append((t, u))
            # mostly short gaps, sometimes exactly GAP (a new session), sometimes long
            r = rng.random()
            t += GAP if r < 0.05 else (GAP - 1 if r < 0.1 else (rng.randrange(GAP, 4 * GAP) if r < 0.3 else rng.randrange(0, 15_000)))
    rows.sort()
    # jitter: swap neighbours up to 4 s apart, so the file is out of order within the bound
    for i in range(len(rows) - 1):
        if rng.random() < 0.3 and rows[i + 1][0] - rows[i][0] <= 4_000:
            rows[i], rows[i + 1] = rows[i + 1], rows[i]
    with open("input.jsonl", "w") as f:
        for i, (t, u) in enumerate(rows):
            f.write(json.dumps({"user": u, "ts": t, "page": "/p%d" % (i % 7)}, separators=(",", ":")) + "\n")

def model():
    per = {}
    for line in open("input.jsonl"):
        r = json.loads(line)
        per.setdefault(r["user"], []).append(r["ts"])
    out = []
    for u, ts in per.items():
        ts.sort()
        start = prev = ts[0]; n = 1
        for t in ts[1:]:
            if t - prev >= GAP:
                out.append({"key": u, "start": start, "end": prev + GAP, "count": n})
                start, n = t, 0
            prev = t; n += 1
        out.append({"key": u, "start": start, "end": prev + GAP, "count": n})
    out.sort(key=lambda o: (o["key"], o["start"]))
    with open("expected.jsonl", "w") as f:
        for o in out:
            f.write(json.dumps(o, separators=(",", ":")) + "\n")

if __name__ == "__main__":
    gen() if sys.argv[1:] == ["gen"] else model()
