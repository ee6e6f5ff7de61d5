"""Write a working stack file (Pulumi.<NAME>.yaml) for your hardware, every value commented.

    python -m tools.new_stack NAME --gpu {none,nvidia,amd,intel-arc,intel-igpu,amd-apu} [--vram GiB] --ram GiB
        [--nodes N] [--cpus N] [--p-cores N] [--e-cores N] [--arch amd64|arm64] [--image IMAGE]
        [--ram-bandwidth GB/s] [--vram-bandwidth GB/s] [--render-gids 44,992]
        [--cni flannel|cilium|calico] [--ingress traefik-k3s|nginx|none]
        [--storage local-path|longhorn|ceph-filesystem|nfs-client] [--issuer NAME|none]
        [--host LAN-HOST] [--monitoring NAMESPACE|none] [--namespace ai]
        [--kubernetes-version 1.33] [--out PATH] [--force]

(from the project folder; `make new-stack ARGS="NAME ..."` runs it). The command: the flags checked
and turned into a Hardware and a Cluster (hardware(), cluster_of()), the models chosen (choice.py),
the file written with the summary printed (run(), main()). The stack written is checked the same way
before it is written (read back, validated and planned). Bad input: one line on stderr (the flag,
what is wrong, the fix), exit status 2, nothing written.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

from common.constants import PINNED_IMAGE, PROJECT
from common.errors import one_line
from common.quantity import GIB, parse_quantity
from config.images import backend_of_image
from config.values import _DNS_LABEL, _DNS_NAME, _HOSTNAME
from config.catalog import lookup
from tools.new_stack.candidates import IMAGES
from tools.new_stack.choice import EMBED_SHARE, Choice, NoFit, choose, decode_floor
from tools.new_stack.hardware import DISCRETE, INGRESS, KINDS, STORAGE, Cluster, Hardware
from tools.new_stack.stack_file import build_config, gi_quantity, stack_text, stack_values

ROOT = Path(__file__).resolve().parents[2]
EXIT_BAD_INPUT = 2


class BadInput(Exception):
    """One line: the flag, what is wrong, the fix."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors, one line too
        raise BadInput(f"{message}; see --help")


def parser() -> Parser:
    p = Parser(prog="python -m tools.new_stack", description=__doc__.splitlines()[0],
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", metavar="NAME", help="stack name: writes Pulumi.NAME.yaml")
    p.add_argument("--gpu", required=True, choices=sorted(KINDS), help="the node's GPU, if any")
    p.add_argument("--vram", type=float, metavar="GiB", help="memory of the card (required with --gpu nvidia, amd, intel-arc)")
    p.add_argument("--ram", type=float, required=True, metavar="GiB", help="physical memory of one node")
    p.add_argument("--nodes", type=int, default=1, help="identical nodes (default 1)")
    p.add_argument("--cpus", type=int, help="CPUs of one node, as nproc counts them (default 8; 4 on arm64)")
    p.add_argument("--p-cores", type=int, metavar="N",
                   help="physical performance cores of one node, where --cpus counts SMT siblings or efficiency "
                        "cores too (lscpu); the chat server runs one thread per P-core")
    p.add_argument("--e-cores", type=int, metavar="N", help="efficiency cores of a hybrid CPU (default 0; needs --p-cores)")
    p.add_argument("--arch", choices=("amd64", "arm64"), default="amd64", help="the nodes' CPU architecture")
    p.add_argument("--image", help="a pinned llama.cpp server image to run instead of the project's (required on arm64)")
    p.add_argument("--ram-bandwidth", type=float, metavar="GB/s", help="sustained memory bandwidth of one node")
    p.add_argument("--vram-bandwidth", type=float, metavar="GB/s", help="the card's memory bandwidth")
    p.add_argument("--render-gids", metavar="GID,GID",
                   help="the node's video and render GIDs (`getent group video render`; default for AMD and Intel Arc: 44,992)")
    p.add_argument("--cni", choices=("flannel", "cilium", "calico"), default="flannel")
    p.add_argument("--ingress", choices=("traefik-k3s", "nginx", "none"), default="traefik-k3s")
    p.add_argument("--storage", choices=sorted(STORAGE), default="local-path")
    p.add_argument("--issuer", default="none", metavar="NAME|none", help="cert-manager ClusterIssuer (needed with --host)")
    p.add_argument("--host", help="expose the chat endpoint on the LAN at this host name (an Ingress, TLS, an API key)")
    p.add_argument("--monitoring", default="none", metavar="NAMESPACE|none",
                   help="namespace of a VictoriaMetrics scraper: adds scrapes and alert rules")
    p.add_argument("--namespace", default="ai", help="the namespace the servers live in (default ai)")
    p.add_argument("--kubernetes-version", default="1.33", metavar="1.NN")
    p.add_argument("--out", type=Path, help="where to write (default: Pulumi.NAME.yaml in the project)")
    p.add_argument("--force", action="store_true", help="replace an existing file")
    return p


ARM64_IMAGES = (f"the project pins {IMAGES['cpu']}, and this tool cannot confirm that tag has "
                "a linux/arm64 image (upstream stopped building arm64 images, ggml-org/llama.cpp#11888, still missing "
                f"in #19177, re-enabled by #20929); if `docker manifest inspect {IMAGES['cpu']}` "
                "lists linux/arm64, pass that, else your own arm64 llama-server build, as --image (decode predictions "
                "use the CPU profile measured on x86)")


def hardware(args: argparse.Namespace) -> Hardware:
    if not 0 < args.ram <= 4096:
        raise BadInput(f"--ram {args.ram:g}: not a node's memory in GiB; give e.g. --ram 64")
    if args.gpu in DISCRETE:
        if args.vram is None:
            raise BadInput(f"--vram: required with --gpu {args.gpu}; give the card's memory in GiB, e.g. --vram 16")
        if not 1 <= args.vram <= 192:
            raise BadInput(f"--vram {args.vram:g}: not a card's memory in GiB; give e.g. --vram 16")
    elif args.vram is not None:
        raise BadInput(f"--vram: only for a discrete card; {args.gpu} uses the node's memory (--ram): drop --vram")
    if args.vram_bandwidth is not None and args.gpu not in DISCRETE:
        raise BadInput(f"--vram-bandwidth: only for a discrete card (--gpu {', '.join(DISCRETE)}); drop it")
    if not 1 <= args.nodes <= 1000:
        raise BadInput(f"--nodes {args.nodes}: give 1 to 1000")
    cpus = args.cpus if args.cpus is not None else (4 if args.arch == "arm64" else 8)
    if not 1 <= cpus <= 1024:
        raise BadInput(f"--cpus {cpus}: give the node's cores, 1 to 1024")
    p_cores, e_cores = args.p_cores, args.e_cores or 0
    if args.e_cores is not None and p_cores is None:
        raise BadInput(f"--e-cores {args.e_cores}: give --p-cores too (the performance cores; lscpu shows both)")
    if p_cores is not None:
        # Each P-core with at most two SMT siblings, each E-core one CPU: what nproc counts lies between.
        if not (1 <= p_cores and 0 <= e_cores and p_cores + e_cores <= cpus <= 2 * p_cores + e_cores):
            raise BadInput(f"--p-cores {p_cores} --e-cores {e_cores}: with --cpus {cpus} a node has between "
                           f"{p_cores + e_cores} and {2 * p_cores + e_cores} CPUs; give the counts lscpu shows (e.g. 6P+4E "
                           "with SMT: --cpus 16 --p-cores 6 --e-cores 4)")
    for flag, value in (("--ram-bandwidth", args.ram_bandwidth), ("--vram-bandwidth", args.vram_bandwidth)):
        if value is not None and not 1 <= value <= 20_000:
            raise BadInput(f"{flag} {value:g}: give GB/s, e.g. 50")
    if args.arch == "arm64" and args.gpu != "none":
        raise BadInput(f"--arch arm64 --gpu {args.gpu}: llama.cpp's CUDA and Vulkan images are published for "
                       "linux/amd64 only and the project pins no arm64 GPU build; use --gpu none (CPU) on arm64")
    if args.arch == "arm64" and args.image is None:
        raise BadInput(f"--arch arm64: {ARM64_IMAGES}")
    if args.image is not None:
        if not PINNED_IMAGE.fullmatch(args.image):
            raise BadInput(f"--image {args.image!r}: not a pinned image; give registry/name:<build tag> or @sha256:<digest>")
        named = backend_of_image(args.image)
        if named is not None and named != KINDS[args.gpu][1]:
            raise BadInput(f"--image {args.image}: llama.cpp's {named} build, but --gpu {args.gpu} runs the "
                           f"{KINDS[args.gpu][1]} build; give that image")
        if args.gpu != "none":
            raise BadInput("--image: only with --gpu none (one CPU image runs both servers); drop it")
    gids: tuple[int, ...] = ()
    if args.render_gids is not None:
        if args.gpu not in ("intel-igpu", "amd-apu", "amd", "intel-arc"):
            raise BadInput("--render-gids: only for an AMD or Intel GPU (/dev/dri access); drop it")
        try:
            gids = tuple(int(g) for g in args.render_gids.split(",") if g.strip())
        except ValueError:
            raise BadInput(f"--render-gids {args.render_gids!r}: give numeric GIDs, e.g. 44,992") from None
        if not gids or any(g < 0 for g in gids):
            raise BadInput(f"--render-gids {args.render_gids!r}: give numeric GIDs, e.g. 44,992")
        if 0 in gids:
            raise BadInput(f"--render-gids {args.render_gids!r}: 0 is root's group (the pods would open every root-group "
                           "file on their mounts); give the render and video groups' GIDs: getent group render video")
    elif args.gpu in ("amd-apu", "amd", "intel-arc"):
        gids = (44, 992)  # video on Debian/Ubuntu; render as on the strix-halo stack's nodes (check: getent group)
    vram_bw, vram_why, profile = None, "", None
    if args.gpu in DISCRETE:
        cards = DISCRETE[args.gpu]
        size, bandwidth, card, *profiled = next((c for c in cards if c[0] >= args.vram), cards[-1])
        profile = profiled[0] if profiled else None
        if args.vram_bandwidth is not None:
            vram_bw, vram_why = args.vram_bandwidth, "--vram-bandwidth: the card's memory bandwidth (GB/s), for the decode prediction."
        else:
            vram_bw = bandwidth
            vram_why = (f"Assumed for a {args.vram:g} GiB card: {card}. The decode prediction scales with it: "
                        "give your card's with --vram-bandwidth.")
    if args.ram_bandwidth is not None:
        ram_bw, ram_why = args.ram_bandwidth, "--ram-bandwidth: sustained memory bandwidth of one node (GB/s)."
    elif args.arch == "arm64":
        ram_bw, ram_why = 10.0, ("Assumed: a Raspberry Pi 5's 32-bit LPDDR4X sustains about 10 GB/s; give yours with "
                                 "--ram-bandwidth (for the decode prediction).")
    elif args.gpu == "amd-apu":
        ram_bw, ram_why = 215.0, ("Assumed: Strix Halo's 256-bit LPDDR5X-8000 sustains about 215 GB/s; a Ryzen "
                                  "7040/8040 APU on DDR5 has about 70: give yours with --ram-bandwidth.")
    else:
        ram_bw, ram_why = 50.0, ("Assumed: dual-channel DDR4-3200 sustains about 45-50 GB/s (DDR5-5600 about 70); "
                                 "give yours with --ram-bandwidth (for the decode prediction).")
    return Hardware(gpu=args.gpu, ram_gib=args.ram, vram_gib=args.vram, nodes=args.nodes, cpus=cpus, p_cores=p_cores, e_cores=e_cores,
                    arch=args.arch,
                    ram_bandwidth=ram_bw, ram_bandwidth_why=ram_why, vram_bandwidth=vram_bw,
                    vram_bandwidth_why=vram_why, render_gids=gids, image=args.image, profile=profile)


def cluster_of(args: argparse.Namespace) -> Cluster:
    from kubernetes_validate import utils as kv

    issuer = None if args.issuer == "none" else args.issuer
    if issuer is not None and not re.fullmatch(_DNS_NAME, issuer):
        raise BadInput(f"--issuer {issuer!r}: not a ClusterIssuer name (lower-case letters, digits, '-', '.'); "
                       "give yours (kubectl get clusterissuer) or none")
    if args.host is not None:
        if not re.fullmatch(_HOSTNAME, args.host):
            raise BadInput(f"--host {args.host!r}: not a fully qualified host name; give e.g. llm.lan.example.org")
        if args.ingress == "none":
            raise BadInput("--host: exposing the chat endpoint needs an ingress controller; give --ingress "
                           "traefik-k3s or nginx, or drop --host")
        if issuer is None:
            raise BadInput("--host: the Ingress's TLS certificate comes from a cert-manager ClusterIssuer; give "
                           "--issuer NAME (kubectl get clusterissuer), or drop --host")
    monitoring = None if args.monitoring == "none" else args.monitoring
    if monitoring is not None and not re.fullmatch(_DNS_LABEL, monitoring):
        raise BadInput(f"--monitoring {monitoring!r}: not a namespace name; give e.g. monitoring, or none")
    if not re.fullmatch(_DNS_LABEL, args.namespace):
        raise BadInput(f"--namespace {args.namespace!r}: not a namespace name; give e.g. ai")
    reserved = {"kube-system", "kube-public", "kube-node-lease", "default", monitoring,
                INGRESS.get(args.ingress, (None,) * 5)[2], STORAGE[args.storage][2]}
    if args.namespace in reserved:
        raise BadInput(f"--namespace {args.namespace}: a system or peer namespace; the stack denies all traffic "
                       "there that it does not list: give one of its own, e.g. ai")
    versions = sorted({kv.major_minor(v) for v in kv.all_versions()}, key=lambda v: int(v.split(".")[1]))
    if args.kubernetes_version not in versions:
        raise BadInput(f"--kubernetes-version {args.kubernetes_version}: no schemas for it; give one of "
                       f"{', '.join(versions)}")
    return Cluster(cni=args.cni, ingress=args.ingress, storage=args.storage, issuer=issuer, host=args.host,
                   monitoring=monitoring, namespace=args.namespace, kubernetes_version=args.kubernetes_version)


def command_line(args: argparse.Namespace, hw: Hardware) -> str:
    parts = [f"python -m tools.new_stack {args.name} --gpu {args.gpu}"]
    if args.vram is not None:
        parts.append(f"--vram {args.vram:g}")
    parts.append(f"--ram {args.ram:g}")
    defaults = {"nodes": 1, "arch": "amd64", "cni": "flannel", "ingress": "traefik-k3s", "storage": "local-path",
                "issuer": "none", "monitoring": "none", "namespace": "ai", "kubernetes_version": "1.33"}
    for key in ("nodes", "cpus", "p_cores", "e_cores", "arch", "image", "ram_bandwidth", "vram_bandwidth", "render_gids", "cni", "ingress",
                "storage", "issuer", "host", "monitoring", "namespace", "kubernetes_version"):
        value = getattr(args, key)
        if value is None or defaults.get(key) == value:
            continue
        parts.append(f"--{key.replace('_', '-')} {value:g}" if isinstance(value, float) else f"--{key.replace('_', '-')} {value}")
    return " ".join(parts)


def machine(hw: Hardware) -> str:
    what = KINDS[hw.gpu][4]
    card = f" with {hw.vram_gib:g} GiB of VRAM" if hw.discrete else ""
    nodes = f"{hw.nodes} x " if hw.nodes > 1 else ""
    cores = f"{hw.cpus} CPUs ({hw.p_cores}P" + (f"+{hw.e_cores}E" if hw.e_cores else "") + ")" if hw.p_cores else f"{hw.cpus} cores"
    return f"{nodes}{what}{card}, {hw.ram_gib:g} GiB RAM, {cores}, {hw.arch}"


def describe(choice: Choice, hw: Hardware) -> dict[str, str]:
    """The summary's facts, for the header and stdout."""
    plan = choice.plan
    chat = plan.servers["chat"]
    embed = plan.servers["embed"]
    facts = lookup(choice.chat.candidate.repo)
    moe = f", {facts.active_params_b:g}B active" if facts.active_params_b else ""
    predicted = chat.decode_predicted_tok_s or {}
    speed = (f"{predicted['half']:.1f} tok/s at half context ({predicted['empty']:.1f} empty, {predicted['full']:.1f} "
             "full)" if predicted else "not predicted")
    node = plan.nodes[0]
    memory = f"{chat.estimate.total_gib:.1f} GiB of system RAM (limit {chat.memory_limit})"
    if chat.vram is not None:
        card = float(parse_quantity(gi_quantity(hw.vram_gib))) / GIB
        memory = (f"{chat.vram.total_gib:.1f} of {card:g} GiB VRAM, {chat.vram.breakdown().split(':')[0]}; " + memory)
    reason = (f"the largest catalog chat model that fits with {choice.chat.ctx_size} tokens of context and is predicted "
              f"at >= {decode_floor(hw):g} tok/s" if not choice.slow else
              f"no model that fits is predicted at >= {decode_floor(hw):g} tok/s: the fastest that fits")
    return {
        "chat": f"{choice.chat.candidate.hf_repo} ({facts.params_b:g}B{moe}), ctx {choice.chat.ctx_size}",
        "why": reason,
        "passed": "; ".join(choice.passed_over[-2:]) if choice.passed_over else "none bigger in the catalog",
        "memory": memory,
        "speed": speed + (f", bound {chat.decode_bound_tok_s:.1f}" if chat.decode_bound_tok_s else ""),
        "embed": (f"{choice.embed.hf_repo} on the CPU, {embed.estimate.total_gib:.1f} GiB (the best within an eighth "
                  f"of the node, {hw.offers_gib() * EMBED_SHARE:.1f} GiB)"),
        "node": f"node 1 planned {node.planned_gib:.1f} of {node.offers_gib:.1f} GiB offered (allocatable less reserved)",
    }


def write_atomically(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def check_written(text: str, expected: dict[str, Any]) -> Any:
    """The text read back as the program reads a stack file: the same values, valid, planned."""
    from plane import parse_stack, plan_capacity

    document = yaml.safe_load(text)
    prefix = f"{PROJECT}:"
    values = {k[len(prefix):]: v for k, v in document["config"].items() if k.startswith(prefix)}
    values = {k: v for k, v in values.items() if not (isinstance(v, dict) and "secure" in v)}
    assert values == expected, "the written text does not read back as the planned values"
    return plan_capacity(parse_stack(values))


def run(argv: Sequence[str]) -> tuple[Path, str, list[str]]:
    """(the path, its text, the summary lines); raises BadInput."""
    args = parser().parse_args(list(argv))
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", args.name):
        raise BadInput(f"NAME {args.name!r}: a stack name is letters, digits, '_', '.' and '-'; give e.g. homelab")
    hw = hardware(args)
    cluster = cluster_of(args)
    out = args.out or ROOT / f"Pulumi.{args.name}.yaml"
    if out.is_dir():
        raise BadInput(f"--out {out}: a folder; give the stack file's path, e.g. {out / f'Pulumi.{args.name}.yaml'}")
    if not out.parent.is_dir():
        raise BadInput(f"--out {out}: its folder {out.parent} does not exist; create it or give another path")
    if out.exists() and not args.force:
        raise BadInput(f"{out}: already exists; choose another NAME or --out, or pass --force to replace it")
    if not out.parent.is_dir():
        raise BadInput(f"--out {out}: folder {out.parent} does not exist; create it or write elsewhere")
    try:
        choice = choose(hw, cluster)
    except NoFit as error:
        raise BadInput(f"--ram {hw.ram_gib:g}" + (f" --vram {hw.vram_gib:g}" if hw.discrete else "") +
                       f": no catalog chat model fits this machine (smallest: {error}); more memory is needed") from None
    weights = sum(float(parse_quantity(s.weights)) / GIB for s in choice.plan.servers.values())
    cache = max(10, math.ceil(weights * 1.25))
    config = build_config(hw, cluster, choice.chat, choice.embed, cache)
    facts = describe(choice, hw)
    header = [
        f"{machine(hw)}: written by",
        f"  {command_line(args, hw)}",
        "",
        f"Chat: {facts['chat']}: {facts['why']}. Passed over: {facts['passed']}.",
        f"  Memory: {facts['memory']}.",
        f"  Decode ~{facts['speed']} (engines/llamacpp_speed.py, from the bandwidths below).",
        f"Embeddings: {facts['embed']}.",
        f"Plan: {facts['node']}. Memory requests and limits come from the plan.",
        "No gateway, no monitoring objects" + (", an Ingress for the chat endpoint" if cluster.host else ", nothing "
                                               "exposed: reach the chat with kubectl port-forward svc/llama-chat 8080")
        + ". Render it offline first: python -m render " + args.name,
    ]
    if cluster.host:
        header.append("The secret below is a placeholder: set it with `pulumi config set --secret chat_api_key <key>`.")
    header = [wrapped for line in header for wrapped in (textwrap.wrap(line, 98, subsequent_indent="  ") or [""])]
    text = stack_text(header, config)
    plan = check_written(text, stack_values(config))
    assert plan.fits() and not plan.warnings
    summary = [
        f"wrote {out}: {machine(hw)}",
        f"  chat:  {facts['chat']}",
        f"         why: {facts['why']}; passed over: {facts['passed']}",
        f"         memory: {facts['memory']}",
        f"         decode ~{facts['speed']}",
        f"  embed: {facts['embed']}",
        f"  {facts['node']}",
    ]
    if choice.slow:
        summary.append(f"  warning: no catalog model that fits is predicted at >= {decode_floor(hw):g} tok/s here; this is "
                       "the fastest that fits")
    if hw.arch == "arm64":
        summary.append("  note: arm64 runs --image; the decode prediction uses the CPU profile measured on x86")
    if hw.ram_bandwidth_why.startswith("Assumed") or hw.vram_bandwidth_why.startswith("Assumed"):
        summary.append("  note: bandwidths are assumed (see the file's comments): give --ram-bandwidth/--vram-bandwidth "
                       "for your machine's")
    if hw.p_cores is None and hw.cpus >= 8:
        summary.append(f"  check: the chat server runs a thread per CPU of --cpus ({hw.cpus}, less the embedding "
                       "server's); on a CPU with SMT or efficiency cores give --p-cores (and --e-cores), as lscpu shows")
    if hw.render_gids and args.render_gids is None:
        summary.append(f"  check: supplemental_groups {list(hw.render_gids)} are the video/render GIDs of the "
                       "strix-halo nodes; `getent group video render` on yours (--render-gids)")
    if cluster.host:
        summary.append("  secrets to set before `pulumi up`:")
        summary.append(f"    pulumi config set --stack {args.name} --secret chat_api_key \"$(openssl rand -hex 32)\"")
    else:
        summary.append("  secrets to set: none (nothing is exposed; add --host and --issuer for an Ingress with an API key)")
    summary.append(f"  next: python -m render {args.name}   then: pulumi stack init {args.name} && pulumi up")
    return out, text, summary


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        out, text, summary = run(sys.argv[1:] if argv is None else argv)
    except BadInput as error:
        print(one_line(f"new_stack: {error}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    write_atomically(out, text)
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
