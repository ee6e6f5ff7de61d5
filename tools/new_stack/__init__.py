"""`make new-stack`: a working stack file (Pulumi.<NAME>.yaml) for your hardware, every value
commented. Run as `python -m tools.new_stack NAME --gpu ... --ram GiB` (usage: cli.py).

The chat and embedding models are picked from the catalog (config/catalog.yaml) with the
program's own planner: for each candidate a stack is built, validated (plane.parse_stack) and
planned (plane.plan_capacity); only plans without problems or warnings are kept. The chat model is
the largest (most parameters) that fits with a usable context (8k tokens or more) and is predicted
to decode fast enough at half context (decode_floor: 20 tok/s on a discrete card, a reading pace of
5 tok/s elsewhere); the embedding model is the best that fits beside it in an eighth of the node.
The defaults are a single k3s node: Flannel with k3s' NetworkPolicy controller (kube-router), k3s'
Traefik in kube-system, local-path storage, no cert-manager issuer, no Ingress, no gateway, no
monitoring objects.

One module per job, each importing only those before it:
    hardware.py     the machines and clusters the flags describe (GPU kinds, typical cards, storage, ingress)
    candidates.py   the pinned llama.cpp images and the catalog models to choose from
    stack_file.py   the stack as commented values, and its YAML
    choice.py       each candidate planned; the chat model and the embedding model chosen
    cli.py          the flags, their checks, the file written and the summary (__main__.py runs it)
"""

from tools.new_stack.candidates import CHAT_CANDIDATES, EMBED_CANDIDATES, IMAGES
from tools.new_stack.choice import MIN_CTX, MIN_DECODE_TOK_S
from tools.new_stack.cli import main

__all__ = ["CHAT_CANDIDATES", "EMBED_CANDIDATES", "IMAGES", "MIN_CTX", "MIN_DECODE_TOK_S", "main"]
