"""The prefetch init container's downloader: Python's standard library only, so the container
needs nothing from PyPI at start (a plain pinned python image) and the namespace needs no PyPI
egress. The init container runs this file's source with ``python3 -c``.

It writes the Hugging Face hub cache layout that huggingface_hub reads with HF_HUB_OFFLINE=1
(file_download.py, v1.28): ``$HF_HOME/hub/models--<org>--<name>/`` with ``blobs/<etag>`` (the
LFS sha256, else the git blob sha1), ``snapshots/<commit>/<path>`` a relative symlink to the blob,
and ``refs/<revision>`` holding the commit with no trailing newline. It asks the Hub what
llama.cpp's downloader asks (common/hf-cache.cpp at b10729): ``api/models/<repo>/refs`` and
``api/models/<repo>/tree/<commit>?recursive=true``, then ``<repo>/resolve/<commit>/<path>``.
Files already complete are skipped, partial ones resumed with a byte range: a restart is cheap.

A finished revision leaves a marker (``.prefetch-complete-<commit>`` beside ``blobs``), so a pod's
restart needs no Hub: a pinned commit that is complete is not asked about at all, and a branch
whose last commit is complete starts from it when the Hub cannot be reached (the weights are on
disk; an outage of the Hub should not take the server down with it).

Environment: HF_REPO, HF_REVISION (a branch, or a 40-hex commit), HF_HOME; optional HF_ENDPOINT
and HF_TOKEN.
"""

import json
import os
import re
import socket
import sys
import urllib.error
import urllib.request


def _get(url, token, headers=None):
    request = urllib.request.Request(url, headers={**({"Authorization": "Bearer " + token} if token else {}),
                                                   **(headers or {})})
    return urllib.request.urlopen(request, timeout=60)


def _json(url, token):
    with _get(url, token) as answer:
        return json.load(answer)


def _commit(endpoint, repo, revision, token):
    if re.fullmatch(r"[0-9a-f]{40}", revision):
        return revision
    for branch in _json(f"{endpoint}api/models/{repo}/refs", token).get("branches", []):
        if branch.get("name") == revision:
            return branch["targetCommit"]
    sys.exit(f"prefetch: {repo} has no branch {revision!r}")


def _fetch(url, token, blob, size):
    partial = blob + ".incomplete"
    have = os.path.getsize(partial) if os.path.exists(partial) else 0
    with _get(url, token, {"Range": f"bytes={have}-"} if have else None) as answer:
        if have and answer.status != 206:
            have = 0  # the server ignored the range: start over
        with open(partial, "ab" if have else "wb") as out:
            while True:
                chunk = answer.read(1 << 20)
                if not chunk:
                    break
                out.write(chunk)
    if size is not None and os.path.getsize(partial) != size:
        sys.exit(f"prefetch: {url} ended at {os.path.getsize(partial)} of {size} bytes; the next start resumes it")
    os.replace(partial, blob)


def _complete(root, commit):
    return os.path.join(root, ".prefetch-complete-" + commit)


def _cached_commit(root, revision):
    """The commit a finished earlier run left for this revision, or None."""
    commit = revision
    if not re.fullmatch(r"[0-9a-f]{40}", revision):
        try:
            with open(os.path.join(root, "refs", revision)) as ref:
                commit = ref.read().strip()
        except OSError:
            return None
    return commit if os.path.exists(_complete(root, commit)) else None


def main():
    repo, revision = os.environ["HF_REPO"], os.environ.get("HF_REVISION", "main")
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/") + "/"
    token = os.environ.get("HF_TOKEN")
    root = os.path.join(os.environ["HF_HOME"], "hub", "models--" + repo.replace("/", "--"))
    cached = _cached_commit(root, revision)
    if cached is not None and cached == revision:
        print(f"prefetch: {repo}@{cached} complete (a pinned commit: the Hub is not asked)", flush=True)
        return
    try:
        commit = _commit(endpoint, repo, revision, token)
        files = [f for f in _json(f"{endpoint}api/models/{repo}/tree/{commit}?recursive=true", token)
                 if f.get("type") == "file"]
    except (urllib.error.URLError, socket.timeout, ConnectionError) as error:
        if isinstance(error, urllib.error.HTTPError) and error.code not in (408, 429) and error.code < 500:
            raise  # the Hub answered: a wrong repo or token is not an outage
        if cached is None:
            sys.exit(f"prefetch: the Hub is unreachable ({error}) and {repo}@{revision} was never fetched completely")
        print(f"prefetch: the Hub is unreachable ({error}); starting from {repo}@{cached}, "
              f"the last complete commit of {revision}", flush=True)
        return
    for folder in ("blobs", "refs", os.path.join("snapshots", commit)):
        os.makedirs(os.path.join(root, folder), exist_ok=True)
    for item in files:
        path, lfs = item["path"], item.get("lfs") or {}
        etag = lfs.get("oid") or item["oid"]
        size = lfs.get("size", item.get("size"))
        blob = os.path.join(root, "blobs", etag)
        if not (os.path.exists(blob) and (size is None or os.path.getsize(blob) == size)):
            print(f"prefetch: {repo}/{path} ({size or '?'} bytes)", flush=True)
            _fetch(f"{endpoint}{repo}/resolve/{commit}/{path}", token, blob, size)
        link = os.path.join(root, "snapshots", commit, path)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        target = os.path.relpath(blob, os.path.dirname(link))
        if os.path.islink(link) and os.readlink(link) != target:
            os.remove(link)
        if not os.path.lexists(link):
            os.symlink(target, link)
    if revision != commit:
        with open(os.path.join(root, "refs", revision), "w") as ref:
            ref.write(commit)  # no newline: readers use the content as a folder name
    open(_complete(root, commit), "w").close()
    print(f"prefetch: {repo}@{commit} complete ({len(files)} files)", flush=True)


if __name__ == "__main__":
    main()
