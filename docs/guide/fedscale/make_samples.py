"""Writes the sample traces beside this script, in FedScale's on-disk format (a pickled dict)
and as the same data in JSON and CSV. The numbers are made up for the example: 8 devices, an
hour-long behaviour trace. Run: python docs/guide/fedscale/make_samples.py [out_dir]"""
import csv
import json
import pickle
import sys
from pathlib import Path

# client id -> (computation: ms per sample, communication: kbit/s)
CAPACITY = {1: (12.0, 5000.0), 2: (25.0, 1200.0), 3: (40.0, 20000.0), 4: (55.0, 800.0),
            5: (80.0, 3000.0), 6: (120.0, 15000.0), 7: (30.0, 650.0), 8: (65.0, 9000.0)}
# client id -> online intervals [active, inactive) in seconds of a trace repeating every hour
HOUR = 3600
BEHAVIOUR = {1: [(0, 3600)], 2: [(0, 1800), (2400, 3600)], 3: [(0, 900), (1200, 3000)], 4: [(600, 3600)],
             5: [(0, 1200)], 6: [(0, 300), (900, 2700)], 7: [(0, 3000)], 8: [(300, 3300)]}


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    capacity = {cid: {"computation": comp, "communication": comm} for cid, (comp, comm) in CAPACITY.items()}
    behaviour = {cid: {"duration": sum(b - a for a, b in iv), "inactive": [b for _, b in iv], "finish_time": HOUR,
                       "active": [a for a, _ in iv], "model": f"sample-device-{cid}"} for cid, iv in BEHAVIOUR.items()}
    for name, data in (("device_capacity", capacity), ("behave_trace", behaviour)):
        (out / f"{name}.pkl").write_bytes(pickle.dumps(data, protocol=4))
        (out / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    with open(out / "device_capacity.csv", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["client_id", "computation", "communication"])
        w.writerows([cid, comp, comm] for cid, (comp, comm) in CAPACITY.items())
    with open(out / "behave_trace.csv", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["client_id", "active", "inactive", "finish_time"])
        w.writerows([cid, a, b, HOUR] for cid, iv in BEHAVIOUR.items() for a, b in iv)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
