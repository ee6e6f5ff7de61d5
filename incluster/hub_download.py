"""A single-model server's init container: the weights of one repo at one revision fetched into the
replica's Hugging Face cache before the engine starts (the layout and the Hub's API: hub.py). Files
already complete are skipped, partial ones resumed with a byte range: a restart is cheap.

A finished commit leaves a marker (``.prefetch-complete-<commit>`` beside ``blobs``, listing its
files and sizes, written last and synced), so a restart needs no Hub: a pinned commit whose files
are all still there is not asked about at all, and when the Hub cannot be reached the last commit
fetched starts if its files are intact (the weights are on disk; a Hub outage should not take the
server down with them). Engines read the cache offline at revision ``main`` (they are given no
other), so ``refs/main`` always names the commit fetched last, pinned or not.

Environment: HF_REPO, HF_REVISION (a branch, a tag or a 40-hex commit), HF_HOME; optional HF_ENDPOINT
and HF_TOKEN. Standard library only: run as a file of the server's programs ConfigMap."""

import http.client
import json
import os
import sys
import urllib.error

import hub


def main():
    repo, revision = os.environ["HF_REPO"], os.environ.get("HF_REVISION", "main")
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/") + "/"
    token = os.environ.get("HF_TOKEN")
    root = os.path.join(os.environ["HF_HOME"], "hub", "models--" + repo.replace("/", "--"))
    if hub.COMMIT.fullmatch(revision) and hub.intact(root, revision):
        hub.point_main_at(root, revision)
        print(f"prefetch: {repo}@{revision} complete (a pinned commit: the Hub is not asked)", flush=True)
        return
    try:
        commit = hub.commit_of(endpoint, repo, revision, token)
        files = hub.tree(endpoint, repo, commit, token)
    except (OSError, http.client.HTTPException, ValueError) as error:
        # OSError covers URLError, timeouts and refused connections; ValueError a page that is not JSON.
        if isinstance(error, urllib.error.HTTPError) and error.code not in (408, 429) and error.code < 500:
            raise  # the Hub answered: a wrong repo or token is not an outage
        try:
            with open(os.path.join(root, "refs", "main")) as ref:
                cached = ref.read().strip()
        except OSError:
            cached = None
        if cached is None or not hub.intact(root, cached):
            sys.exit(f"prefetch: the Hub is unreachable ({error}) and {repo}@{revision} was never fetched completely")
        print(f"prefetch: the Hub is unreachable ({error}); starting from {repo}@{cached}, "
              f"the last complete commit fetched", flush=True)
        return
    # What the plan counted for this download (its weights): a repo larger than that is not fetched at all,
    # so the pod never starts on a size the plan never saw (5 %: the plan's figure is rounded to a tenth of a GiB).
    planned = int(os.environ.get("PLANNED_BYTES") or 0)
    listed = sum((item.get("lfs") or {}).get("size", item.get("size")) or 0 for item in files)
    if planned and listed > planned * 1.05:
        sys.exit(f"prefetch: {repo}@{commit} is {listed / 2**30:.2f} GiB, larger than the plan counted "
                 f"({planned / 2**30:.2f} GiB, the model's weights in the stack file): not fetched; correct weights")
    for folder in ("blobs", "refs", os.path.join("snapshots", commit)):
        os.makedirs(os.path.join(root, folder), exist_ok=True)
    sizes = {}
    for item in files:
        path, lfs = item["path"], item.get("lfs") or {}
        etag = lfs.get("oid") or item["oid"]
        size = sizes[path] = lfs.get("size", item.get("size"))
        blob = os.path.join(root, "blobs", etag)
        if not (os.path.exists(blob) and (size is None or os.path.getsize(blob) == size)):
            print(f"prefetch: {repo}/{path} ({size or '?'} bytes)", flush=True)
            hub.fetch(f"{endpoint}{repo}/resolve/{commit}/{path}", token, blob, size)
        hub.link(blob, os.path.join(root, "snapshots", commit, path))
    if revision != commit:
        with open(os.path.join(root, "refs", revision), "w") as ref:
            ref.write(commit)
    hub.point_main_at(root, commit)
    # Last: the files it lists, with their sizes, checked again by every later start.
    with open(hub.marker(root, commit), "w") as done:
        json.dump(sizes, done)
    hub.durable(hub.marker(root, commit))
    print(f"prefetch: {repo}@{commit} complete ({len(files)} files)", flush=True)


if __name__ == "__main__":
    main()
