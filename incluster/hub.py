"""The Hugging Face Hub as llama.cpp's own downloader reads it, for the downloaders that run in the pods
(hub_download.py: a single-model server's init container; library.py: a router's init container and
keeper): the commit a revision names, a commit's files, a resumable fetch, and the hub cache layout
that huggingface_hub and llama.cpp read offline.

The layout (huggingface_hub's file_download.py, v1.28): ``$HF_HOME/hub/models--<org>--<name>/`` with
``blobs/<etag>`` (the LFS sha256, else the git blob sha1), ``snapshots/<commit>/<path>`` a relative
symlink to the blob, and ``refs/<revision>`` holding the commit with no trailing newline. The Hub is
asked what llama.cpp's downloader asks (common/hf-cache.cpp at b10729): ``api/models/<repo>/refs`` and
``api/models/<repo>/tree/<commit>?recursive=true``, then ``<repo>/resolve/<commit>/<path>``.

Standard library only: this file runs in the pods (a plain pinned python image, no PyPI at start)."""


import json
import os
import re
import sys
import urllib.error
import urllib.request

COMMIT = re.compile(r"[0-9a-f]{40}")  # common.constants.COMMIT_ID (this file runs in the pod, apart from the program)


def get(url, token, headers=None):
    request = urllib.request.Request(url, headers={**({"Authorization": "Bearer " + token} if token else {}),
                                                   **(headers or {})})
    return urllib.request.urlopen(request, timeout=60)


def get_json(url, token):
    with get(url, token) as answer:
        return json.load(answer)


def tree(endpoint, repo, commit, token):
    """Every file of the commit: the Hub pages the listing (Link: <...>; rel="next")."""
    url, files = f"{endpoint}api/models/{repo}/tree/{commit}?recursive=true", []
    while url:
        with get(url, token) as answer:
            files += [f for f in json.load(answer) if f.get("type") == "file"]
            following = re.search(r'<([^>]+)>;\s*rel="next"', answer.headers.get("Link") or "")
        url = following.group(1) if following else None
    return files


def commit_of(endpoint, repo, revision, token):
    if COMMIT.fullmatch(revision):
        return revision
    refs = get_json(f"{endpoint}api/models/{repo}/refs", token)
    for ref in refs.get("branches", []) + refs.get("tags", []):
        if ref.get("name") == revision:
            return ref["targetCommit"]
    sys.exit(f"prefetch: {repo} has no branch or tag {revision!r}")


def durable(path):
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fetch(url, token, blob, size):
    partial = blob + ".incomplete"
    have = os.path.getsize(partial) if os.path.exists(partial) else 0
    with get(url, token, {"Range": f"bytes={have}-"} if have else None) as answer:
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
    durable(partial)  # on disk before the name says complete (a power cut must not leave a short blob)
    os.replace(partial, blob)


def marker(root, commit):
    return os.path.join(root, ".prefetch-complete-" + commit)


def intact(root, commit):
    """Whether the commit a marker says is complete still is: every file it lists is linked from the
    snapshot to a blob of its size (a cache cleanup or a lost write shows up here)."""
    try:
        with open(marker(root, commit)) as handle:
            files = json.load(handle)
        for path, size in files.items():
            link = os.path.join(root, "snapshots", commit, path)
            if not os.path.isfile(link) or (size is not None and os.path.getsize(link) != size):
                return False
    except (OSError, ValueError, AttributeError):
        return False
    return True


def point_main_at(root, commit):
    """The engines read revision main offline (they are given no other): main names the commit."""
    with open(os.path.join(root, "refs", "main"), "w") as ref:
        ref.write(commit)  # no newline: readers use the content as a folder name


def link(blob, link_path):
    """A relative symlink from link_path to the blob, replaced when it points elsewhere."""
    os.makedirs(os.path.dirname(link_path), exist_ok=True)
    target = os.path.relpath(blob, os.path.dirname(link_path))
    if os.path.islink(link_path) and os.readlink(link_path) != target:
        os.remove(link_path)
    if not os.path.lexists(link_path):
        os.symlink(target, link_path)
