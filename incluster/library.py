"""A router's downloader (models on demand), in two modes; the Hub and the cache layout are hub.py's.

Library mode (the router's init container): for each public model name, the files llama.cpp's
``--hf-repo org/repo:TAG`` would fetch (common/download.cpp at b10729: the first model GGUF whose path
matches ``TAG[.-]``, its split siblings, and the mmproj sibling llama-server loads by default), fetched
into the hub layout of ``HUB_CACHE`` (the volume's LLAMA_CACHE, so single-model servers share the blobs)
and linked as ``$LIBRARY_DIR/<name>/<file>``: the folder the router reads with --models-dir, each
subfolder one model named as clients name it. Folders of models no longer listed are removed, so the
router can load nothing the plan did not count. A model whose folder is complete (``.complete`` lists its
files and sizes) starts without the Hub when the Hub is down. Environment: HF_LIBRARY (a file of JSON:
name -> {hf_repo: org/repo:TAG, mmproj: bool}), HUB_CACHE, LIBRARY_DIR; optional HF_ENDPOINT, HF_TOKEN.

Keeper mode (``KEEP_SECONDS`` set; the router's sidecar): once at its start (the ConfigMap may have
changed since the init container ran) and then whenever HF_LIBRARY or PRESET changed (the mounted
ConfigMap, which the kubelet updates in place; read every KEEP_SECONDS), it fetches what is new, removes
what is gone, then asks the router to re-read its preset (``GET RELOAD_URL``, ``/models?reload=1``, with
the first key of ROUTER_AUTH_FILE): llama.cpp keeps the children whose settings did not change
(server-models.cpp:695-861), so adding a model restarts no other. A model the reload would unload (its
settings changed, preset.py) or whose weights changed is drained first through the admission proxy's
control socket (ADMISSION_CONTROL): new requests for it get a 503 the gateway retries, the ones in flight
finish, then it reloads and is offered again. A failure is printed and tried again
next round; the keeper never exits (a crashed container would take the pod out of its Service). It
touches HEARTBEAT every KEEP_SECONDS from a thread of its own, which the probes read.

Standard library only: run as a file of the server's programs ConfigMap (components/programs.py)."""

import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

import hub
import preset
import router_rules

# --- library mode -------------------------------------------------------------------------------
SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.I)
QUANT_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.I)
NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")


def _split(path):
    """(prefix, quant tag, shard index, shard count) of a GGUF path (get_gguf_split_info)."""
    prefix = path[:-len(".gguf")]
    index = count = 1
    match = SPLIT.match(prefix)
    if match:
        prefix, index, count = match.group(1), int(match.group(2)), int(match.group(3))
    tag = QUANT_TAG.search(prefix)
    return prefix, tag.group(1).upper() if tag else "", index, count


def _bits(path):
    """Q4_K_M -> 4, F16 -> 16 (extract_quant_bits): the first number of the quant tag."""
    digits = re.search(r"[0-9]+", _split(path)[1]) if path.endswith(".gguf") else None
    return int(digits.group(0)) if digits else 0


def select(files, tag, mmproj=True):
    """The paths llama.cpp's downloader takes for repo:tag: the first model file matching the tag
    (a shard only as its first), its shards, and the closest mmproj sibling (find_best_model,
    get_split_files, find_best_sibling)."""
    pattern = re.compile(re.escape(tag) + "[.-]", re.I)
    paths = [f["path"] for f in files]
    if "preset.ini" in paths:
        # llama.cpp then fetches that file alone and takes the model from it (common/download.cpp).
        raise Refused("the repo ships a preset.ini, which llama.cpp fetches instead of a GGUF; not supported on demand")
    primary = next((p for p in paths if p.endswith(".gguf") and not any(w in p.rsplit("/", 1)[-1] for w in NOT_MODELS)
                    and pattern.search(p) and _split(p)[2] == 1), None)
    if primary is None:
        gguf = ", ".join(p for p in paths if p.endswith(".gguf")) or "none"
        raise Refused(f"no GGUF file for tag {tag} (GGUF files: {gguf})")
    prefix, _, _, count = _split(primary)
    chosen = [p for p in paths if p.endswith(".gguf") and _split(p)[0] == prefix and _split(p)[3] == count] if count > 1 else [primary]
    model_dir, bits, best = primary.split("/")[:-1], _bits(primary), None
    for p in paths if mmproj else ():
        if not p.endswith(".gguf") or "mmproj" not in p:
            continue
        sibling_dir = p.split("/")[:-1]
        if sibling_dir != model_dir[:len(sibling_dir)]:
            continue
        rank = (len(sibling_dir), -abs(_bits(p) - bits))
        if best is None or rank > best[0]:
            best = (rank, p)
    return chosen + ([best[1]] if best else [])


def _complete(folder):
    """The folder's files and sizes, if its last fetch finished and every link still resolves."""
    try:
        with open(os.path.join(folder, ".complete")) as handle:
            sizes = json.load(handle)
        if all(os.path.isfile(os.path.join(folder, name)) and os.path.getsize(os.path.join(folder, name)) == size
               for name, size in sizes.items()):
            return sizes
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    return None


# How far a model's files may exceed the bytes the plan counted for them (its weights, rounded up to a tenth
# of a GiB): real files weigh a little more than parameters x the quant's average bits.
SIZE_TOLERANCE = 0.05


class TooLarge(Exception):
    """A model's files larger than the plan counted: never offered (its memory would overrun the budget)."""


def check_size(name, sizes, planned):
    """Refuses a model whose files (name -> bytes) are larger than planned (bytes, or None: not planned)."""
    total = sum(size or 0 for size in sizes.values())
    if planned is not None and total > planned * (1 + SIZE_TOLERANCE):
        raise TooLarge(f"larger than planned: its files are {total / 2**30:.2f} GiB, the plan counted "
                       f"{planned / 2**30:.2f} GiB (its weights or facts in the stack file are wrong); not offered")


def fetch_model(name, repo_tag, endpoint, token, hub_cache, library, mmproj=True, planned=None):
    """One model into the hub layout, then linked as <library>/<name>/: the links are made only
    once every file is complete, so the router never sees half a model, and only when the files are
    no larger than the plan counted (``planned`` bytes): the router lists every folder with a GGUF, so
    a model too large is kept out of the folder, not only out of the preset."""
    repo, _, tag = repo_tag.rpartition(":")
    folder = os.path.join(library, name)
    root = os.path.join(hub_cache, "models--" + repo.replace("/", "--"))
    try:
        commit = hub.commit_of(endpoint, repo, "main", token)
        files = hub.tree(endpoint, repo, commit, token)
    except (OSError, http.client.HTTPException, ValueError) as error:
        if isinstance(error, urllib.error.HTTPError) and error.code not in (408, 429) and error.code < 500:
            raise Refused(f"{repo} answered {error.code} ({error.reason}): check its hf_repo") from None
        complete = _complete(folder)
        if complete is None:
            raise Unreachable(f"the Hub is unreachable ({error}) and {repo_tag} was never fetched completely") from None
        _unless_fits(folder, name, complete, planned)
        print(f"prefetch: the Hub is unreachable ({error}); {name} starts from its last complete fetch", flush=True)
        return
    wanted = {item["path"]: item for item in files}
    chosen = select(files, tag, mmproj)
    # What the Hub lists, before a byte is fetched (a wrong size costs no download)...
    _unless_fits(folder, name, {p: (wanted[p].get("lfs") or {}).get("size", wanted[p].get("size")) for p in chosen},
                 planned)
    os.makedirs(os.path.join(root, "blobs"), exist_ok=True)
    blobs = {}
    for path in chosen:
        item = wanted[path]
        lfs = item.get("lfs") or {}
        size = lfs.get("size", item.get("size"))
        blob = blobs[path] = os.path.join(root, "blobs", lfs.get("oid") or item["oid"])
        if not (os.path.exists(blob) and (size is None or os.path.getsize(blob) == size)):
            print(f"prefetch: {name}: {repo}/{path} ({size or '?'} bytes)", flush=True)
            hub.fetch(f"{endpoint}{repo}/resolve/{commit}/{path}", token, blob, size)
    # ...and what is on the disk, before the router can see it.
    _unless_fits(folder, name, {path: os.path.getsize(blob) for path, blob in blobs.items()}, planned)
    os.makedirs(folder, exist_ok=True)
    sizes = {}
    for path, blob in blobs.items():
        # The hub layout too (llama.cpp's own downloader on this volume then finds the file)...
        hub.link(blob, os.path.join(root, "snapshots", commit, path))
        # ...and the router's: <name>/<file name> (a shard keeps its -0000N-of- name, an mmproj its word).
        base = path.rsplit("/", 1)[-1]
        hub.link(blob, os.path.join(folder, base))
        sizes[base] = os.path.getsize(blob)
    for entry in os.listdir(folder):
        if entry not in sizes and entry != ".complete":
            os.remove(os.path.join(folder, entry))  # a file of an older commit or tag
    os.makedirs(os.path.join(root, "refs"), exist_ok=True)
    hub.point_main_at(root, commit)
    with open(os.path.join(folder, ".complete"), "w") as marker:
        json.dump(sizes, marker)
    hub.durable(os.path.join(folder, ".complete"))
    print(f"prefetch: {name} = {repo_tag}@{commit} complete ({', '.join(sorted(sizes))})", flush=True)


def _unless_fits(folder, name, sizes, planned):
    """check_size, and a model too large leaves the router's folder (an earlier, smaller fetch included)."""
    try:
        check_size(name, sizes, planned)
    except TooLarge:
        if os.path.isdir(folder):
            shutil.rmtree(folder)
        raise


class Refused(Exception):
    """The Hub answered no (a wrong repo, a gated one): retried rarely."""


class Unreachable(Exception):
    """The Hub did not answer, and the model was never complete: retried every round."""


def _read(path):
    with open(path, "rb") as handle:
        return handle.read()


def library(fetch=True):
    """Every listed model fetched on its own (one that fails keeps none of the others from the router),
    the folders of unlisted ones removed, and the preset the router reads written with the sections of
    complete models only. Returns {name: why} for the models that are not there. ``fetch=False``: the Hub
    is not asked; what is complete on the volume (and no larger than planned) is offered, the rest is left
    to the keeper."""
    models = json.loads(_read(os.environ["HF_LIBRARY"]))
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/") + "/"
    token = os.environ.get("HF_TOKEN")
    folder = os.environ["LIBRARY_DIR"]
    os.makedirs(folder, exist_ok=True)
    for entry in sorted(os.listdir(folder)):
        if entry not in models and not entry.startswith("."):
            # Only what the plan counted may be loaded: a model taken off the list leaves the router's
            # folder (its blobs stay in the hub cache for whoever else uses them).
            print(f"prefetch: {entry} is no longer listed: removed from the router's folder", flush=True)
            path = os.path.join(folder, entry)
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    missing, changed = {}, []
    for name, entry in models.items():
        # {"hf_repo": "org/repo:TAG", "mmproj": false}: without the projector the plan did not count (a
        # plain "org/repo:TAG": everything llama.cpp's --hf-repo would fetch).
        repo_tag, mmproj = (entry, True) if isinstance(entry, str) else (entry["hf_repo"], entry.get("mmproj", True))
        planned = None if isinstance(entry, str) else entry.get("planned_bytes")
        before = _files(os.path.join(folder, name))
        try:
            if not fetch:
                complete = _complete(os.path.join(folder, name))
                if complete is None:
                    missing[name] = "not fetched yet (the keeper fetches it in the background)"
                else:
                    _unless_fits(os.path.join(folder, name), name, complete, planned)
                continue
            fetch_model(name, repo_tag, endpoint, token, os.environ["HUB_CACHE"], folder, mmproj, planned)
            if before and _files(os.path.join(folder, name)) != before:
                changed.append(name)
        except (Refused, Unreachable, TooLarge, SystemExit, OSError, http.client.HTTPException, ValueError) as error:
            why = str(getattr(error, "code", None) or error).removeprefix("prefetch: ")
            missing[name] = f"refused: {why}" if isinstance(error, (Refused, TooLarge)) else why
            print(f"prefetch: {name} ({repo_tag}) is not served: {missing[name]}", file=sys.stderr, flush=True)
    for name in missing:
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            # Not served, so not in the router's folder either: the router also lists every folder of its
            # --models-dir and would load one there with llama.cpp's defaults, outside the plan. Only links go:
            # the blobs stay in the hub cache, and a later fetch links them again without a download.
            shutil.rmtree(path)
            print(f"prefetch: {name} is not served: removed from the router's folder", flush=True)
    served = [name for name in models if name not in missing and _complete(os.path.join(folder, name)) is not None]
    _write_served_preset(served)
    status = json.dumps({"served": served, "missing": missing, "at": int(time.time())})
    for path in (os.path.join(folder, ".status.json"), os.environ.get("LIBRARY_STATUS")):
        if path:  # the second on the pod's scratch volume, where the admission proxy reads it for /metrics
            _write(path, status.encode())
    return missing, changed


def _files(folder):
    """A model's files as linked: each name and the blob it points at (a new commit or repo with the
    same file names points at other blobs)."""
    if not os.path.isdir(folder):
        return None
    return sorted((entry, os.path.realpath(os.path.join(folder, entry))) for entry in os.listdir(folder))


def _write_served_preset(served):
    """The preset less the sections of models not served: the router must not list a model whose
    files are missing (a request for it would evict a loaded model, then fail to load)."""
    kept, section = [], None
    # Lines and headers as llama.cpp's preset parser reads them (preset.py).
    for line in preset.lines(_read(os.environ["PRESET"]).decode()):
        header = preset.section_of(line)
        if header is not None:
            section = header
        if section is None or section == preset.GLOBAL or section in served:
            kept.append(line)
    target = os.environ["SERVED_PRESET"]
    os.makedirs(os.path.dirname(target), exist_ok=True)
    _write(target, ("\n".join(kept) + "\n").encode())


def fill():
    """The init container. A pod never waits for a download while a listed model is on the volume: then what
    is complete is offered at once and the keeper fetches the rest in the background (a request for one of
    them is a 503 with Retry-After until then, which the gateway takes to its next tier). Only on an empty
    volume (the first start) does it fetch before the router starts, and stops the start when nothing can be."""
    listed = json.loads(_read(os.environ["HF_LIBRARY"]))
    on_volume = [name for name in listed if _complete(os.path.join(os.environ["LIBRARY_DIR"], name)) is not None]
    missing, _ = library(fetch=not on_volume)
    # The router reads this preset when it starts: the keeper's first reload is compared with it.
    _write(_router_read_path(), _read(os.environ["SERVED_PRESET"]))
    if len(missing) == len(listed):
        sys.exit("prefetch: no listed model could be fetched, so the router would serve nothing: "
                 + "; ".join(f"{name}: {why}" for name, why in missing.items()))
    if missing:
        print(f"prefetch: starting without {', '.join(missing)} (the keeper fetches them; see its log)", flush=True)
    # A first heartbeat for the keeper (the pod's scratch volume outlives this container): its first
    # readiness probe, at its start, passes, so the pod is Ready as soon as the router is.
    with open(os.environ["HEARTBEAT"], "w") as beat:
        beat.write(str(time.time()))


def _state():
    """What the router was last given: the library and its preset, as the kubelet last wrote them."""
    return hashlib.sha256(_read(os.environ["HF_LIBRARY"]) + b"\0" + _read(os.environ["PRESET"])).hexdigest()


def _auth():
    """The first key of the server's key file, read as the router reads it (router_rules.py)."""
    if not os.environ.get("ROUTER_AUTH_FILE"):
        return {}
    keys = router_rules.read_key_file(_read(os.environ["ROUTER_AUTH_FILE"]))
    return {"Authorization": "Bearer " + keys[0].decode("latin-1")} if keys else {}


def _unload(name):
    """A model whose files changed under the same names: the router compares only a section's settings
    (server-models.cpp), so its child would serve the old weights until evicted; unloaded, its next
    request loads the new ones (drained first: no request in flight on it is cut)."""
    base = os.environ["RELOAD_URL"].split("/models", 1)[0]
    request = urllib.request.Request(base + "/models/unload", data=json.dumps({"model": name}).encode(),
                                     headers={**_auth(), "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30):
            print(f"keeper: {name}: new weights under the same file names: unloaded, its next request loads them", flush=True)
    except urllib.error.HTTPError as error:  # 400: not running, so its next load reads the new files anyway
        print(f"keeper: {name}: new weights under the same file names (not running: {error.code})", flush=True)


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 (http.client's) over the admission proxy's control socket in the pod's scratch volume."""

    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def _control(path, names):
    """POST {"models": names} to the admission proxy's control socket (ADMISSION_CONTROL); its JSON answer,
    or None where the pod has no proxy."""
    where = os.environ.get("ADMISSION_CONTROL")
    if not where or not os.path.exists(where):
        return None
    seconds = int(os.environ["DRAIN_SECONDS"])  # set with ADMISSION_CONTROL (components/prefetch.py)
    connection = _UnixHTTPConnection(where, timeout=seconds + 30)
    try:
        connection.request("POST", path, body=json.dumps({"models": names, "seconds": seconds}),
                           headers={"Content-Type": "application/json"})
        answer = connection.getresponse()
        body = answer.read(1 << 16)
        if answer.status != 200:
            raise OSError(f"the admission proxy answered {answer.status} to {path} {names}: {body[:200]!r}")
        return json.loads(body)
    finally:
        connection.close()


def _drain(names):
    """Has the admission proxy stop admitting requests for these models, all at once (503 with Retry-After,
    which the gateway retries on its next tier), and wait until the ones in flight on them have ended, at
    most DRAIN_SECONDS: a reload or an unload then cuts nothing. The names drained, for _resume."""
    if not names:
        return []
    try:
        answer = _control("/drain", names)
    except (OSError, ValueError, http.client.HTTPException) as error:  # said once; the edit is applied anyway
        print(f"keeper: {', '.join(names)}: not drained ({error}); reloading anyway", flush=True)
        return []
    if answer is None:
        return []
    for name in names:
        left = answer["in_flight"].get(name, 0)
        if left == 0:
            print(f"keeper: {name}: drained (no request in flight)", flush=True)
        else:
            print(f"keeper: {name}: {left} request(s) still in flight after {os.environ['DRAIN_SECONDS']} s; "
                  "reloading anyway",
                  flush=True)
    return names


def _resume(names):
    if not names:
        return
    try:
        _control("/resume", names)
    except (OSError, ValueError, http.client.HTTPException) as error:  # the proxy ends it past its deadline
        print(f"keeper: {', '.join(names)}: resume not acknowledged ({error})", flush=True)


def _reload():
    request = urllib.request.Request(os.environ["RELOAD_URL"], headers=_auth())
    with urllib.request.urlopen(request, timeout=30) as answer:
        listed = sorted(m["id"] for m in json.load(answer)["data"])
    print(f"keeper: the router re-read its preset: {', '.join(listed)}", flush=True)


# A child the router was told to stop reads `loaded` until it has exited (its stop timeout is 10 s): the keeper
# resumes a drained model only once it has, else a request would reach the exiting child.
STOP_SECONDS = 60


def _running(names):
    """Which of ``names`` the router still runs (GET /models, as the admission proxy reads it)."""
    base = os.environ["RELOAD_URL"].split("/models", 1)[0]
    request = urllib.request.Request(base + "/models", headers=_auth())
    with urllib.request.urlopen(request, timeout=30) as answer:
        data = json.loads(answer.read(1 << 22))["data"]
    return {m["id"] for m in data if m["id"] in names and m["status"]["value"] in router_rules.RUNNING}


def _wait_stopped(names):
    deadline = time.monotonic() + STOP_SECONDS
    while names:
        still = _running(names)
        if not still:
            return
        if time.monotonic() > deadline:
            print(f"keeper: {', '.join(sorted(still))} still running {STOP_SECONDS} s after the reload", flush=True)
            return
        time.sleep(0.5)


def _router_read_path():
    """Where the preset the router last read is kept (on the pod's scratch volume, beside the served one): the
    next round's reload is compared with it, not with the last one written, so a reload that failed is drained
    again when it is tried again."""
    return os.environ["SERVED_PRESET"] + ".read"


def _pending_path():
    """The models with new weights not yet unloaded (a failed round, a keeper restart): unloaded on the next."""
    return os.environ["SERVED_PRESET"] + ".unload"


def _write(path, data):
    """Whole, never half-written, when another program (the router, the proxy) reads it meanwhile."""
    with open(path + ".new", "wb") as out:
        out.write(data)
    os.replace(path + ".new", path)


def _router_read():
    for path in (_router_read_path(), os.environ["SERVED_PRESET"]):
        if os.path.exists(path):
            return _read(path).decode()
    return ""


def _pending():
    try:
        names = json.loads(_read(_pending_path()))
    except (OSError, ValueError):
        return set()
    return {n for n in names if isinstance(n, str)} if isinstance(names, list) else set()


def _heartbeat(path, seconds):
    main_thread = threading.main_thread()
    while main_thread.is_alive():
        with open(path, "w") as beat:
            beat.write(str(time.time()))
        _publish_room()
        time.sleep(seconds)


ROOM_STATUS_BYTES = 4096


def _publish_room():
    """A GPU router's status for the servers sharing its card (room.py reads it): the admission proxy's file on
    the pod's scratch volume (ROOM_STATUS), copied whole to the model cache (ROOM_PUBLISH), which the keeper
    writes and the proxy, facing the network, does not. Its own time inside says how fresh it is."""
    source, target = os.environ.get("ROOM_STATUS"), os.environ.get("ROOM_PUBLISH")
    if not source or not target:
        return
    try:
        with open(source, "rb") as handle:
            data = handle.read(ROOM_STATUS_BYTES)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        _write(target, data)
    except FileNotFoundError:
        pass  # the proxy has not written it yet
    except OSError as error:
        print(f"keeper: room status not published: {error}", flush=True)


def keep():
    seconds = int(os.environ["KEEP_SECONDS"])
    threading.Thread(target=_heartbeat, args=(os.environ["HEARTBEAT"], seconds), daemon=True).start()
    # Nothing counts as applied yet: the ConfigMap may have changed between the init container's fetch
    # and now, so the first round fetches (nothing, when complete) and reloads (a no-op when unchanged).
    applied = None
    while True:
        try:
            now = _state()
            if now == applied:
                time.sleep(seconds)
                continue
            print("keeper: applying the library and its preset" + (" (changed)" if applied else " (at start)"), flush=True)
            before = _router_read()  # what the router last read, whatever was written since
            missing, changed = library()
            pending = sorted(_pending() | set(changed))
            _write(_pending_path(), json.dumps(pending).encode())
            # The models the reload unloads (their settings changed, or no longer served) and those with new
            # weights: drained first, so no request in flight on them is cut; the others keep running untouched.
            after = _read(os.environ["SERVED_PRESET"]).decode()
            touched = sorted(set(preset.reloaded(before, after)) | set(preset.removed(before, after)) | set(pending))
            drained = _drain(touched)
            try:
                _reload()
                for name in pending:
                    _unload(name)
                _wait_stopped(set(touched))  # resumed only once their old children have exited
                _write(_router_read_path(), after.encode())
                _write(_pending_path(), b"[]")
            finally:
                _resume(drained)
            if not missing:
                applied = now
                continue
            # What could be fetched is served already; the rest is tried again, a refusal (a wrong
            # repo) less often than an outage, so a typo does not hammer the Hub.
            wait = seconds * (20 if all(why.startswith("refused") for why in missing.values()) else 2)
            print(f"keeper: not served yet: {', '.join(missing)}; trying again in {wait} s", flush=True)
            applied = None
            time.sleep(wait)
        except (SystemExit, Exception) as error:  # noqa: BLE001 - printed, and tried again next round
            print(f"keeper: not applied yet ({error}); trying again in {seconds} s", flush=True)
            time.sleep(seconds)


def alive():
    """The keeper's probe (``library.py alive``): its heartbeat is recent (written every KEEP_SECONDS)."""
    age = time.time() - os.path.getmtime(os.environ["HEARTBEAT"])
    sys.exit(0 if age <= 4 * int(os.environ["KEEP_SECONDS"]) else f"keeper: no heartbeat for {age:.0f} s")


if __name__ == "__main__":
    if sys.argv[1:] == ["alive"]:
        alive()
    keep() if os.environ.get("KEEP_SECONDS") else fill()
