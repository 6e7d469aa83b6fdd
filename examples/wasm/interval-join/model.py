#!/usr/bin/env python3
"""The interval-join example's input and its expected output, computed without the operator.

  python3 model.py gen    # writes input.jsonl (deterministic)
  python3 model.py        # writes expected.jsonl from input.jsonl

A FULL OUTER join of left (L) and right (R) rows with the same id and
l.ts - B <= r.ts <= l.ts + A: every matching pair, then every row that matched nothing padded
with null. A row whose id is null or missing matches nothing. A row is late when its ts is at
or below the watermark in force when it arrives: with watermark_every 1 that is the largest ts
of the rows before it minus the 5 s bound; late rows are not joined, they go to the late side
output as they came (the sink `late` prints them unchanged)."""
import json, random, sys

A, B, BOUND = 10_000, 5_000, 5_000
MAXI64 = 2**63 - 1

def gen():
    rng = random.Random(12)
    rows = []
    for k in range(40):
        id_ = "o%d" % k
        base = -30_000 + k * 7_000 + rng.randrange(0, 5_000)
        for _ in range(rng.randrange(1, 4)):
            tl = base + rng.randrange(0, 20_000)
            rows.append((tl, "L", id_))
        for _ in range(rng.randrange(0, 4)):
            rows.append((base + rng.randrange(-12_000, 34_000), "R", id_))
    # rows at time <= 0 join like any other
    rows += [(0, "L", "zero"), (-3_000, "R", "zero"), (-20_000, "L", "neg"), (-12_000, "R", "neg")]
    # null and missing join keys never match, on either side
    rows += [(5_000, "L", None), (5_100, "R", None), (6_000, "R", "missing")]
    rows.sort(key=lambda r: r[0])
    for i in range(len(rows) - 1):  # out of order within 3 s, never more
        if rng.random() < 0.3 and rows[i + 1][0] - rows[i][0] <= 3_000:
            rows[i], rows[i + 1] = rows[i + 1], rows[i]
    # late rows: far behind the watermark when they arrive
    for at in (30, 70, 110):
        t = rows[at][0] - 20_000
        rows.insert(at + 1, (t, "L", "o%d" % (at // 10)))
        rows.insert(at + 2, (t + 1_000, "R", "o%d" % (at // 10)))
    # cleanup times saturate: rows at the end of time, joined at the end of input
    rows += [(MAXI64 - 5_807, "L", "end"), (MAXI64 - 807, "R", "end"), (MAXI64 - 100, "L", "end")]
    with open("input.jsonl", "w") as f:
        for n, (t, side, id_) in enumerate(rows):
            r = {"side": side}
            if id_ != "missing":
                r["id"] = id_
            r["ts"] = t
            r["n"] = n
            f.write(json.dumps(r, separators=(",", ":")) + "\n")

def model():
    lines = [l.rstrip("\n") for l in open("input.jsonl")]
    recs = [json.loads(l) for l in lines]
    late, live = [], []
    maxts = None
    for line, r in zip(lines, recs):
        wm = None if maxts is None else maxts - BOUND
        if wm is not None and r["ts"] <= wm:
            late.append(line)
        else:
            live.append((line, r))
        maxts = r["ts"] if maxts is None else max(maxts, r["ts"])
    out = []
    used = set()
    for i, (ll, l) in enumerate(live):
        if l["side"] != "L" or l.get("id") is None:
            continue
        for j, (rl, r) in enumerate(live):
            if r["side"] == "R" and r.get("id") == l["id"] and l["ts"] - B <= r["ts"] <= l["ts"] + A:
                out.append('{"key":%s,"left":%s,"right":%s}' % (json.dumps(l["id"]), ll, rl))
                used.add(i); used.add(j)
    for i, (line, r) in enumerate(live):
        if i in used:
            continue
        key = json.dumps(r.get("id"))
        if r["side"] == "L":
            out.append('{"key":%s,"left":%s,"right":null}' % (key, line))
        else:
            out.append('{"key":%s,"left":null,"right":%s}' % (key, line))
    with open("expected.jsonl", "w") as f:
        for o in sorted(out) + late:
            f.write(o + "\n")

if __name__ == "__main__":
    gen() if sys.argv[1:] == ["gen"] else model()
