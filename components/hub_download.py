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

Environment: HF_REPO, HF_REVISION (a branch, or a 40-hex commit), HF_HOME; optional HF_ENDPOINT
and HF_TOKEN.
"""

import json
import os
import re
import sys
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


def main():
    repo, revision = os.environ["HF_REPO"], os.environ.get("HF_REVISION", "main")
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/") + "/"
    token = os.environ.get("HF_TOKEN")
    root = os.path.join(os.environ["HF_HOME"], "hub", "models--" + repo.replace("/", "--"))
    commit = _commit(endpoint, repo, revision, token)
    files = [f for f in _json(f"{endpoint}api/models/{repo}/tree/{commit}?recursive=true", token) if f.get("type") == "file"]
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
    print(f"prefetch: {repo}@{commit} complete ({len(files)} files)", flush=True)


if __name__ == "__main__":
    main()
