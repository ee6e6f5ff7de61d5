"""The engine interface: everything generic code (components, planning, changes, the gateway,
monitoring) may ask about the server that runs a model. Each engine implements all of it in its
own module; generic code asks the engine object and never which engine it is."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ClassVar, Mapping, Optional

if TYPE_CHECKING:
    from config.types import GpuBackend, ModelFacts, ModelServer, NodePool
    from planning.memory import MemoryEstimate, VramEstimate

Problem = tuple[str, str]


@dataclass(frozen=True)
class Credentials:
    """How an engine takes its API key: the Secret mounted as a folder, one file in it."""

    mount_dir: str  # where the key Secret is mounted in the container
    metrics_token_key: str  # the Secret key holding only the key a scraper sends
    client_key: Callable[[str], str]  # the key clients send, from the key file's text

    def key_file(self, secret_key: str) -> str:
        return f"{self.mount_dir}/{secret_key}"


@dataclass(frozen=True)
class Library:
    """Models a server loads by name, fetched by an init container before it starts and kept current
    by a sidecar (components/prefetch; library_download.py, library and keeper modes)."""

    list_file: str  # JSON {name: org/repo:TAG}, one of the engine's config files
    preset_file: str  # the other config file: every model's settings, as configured
    served_preset: str  # what the server reads: the preset less the models not (yet) fetched
    folder: str  # one subfolder per name, holding that model's files
    reload_path: str  # what a GET on the server's port applies a change with


@dataclass(frozen=True)
class Scrape:
    """One metrics target of a server: labels the scraper adds to its series and the query it sends.
    ``optional``: a failed scrape is expected (a router's model that is not loaded), not a server down."""

    labels: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    optional: bool = False


class Engine(ABC):
    """One inference engine. Instances are stateless; ``engines.engine_of(model)`` picks one."""

    name: ClassVar[str]
    # The component type a server of this engine is registered as, by role (its URN's type token:
    # renaming it replaces live resources unless the component keeps an alias).
    component_types: ClassVar[Mapping[str, str]]
    # Command-line flags that name the weights the engine downloads itself, by their long form (the
    # change preview reads them from rendered containers).
    weights_flags: ClassVar[Mapping[str, str]] = {}

    def component_type(self, model: "ModelServer") -> str:
        return self.component_types[model.role]

    # --- config -----------------------------------------------------------------------------------

    @abstractmethod
    def config_problems(self, model: "ModelServer", path: str, pool: Optional["NodePool"]) -> list[Problem]:
        """What is wrong with this server's settings for this engine (run by validation)."""

    @abstractmethod
    def plan_problems(self, key: str, model: "ModelServer", facts: Optional["ModelFacts"]) -> list[Problem]:
        """Why the server's memory cannot be planned, or its promise cannot be kept."""

    # --- the container ----------------------------------------------------------------------------

    @abstractmethod
    def args(self, model: "ModelServer") -> list[str]: ...

    @abstractmethod
    def env(self, model: "ModelServer") -> list[dict]: ...

    def library(self, model: "ModelServer", mount_path: str) -> Optional[Library]:
        """The models this server loads by name from the cache volume at ``mount_path``, if any."""
        return None

    def config_files(self, model: "ModelServer") -> dict[str, dict[str, str]]:
        """Files the server reads, by mount folder: {file name: content}, mounted from a ConfigMap."""
        return {}

    @abstractmethod
    def health_path(self, model: "ModelServer") -> str: ...

    @abstractmethod
    def metrics_path(self, model: "ModelServer") -> Optional[str]: ...

    def metrics_scrapes(self, model: "ModelServer") -> list[Scrape]:
        """The targets at metrics_path: one plain scrape unless the engine needs several."""
        return [Scrape()]

    @abstractmethod
    def served_model(self, model: "ModelServer", public_name: Optional[str]) -> Optional[str]:
        """The model name the gateway sends upstream for this public name (None: pass it through)."""

    def cache_env(self, model: "ModelServer", mount_path: str) -> list[dict]:
        """Environment that points the engine's own downloader at the shared cache volume."""
        return []

    def credentials(self, model: "ModelServer") -> Optional[Credentials]:
        """How the engine takes an API key; None: it takes none (config refuses api_key)."""
        return None

    def reports_queue(self, model: "ModelServer") -> bool:
        """Whether /metrics reports requests waiting for a slot (the saturation alert)."""
        return False

    # --- planning ---------------------------------------------------------------------------------

    def facts(self, model: "ModelServer") -> Optional["ModelFacts"]:
        """Architecture facts for the memory model (None where the engine reports its own memory)."""
        return model.facts

    @abstractmethod
    def memory(self, model: "ModelServer", facts: Optional["ModelFacts"], backend: "GpuBackend") -> "MemoryEstimate":
        """What one replica holds in the node's memory (unified memory or CPU)."""

    @abstractmethod
    def weights_bytes(self, model: "ModelServer", facts: Optional["ModelFacts"]) -> float:
        """The size of the weights download."""

    @abstractmethod
    def read_per_token(self, model: "ModelServer", facts: Optional["ModelFacts"], discrete: bool) -> Optional[tuple[float, float]]:
        """(bytes from VRAM, bytes from the node's memory) of weights read per generated token, for the
        decode figures; on unified memory or a CPU (``discrete`` false) all of it is the node's. None: unknown."""

    def predict_decode(self, model: "ModelServer", facts: Optional["ModelFacts"], pool: "NodePool",
                       discrete: bool) -> Optional[dict[str, float]]:
        """Predicted decode tok/s with the context empty, half and full; None: not predicted."""
        return None

    @abstractmethod
    def discrete(self, model: "ModelServer", facts: Optional["ModelFacts"]) -> tuple["MemoryEstimate", "VramEstimate"]:
        """(system RAM, one GPU's VRAM) of one replica on a discrete GPU."""
