"""Any OpenAI-compatible server other than llama.cpp (the Strix Halo engine): everything about it
comes from its `openai:` block, and its memory is what it is measured to lock."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional

from planning.memory import Estimate, discrete_resident, resident_estimate

from .base import Engine, Problem

if TYPE_CHECKING:
    from config.types import ModelServer, NodePool
    from planning.capacity import ServerPlan

# Settings only llama.cpp reads. Set on another engine they would be silently ignored, so they
# are refused; the engine's own flags go in openai.args.
LLAMACPP_SETTINGS = (
    "hf_repo", "api_key", "extra_args", "ubatch_size", "parallel", "cache_ram_mib", "ctx_checkpoints",
    "cors_origins", "webui", "metrics", "threads", "facts",
)


class OpenAICompatible(Engine):
    """Any OpenAI-compatible server, run as its `openai:` block says."""

    name = "openai"
    config_name = "openai"
    settings_block = "openai"
    # One StatefulSet component for either role (the type kept by running stacks: an alias in
    # components/openai_server.py names the older one).
    component_types = {"chat": "OpenAIServer", "embedding": "OpenAIServer"}
    weights_flags: dict[str, str] = {}  # its weights are prefetched (HF_REPO), never named by a flag

    def config_problems(self, model: "ModelServer", path: str, pool: Optional["NodePool"]) -> list[Problem]:
        problems: list[Problem] = []
        for index, arg in enumerate(model.openai.args if model.openai is not None else []):
            if any(ord(c) < 32 or ord(c) == 127 for c in arg):
                problems.append((f"{path}.openai.args[{index}]", f"{arg!r} holds a control character; one argument per "
                                 "list item, without line breaks"))
        if model.openai is None:
            problems.append((f"{path}.openai", "required for engine openai: served_model, resident_memory, args"))
        if model.rpc is not None:
            problems.append((f"{path}.rpc", "engine openai has no RPC backend; only llama.cpp splits a model over "
                             "nodes (remove rpc)"))
        for field in LLAMACPP_SETTINGS:
            if field in model.model_fields_set:
                problems.append((
                    f"{path}.{field}",
                    "a llama.cpp setting, which engine openai does not read; remove it (put the engine's own flags in openai.args)",
                ))
        return problems

    def estimate(self, model: "ModelServer", pool: "NodePool", path: str,
                 pools: Optional[Mapping[str, "NodePool"]] = None) -> tuple[Optional[Estimate], list[Problem]]:
        """What it is measured to lock (openai.resident_memory): on a discrete GPU taken to be on the
        card; no decode figures (what it reads per token is unknown)."""
        if model.weights is None:
            return None, [(f"{path}.weights", "required for engine openai (the download size)")]
        resident = self._settings(model).resident_memory
        if pool.discrete() and model.uses_gpu(pool):
            memory, vram = discrete_resident(resident, model)
        else:
            memory, vram = resident_estimate(resident, model.backend_on(pool)), None
        return Estimate(memory=memory, vram=vram, weights=model.weights, read_per_token=None,
                        decode_predicted_tok_s=None), []

    def args(self, model: "ModelServer", plan: Optional["ServerPlan"] = None) -> list[str]:
        return list(self._settings(model).args)

    def env(self, model: "ModelServer") -> list[dict]:
        return [{"name": k, "value": v} for k, v in sorted(self._settings(model).env.items())]

    def health_path(self, model: "ModelServer") -> str:
        return self._settings(model).health_path

    def metrics_path(self, model: "ModelServer") -> Optional[str]:
        return self._settings(model).metrics_path

    def served_model(self, model: "ModelServer", public_name: Optional[str]) -> Optional[str]:
        """The engine knows its model by one name, whatever the public one is."""
        return self._settings(model).served_model

    @staticmethod
    def _settings(model: "ModelServer"):
        if model.openai is None:  # refused by config_problems before anything is built
            raise ValueError(f"{model.name}: engine openai needs its openai block")
        return model.openai
