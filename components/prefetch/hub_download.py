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

A finished commit leaves a marker (``.prefetch-complete-<commit>`` beside ``blobs``, listing its
files and sizes, written last and synced), so a restart needs no Hub: a pinned commit whose files
are all still there is not asked about at all, and when the Hub cannot be reached the last commit
fetched starts if its files are intact (the weights are on disk; a Hub outage should not take the
server down with them). Engines read the cache offline at revision ``main`` (they are given no
other), so ``refs/main`` always names the commit fetched last, pinned or not.

Environment: HF_REPO, HF_REVISION (a branch, a tag or a 40-hex commit), HF_HOME; optional HF_ENDPOINT
and HF_TOKEN.
"""

import http.client
import json
import os
import re
import sys
import urllib.error
import urllib.request

COMMIT = re.compile(r"[0-9a-f]{40}")  # common.constants.COMMIT_ID; this file runs alone (python3 -c)


def _get(url, token, headers=None):
    request = urllib.request.Request(url, headers={**({"Authorization": "Bearer " + token} if token else {}),
                                                   **(headers or {})})
    return urllib.request.urlopen(request, timeout=60)


def _json(url, token):
    with _get(url, token) as answer:
        return json.load(answer)


def _tree(endpoint, repo, commit, token):
    """Every file of the commit: the Hub pages the listing (Link: <...>; rel="next")."""
    url, files = f"{endpoint}api/models/{repo}/tree/{commit}?recursive=true", []
    while url:
        with _get(url, token) as answer:
            files += [f for f in json.load(answer) if f.get("type") == "file"]
            following = re.search(r'<([^>]+)>;\s*rel="next"', answer.headers.get("Link") or "")
        url = following.group(1) if following else None
    return files


def _commit(endpoint, repo, revision, token):
    if COMMIT.fullmatch(revision):
        return revision
    refs = _json(f"{endpoint}api/models/{repo}/refs", token)
    for ref in refs.get("branches", []) + refs.get("tags", []):
        if ref.get("name") == revision:
            return ref["targetCommit"]
    sys.exit(f"prefetch: {repo} has no branch or tag {revision!r}")


def _durable(path):
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


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
    _durable(partial)  # on disk before the name says complete (a power cut must not leave a short blob)
    os.replace(partial, blob)


def _marker(root, commit):
    return os.path.join(root, ".prefetch-complete-" + commit)


def _intact(root, commit):
    """Whether the commit a marker says is complete still is: every file it lists is linked from the
    snapshot to a blob of its size (a cache cleanup or a lost write shows up here)."""
    try:
        with open(_marker(root, commit)) as handle:
            files = json.load(handle)
        for path, size in files.items():
            link = os.path.join(root, "snapshots", commit, path)
            if not os.path.isfile(link) or (size is not None and os.path.getsize(link) != size):
                return False
    except (OSError, ValueError, AttributeError):
        return False
    return True


def _point_main_at(root, commit):
    """The engines read revision main offline (they are given no other): main names the commit."""
    with open(os.path.join(root, "refs", "main"), "w") as ref:
        ref.write(commit)  # no newline: readers use the content as a folder name


def main():
    repo, revision = os.environ["HF_REPO"], os.environ.get("HF_REVISION", "main")
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/") + "/"
    token = os.environ.get("HF_TOKEN")
    root = os.path.join(os.environ["HF_HOME"], "hub", "models--" + repo.replace("/", "--"))
    if COMMIT.fullmatch(revision) and _intact(root, revision):
        _point_main_at(root, revision)
        print(f"prefetch: {repo}@{revision} complete (a pinned commit: the Hub is not asked)", flush=True)
        return
    try:
        commit = _commit(endpoint, repo, revision, token)
        files = _tree(endpoint, repo, commit, token)
    except (OSError, http.client.HTTPException, ValueError) as error:
        # OSError covers URLError, timeouts and refused connections; ValueError a page that is not JSON.
        if isinstance(error, urllib.error.HTTPError) and error.code not in (408, 429) and error.code < 500:
            raise  # the Hub answered: a wrong repo or token is not an outage
        try:
            with open(os.path.join(root, "refs", "main")) as ref:
                cached = ref.read().strip()
        except OSError:
            cached = None
        if cached is None or not _intact(root, cached):
            sys.exit(f"prefetch: the Hub is unreachable ({error}) and {repo}@{revision} was never fetched completely")
        print(f"prefetch: the Hub is unreachable ({error}); starting from {repo}@{cached}, "
              f"the last complete commit fetched", flush=True)
        return
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
            ref.write(commit)
    _point_main_at(root, commit)
    # Last: the files it lists, with their sizes, checked again by every later start.
    with open(_marker(root, commit), "w") as marker:
        json.dump(sizes, marker)
    _durable(_marker(root, commit))
    print(f"prefetch: {repo}@{commit} complete ({len(files)} files)", flush=True)


if __name__ == "__main__":
    main()
