"""The keeper's rounds (incluster/library.py keep()) when a reload fails or a child is slow to exit: run in a
process of its own with the in-cluster files on its path, as the pod runs them, with the calls that reach the
Hub, the router and the proxy replaced by recorders (the real ones are run in tests/test_router_library.py).

Both cases were found by a review: a failed reload was retried with nothing drained and the new weights never
unloaded; a drained model was resumed while its old child was still exiting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

INCLUSTER = Path(__file__).resolve().parent.parent / "incluster"

HARNESS = textwrap.dedent('''
    import json, os, sys, threading, time, urllib.error
    import library

    events, rounds = [], {"n": 0}
    first = {"changed": ["b"]}   # round 1: b's files changed under the same names

    def fake_library(fetch=True):
        library._write_served_preset(["a", "b"])
        changed, first["changed"] = first["changed"], []   # relinked: a later round's diff sees nothing
        return {}, changed

    def fake_reload():
        rounds["n"] += 1
        events.append(["reload", rounds["n"]])
        if rounds["n"] == 1 and os.environ["FAIL_FIRST"] == "1":
            raise urllib.error.URLError("timed out")

    stopping = {"b": 3}   # b's old child reads "loaded" for 3 more polls after its unload
    def fake_running(names):
        still = {n for n in names if stopping.get(n, 0) > 0}
        for n in still:
            stopping[n] -= 1
        events.append(["running", sorted(still)])
        return still

    def fake_sleep(seconds):
        if threading.current_thread() is not threading.main_thread():
            return threading.Event().wait(3600)
        if seconds < 5:   # the wait for a child to exit: polled at once here
            return None
        if rounds["n"] >= 2 or (rounds["n"] >= 1 and os.environ["FAIL_FIRST"] == "0"):
            raise KeyboardInterrupt   # the keeper's round: two are enough

    library.library = fake_library
    library._reload = fake_reload
    library._running = fake_running
    library._drain = lambda names: (events.append(["drain", names]), names)[1]
    library._resume = lambda names: events.append(["resume", names])
    library._unload = lambda name: events.append(["unload", name])
    library.time.sleep = fake_sleep
    try:
        library.keep()
    except KeyboardInterrupt:
        pass
    print(json.dumps(events))
''')


def keeper_rounds(tmp_path: Path, fail_first: bool) -> list:
    """The edit: a's ctx-size changes (the reload unloads a) and b gets new weights; the first reload fails or
    not. The recorded calls, in order."""
    files = {"lib.json": '{"a": "org/a:Q4", "b": "org/b:Q4"}',
             "preset.ini": "[a]\nctx-size = 8192\n[b]\nctx-size = 4096\n",
             "served.ini": "[a]\nctx-size = 4096\n[b]\nctx-size = 4096\n",
             # What the router read at its start (the init container writes it).
             "served.ini.read": "[a]\nctx-size = 4096\n[b]\nctx-size = 4096\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(INCLUSTER), "HF_LIBRARY": str(tmp_path / "lib.json"),
           "PRESET": str(tmp_path / "preset.ini"), "SERVED_PRESET": str(tmp_path / "served.ini"),
           "KEEP_SECONDS": "30", "HEARTBEAT": str(tmp_path / "beat"), "FAIL_FIRST": "1" if fail_first else "0",
           "RELOAD_URL": "http://127.0.0.1:9/models?reload=1"}
    done = subprocess.run([sys.executable, "-B", "-c", HARNESS], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_failed_reload_is_tried_again_with_its_drain_and_its_unload(tmp_path):
    events = keeper_rounds(tmp_path, fail_first=True)
    calls = [e for e in events if e[0] != "running"]
    assert calls == [["drain", ["a", "b"]], ["reload", 1], ["resume", ["a", "b"]],
                     ["drain", ["a", "b"]], ["reload", 2], ["unload", "b"], ["resume", ["a", "b"]]]
    # Once applied, what the router read is what was served, and nothing is left to unload.
    assert (tmp_path / "served.ini.read").read_text() == (tmp_path / "served.ini").read_text()
    assert json.loads((tmp_path / "served.ini.unload").read_text()) == []


def test_a_drained_model_is_resumed_only_once_its_old_child_has_exited(tmp_path):
    events = keeper_rounds(tmp_path, fail_first=False)
    resume = events.index(["resume", ["a", "b"]])
    assert ["running", []] in events[:resume]  # the last poll before the resume found nothing running
    assert [e for e in events[:resume] if e[0] == "running"][-1] == ["running", []]
    assert sum(1 for e in events[:resume] if e[0] == "running" and e[1] == ["b"]) == 3
