"""What a preview and a render cost: ``make bench`` (prints a table, writes bench/results/bench.json).

Every figure comes from fresh processes, so Python start-up and imports count as they do for a
user. Wall time is the median of several runs; peak RSS is the process's own maximum. Nothing
here asserts a timing: it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from common.constants import LLAMACPP_IMAGE_BUILD

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable

# pulumi_kubernetes loads a resource class's module, and the kind group's shared _inputs/outputs
# (networking.v1's alone ~70 ms), on first use of the class: any program that creates those kinds
# pays it. The floor touches the classes this program creates, so that "over the floor" is the
# program's own cost. (Before 2026-12-03 the floor imported the packages only; docs/performance.md gives both.)
FLOOR = """
import pulumi, pulumi_kubernetes
import pulumi_kubernetes.core.v1, pulumi_kubernetes.apps.v1, pulumi_kubernetes.networking.v1
import pulumi_kubernetes.policy.v1, pulumi_kubernetes.apiextensions
k8s = pulumi_kubernetes
used = (k8s.core.v1.Namespace, k8s.core.v1.Secret, k8s.core.v1.Service, k8s.core.v1.PersistentVolumeClaim,
        k8s.apps.v1.Deployment, k8s.apps.v1.StatefulSet, k8s.networking.v1.Ingress, k8s.networking.v1.NetworkPolicy,
        k8s.policy.v1.PodDisruptionBudget, k8s.apiextensions.CustomResource)
class M(pulumi.runtime.Mocks):
    def new_resource(self, args): return args.name, args.inputs
    def call(self, args): return {}, None
pulumi.runtime.set_mocks(M(), project="inference-plane", stack="floor", preview=False)
"""


# What the Pulumi SDK alone costs per registration under its mock engine: N bare Deployments.
SDK_PER_RESOURCE = FLOOR + """
import sys
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await
spec = {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}},
        "spec": {"containers": [{"name": "c", "image": "i:1", "args": ["--a", "1"]}]}}}
def program():
    for i in range(int(sys.argv[1])):
        pulumi_kubernetes.apps.v1.Deployment(f"d{i}", metadata={"name": f"d{i}"}, spec=spec)
_sync_await(run_pulumi_func(program))
"""


def run_once(argv: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (MiB) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"bench: {' '.join(argv[:4])} failed: {stderr.strip()}")
    return elapsed, usage.ru_maxrss // 1024


def measure(argv: list[str], runs: int) -> dict:
    samples = [run_once(argv) for _ in range(runs)]
    return {"seconds": statistics.median(s for s, _ in samples), "peak_rss_mib": max(r for _, r in samples)}


def synthetic_stack(servers: int) -> dict:
    """N small CPU-only chat servers on enough nodes, and a gateway route per server with a remote fallback."""
    models = {
        f"m{i}": {
            "role": "chat",
            "name": f"chat-{i}",
            "hf_repo": "Qwen/Qwen3-0.6B-GGUF:Q8_0",  # 0.6 GiB: what the synthetic servers need to be small
            "image": f"ghcr.io/ggml-org/llama.cpp:server-b{LLAMACPP_IMAGE_BUILD}",
            "node_pool": "cpu",
            "gpu_layers": 0,
            "threads": 1,  # within the 1-CPU limit
            "ctx_size": 4096,
            "cache_ram_mib": 0,
            "ctx_checkpoints": 0,
            "api_key": {"secret_name": f"chat-{i}-key", "from_config": f"key_{i}"},
            "resources": {"cpu_request": "100m", "cpu_limit": "1"},
        }
        for i in range(servers)
    }
    config = {
        "node_pools": {"cpu": {"nodes": servers, "memory": "64Gi", "allocatable": "60Gi", "backend": "cpu"}},
        # The seed's cluster (Cilium, monitoring, rook-ceph, CephFS shared by every node), said explicitly
        # since the defaults became k3s': the figures stay comparable with the earlier ones.
        "cluster": {"cni": "cilium", "ingress": {"namespace": "ingress"}, "monitoring": {"namespace": "monitoring"},
                    "storage": {"namespace": "rook-ceph"}},
        "model_cache": {"storage_class": "ceph-filesystem", "access_mode": "ReadWriteMany",
                        "size": f"{max(40, servers)}Gi"},  # holds 0.5 GiB per server
        "models": models,
        "gateway": {
            "hostname": "inference.example.org",
            # A LAN load balancer: a tailscale gateway must be named as its tailnet device.
            "load_balancer_class": None,
            "load_balancer_reason": "the seed cluster's MetalLB on its LAN",
            "tls_secret": "inference-tls",
            "master_key_config": "master_key",
            "clients": {"bench": {}},
            "tiers": {
                **{f"t{i}": {"local": f"m{i}"} for i in range(servers)},
                "remote": {"remote": {"host": "openrouter.ai", "prefix": "/api/v1", "api_key_config": "remote_key"}},
            },
            "routes": [
                # The local tier gets a name of its own, so the fallback alert can tell it from the remote.
                {"model": f"acme/model-{i}", "backends": [{"tier": f"t{i}", "model": f"local-{i}"}, {"tier": "remote"}]}
                for i in range(servers)
            ],
            "catch_all": ["remote"],
        },
        "observability": {},
    }
    stack = {f"inference-plane:{k}": v for k, v in config.items()}
    stack["inference-plane:master_key"] = {"secure": "v1:YmVuY2g="}
    stack["inference-plane:remote_key"] = {"secure": "v1:YmVuY2g="}
    stack.update({f"inference-plane:key_{i}": {"secure": "v1:YmVuY2g="} for i in range(servers)})
    return {"config": stack}


def count_manifests(out: Path) -> int:
    return sum(1 for p in out.glob("*.yaml") if p.name != "kustomization.yaml")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="*", default=[1, 10, 50, 200])
    parser.add_argument("--skip-tests", action="store_true")
    args = parser.parse_args()
    rows: list[dict] = []
    floor = measure([PYTHON, "-c", FLOOR], args.runs)
    rows.append({"case": "floor (imports + mocks)", "resources": 0, **floor})
    sdk_n = 500
    sdk = measure([PYTHON, "-c", SDK_PER_RESOURCE, str(sdk_n)], args.runs)
    rows.append({"case": f"SDK alone: {sdk_n} Deployments", "resources": sdk_n, **sdk})
    sdk_ms = (sdk["seconds"] - floor["seconds"]) / sdk_n * 1000
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        for stack in ("homelab", "strix-halo"):
            out = tmp_path / stack
            result = measure([PYTHON, "-m", "render", stack, "--out", str(out)], args.runs)
            rows.append({"case": f"render {stack}", "resources": count_manifests(out), **result})
        synthetic = []
        for size in args.sizes:
            name = f"synthetic-{size}"
            (tmp_path / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump(synthetic_stack(size)))
            out = tmp_path / name
            result = measure(
                [PYTHON, "-m", "render", name, "--out", str(out), "--stack-dir", str(tmp_path)],
                args.runs if size <= 50 else max(3, args.runs // 2),
            )
            row = {"case": f"render {size} servers", "resources": count_manifests(out), **result}
            rows.append(row)
            synthetic.append(row)
    if len(synthetic) >= 2:
        # Least-squares slope of time over resources: the marginal cost of one more resource.
        xs = [r["resources"] for r in synthetic]
        ys = [r["seconds"] for r in synthetic]
        mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    else:
        slope = float("nan")
    for row in rows:
        row["over_floor_s"] = row["seconds"] - floor["seconds"]
    tests = None
    if not args.skip_tests:
        start = time.perf_counter()
        suite = subprocess.run([PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tests = time.perf_counter() - start
        if suite.returncode != 0:
            summary = suite.stdout.strip().splitlines()[-1] if suite.stdout.strip() else f"exit {suite.returncode}"
            raise SystemExit(f"bench: the test suite failed ({summary}); run make test to see why, or make bench "
                             "with --skip-tests")

    print(f"{'case':<26}{'resources':>10}{'seconds':>9}{'over floor':>12}{'peak RSS MiB':>14}")
    for row in rows:
        print(f"{row['case']:<26}{row['resources']:>10}{row['seconds']:>9.3f}{row['over_floor_s']:>12.3f}{row['peak_rss_mib']:>14}")
    print(f"marginal cost: {slope * 1000:.2f} ms per resource (least squares over the synthetic stacks)")
    print(f"  of which the Pulumi SDK's own registration: {sdk_ms:.2f} ms; the program's: {slope * 1000 - sdk_ms:.2f} ms")
    if tests is not None:
        print(f"test suite: {tests:.1f} s")
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "bench.json").write_text(
        json.dumps(
            {
                "rows": rows,
                "marginal_ms_per_resource": slope * 1000,
                "sdk_ms_per_resource": sdk_ms,
                "test_suite_s": tests,
                "cpus": os.cpu_count(),
            },
            indent=2,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
