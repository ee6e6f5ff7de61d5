"""`make bench`: what planning a large library of models on demand costs (issue #43 item 6): the shipped
rtx3090-library's five models repeated into 25, 50, 100 and 200 (four context sizes), and its 8B a hundred
times (millions of resident sets: the plan holds bounds), planned as a stack; prints the seconds and the
resident sets the plan walked. Measures; asserts nothing."""

from __future__ import annotations

import copy
import statistics
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def library_of(count: int, same: bool = False) -> dict:
    document = yaml.safe_load((ROOT / "Pulumi.rtx3090-library.yaml").read_text())["config"]
    values = {k.split(":", 1)[1]: v for k, v in document.items()
              if k.startswith("inference-plane:") and not (isinstance(v, dict) and "secure" in v)}
    values.pop("gateway", None)
    server = values["models"]["library"]
    server.pop("exposure", None)
    base = list(server["on_demand"]["models"].items())
    models = {}
    for i in range(count):
        name, model = base[0 if same else i % len(base)]  # same: one 5 GiB model a hundred times, 4 at once
        model = copy.deepcopy(model)
        model["pinned"] = i == 0
        model["ctx_size"] = (4096, 8192, 16384, 12288)[(i // len(base)) % 4]
        models[f"{name}-{i}"] = model
    server["on_demand"]["models"] = models
    return values


def main() -> None:
    from plane import parse_stack, plan_capacity

    for count, same in ((25, False), (50, False), (100, False), (200, False), (100, True)):
        values = library_of(count, same)
        times = []
        for _ in range(3):
            started = time.perf_counter()
            plan = plan_capacity(parse_stack(values))
            times.append(time.perf_counter() - started)
        residency = plan.servers["library"].residency
        walked = (f"{residency._walk.full_count} full sets walked" if residency._walk.exact else
                  "too many sets to walk: bounds")
        print(f"library of {count:>3} models: planned in {statistics.median(times):.3f} s (median of 3 in one process; "
              f"the first {times[0]:.3f} s), up to {residency.most_resident} resident, {walked}")


if __name__ == "__main__":
    main()
