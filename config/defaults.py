"""Defaults that encode a lesson, each with its reason. Small defaults sit on their fields."""

from __future__ import annotations

# Hugging Face serves repo metadata from huggingface.co and the files from its CDN and Xet
# storage hosts (cdn-lfs*.hf.co, cas-bridge.xethub.hf.co), so all of them are needed.
MODEL_HUB_HOSTS = ["huggingface.co", "*.huggingface.co", "hf.co", "*.hf.co", "*.xethub.hf.co"]

# The prefetch init container's image: Python's standard library is all the downloader
# (incluster/hub_download.py) needs, so nothing is installed at start.
PREFETCH_IMAGE = "docker.io/library/python:3.12.11-slim-bookworm"

# Who may reach an exposed chat endpoint: the private address ranges (RFC 1918), carrier-grade
# NAT (RFC 6598, where Tailscale addresses live) and IPv6 unique-local ones. A home router's port
# forward or a misplaced LoadBalancer then still cannot open the API to the internet.
PRIVATE_SOURCE_RANGES = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7"]
