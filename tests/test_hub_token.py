"""A Hugging Face token for gated repos (model_cache.hub_token): from the user's Secret, as HF_TOKEN, to
every container that downloads and to no other; the real downloaders (llama-server's --hf-repo, the
router's init container) send it to the Hub."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

from conftest import ROOT
from render.output import PREREQUISITES_FILE, render_stack

from lab.contract.hub import hub_repos

TOKEN = {"secret_name": "hf-token", "secret_key": "token"}
REF = {"secretKeyRef": {"name": "hf-token", "key": "token"}}
# Shaped as a real one: llama.cpp sends a token to the Hub's API only when it is hf_ and 34 or more
# letters or digits (common/hf-cache.cpp:140-206); any other it drops there, with a warning.
FAKE_TOKEN = "hf_" + "a1B2c3D4e5" * 4


def render_with_token(tmp_path, stack: str):
    config = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())
    config["config"]["inference-plane:model_cache"]["hub_token"] = TOKEN
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return render_stack(stack, tmp_path / "out", project_dir=tmp_path)


def token_holders(result) -> dict[str, bool]:
    """container name (workload/container) -> whether it gets HF_TOKEN from the Secret."""
    found = {}
    for m in result.files.values():
        if m["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = m["spec"]["template"]["spec"]
        for c in (pod.get("initContainers") or []) + pod["containers"]:
            env = {e["name"]: e for e in c.get("env") or []}
            found[f"{m['metadata']['name']}/{c['name']}"] = env.get("HF_TOKEN", {}).get("valueFrom") == REF
            assert "value" not in env.get("HF_TOKEN", {})  # never a literal
    return found


def test_the_token_reaches_the_downloaders_only(tmp_path):
    library = token_holders(render_with_token(tmp_path / "a", "rtx3090-library"))
    assert library == {"llama-library/prefetch": True, "llama-library/llama-library": False, "llama-library/library": True,
                       "llama-library/admission": False}
    # llama.cpp single-model servers download themselves (--hf-repo reads HF_TOKEN).
    assert token_holders(render_with_token(tmp_path / "b", "rtx3060")) == {
        "llama-chat/llama-chat": True, "llama-embed/llama-embed": True}
    # A prefetched engine reads its claim offline: its init container downloads, the engine does not.
    strix = token_holders(render_with_token(tmp_path / "c", "strix-halo"))
    assert strix["halogen-flash/prefetch"] is True and strix["halogen-flash/halogen-flash"] is False


def test_the_token_secret_is_a_prerequisite_the_folder_never_holds(tmp_path):
    result = render_with_token(tmp_path, "rtx3060")
    assert "- Secret hf-token in namespace ai (yours, key token): for Deployment llama-chat, Deployment llama-embed" in (
        result.out / PREREQUISITES_FILE).read_text()
    assert not [m for m in result.files.values() if m["kind"] == "Secret" and m["metadata"]["name"] == "hf-token"]


def test_the_real_downloaders_send_it(binary, tmp_path):
    """llama-server --hf-repo and the router's init container, with HF_TOKEN as the pod sets it."""
    repo, files = "org/Gated-GGUF", {"Gated-Q4_K_M.gguf": b"g" * 64}
    log: list[str] = []
    with hub_repos({repo: files}, log=log) as endpoint:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LLAMA_CACHE": str(tmp_path / "cache"),
               "MODEL_ENDPOINT": endpoint, "HF_TOKEN": FAKE_TOKEN}
        subprocess.run([str(binary), "--hf-repo", f"{repo}:Q4_K_M", "--port", "0"], env=env, capture_output=True, timeout=120)
        server = [line for line in log if "/resolve/" in line or "/api/models/" in line]
        log.clear()
        from components.programs import INCLUSTER

        (tmp_path / "etc").mkdir()
        (tmp_path / "etc" / "library.json").write_text(json.dumps({"gated": f"{repo}:Q4_K_M"}))
        (tmp_path / "etc" / "models.ini").write_text("[gated]\nctx-size = 512\n")
        init_env = {"PATH": os.environ["PATH"], "HF_ENDPOINT": endpoint, "HF_TOKEN": FAKE_TOKEN,
                    "HF_LIBRARY": str(tmp_path / "etc" / "library.json"), "PRESET": str(tmp_path / "etc" / "models.ini"),
                    "SERVED_PRESET": str(tmp_path / "served.ini"), "HUB_CACHE": str(tmp_path / "hub"),
                    "LIBRARY_DIR": str(tmp_path / "library"), "HOME": str(tmp_path),
                    "HEARTBEAT": str(tmp_path / "heartbeat")}
        done = subprocess.run([sys.executable, "-B", "-E", "-s", str(INCLUSTER / "library.py")], env=init_env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        ours = [line for line in log if "/resolve/" in line or "/api/models/" in line]
    assert server and all(line.endswith(f"Authorization: Bearer {FAKE_TOKEN}") for line in server)
    assert ours and all(line.endswith(f"Authorization: Bearer {FAKE_TOKEN}") for line in ours)
