"""The engine interface: everything generic code (components, planning, changes, the gateway,
monitoring) may ask about the server that runs a model. Each engine implements all of it in its
own module; generic code asks the engine object and never which engine it is."""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ClassVar, Mapping, Optional, Union

if TYPE_CHECKING:
    from config.types import ModelServer, NodePool
    from planning.capacity import ServerPlan
    from planning.memory import Estimate, OnRequest

Problem = tuple[str, str]
Planned = Union["Estimate", "OnRequest"]


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
    image: str  # the image of the init container that fetches them and of the sidecar


@dataclass(frozen=True)
class Admission:
    """A proxy in the server's pod that decides, before a request reaches it, whether the model the request
    names may load now, and makes room for it (incluster/admission_proxy.py). It listens on the server's port;
    the server itself only on the pod's loopback at ``server_port``."""

    server_port: int
    plan_file: str  # what the proxy holds the server to (JSON: budgets, each model's planned memory), one of
    # the engine's config files: a model added or removed changes the file, not the pod
    image: str  # needs python3; nothing is installed


@dataclass(frozen=True)
class Scrape:
    """One metrics target of a server: labels the scraper adds to its series and the query it sends.
    ``optional``: a failed scrape is expected (a router's model that is not loaded), not a server down."""

    labels: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    optional: bool = False


@dataclass(frozen=True)
class ServerBuild:
    """One server as its engine builds it: every answer the components render it from, asked once per
    server (``Engine.build``, through ``engines.server_builds``), so that no component asks which engine a
    server runs. The build-side twin of ``Engine.estimate``."""

    component_type: str
    args: list[str]
    env: list[dict]
    cache_env: list[dict]  # the engine's own downloader pointed at the cache volume
    downloads_weights: bool
    files: dict[str, dict[str, str]]  # Engine.config_files of the planned server
    credentials: Optional[Credentials]
    health_path: str
    admission: Optional[Admission]
    library: Optional[Library]
    client_paths: Optional[tuple[str, ...]]
    metrics_path: Optional[str]
    metrics_scrapes: list[Scrape]
    reports_queue: bool
    exports_llamacpp_metrics: bool
    served_model: Callable[[Optional[str]], Optional[str]]  # the name the gateway sends for a public name


class Engine(ABC):
    """One inference engine. Instances are stateless; ``engines.engine_of(model)`` picks one."""

    name: ClassVar[str]
    # The component type a server of this engine is registered as, by role (its URN's type token:
    # renaming it replaces live resources unless the component keeps an alias).
    component_types: ClassVar[Mapping[str, str]]
    # Command-line flags that name the weights the engine downloads itself, by their long form (the
    # change preview reads them from rendered containers).
    weights_flags: ClassVar[Mapping[str, str]] = {}
    # The config's `engine:` value that selects this engine, and the settings block it reads (a
    # field of the server: `openai`, `on_demand`); None: its settings are the server's own fields.
    # engines.engine_of picks the engine whose block is set, else the one without a block; any other
    # engine's block on a server is refused (engines.engine_problems), whatever the engines are.
    config_name: ClassVar[str]
    settings_block: ClassVar[Optional[str]] = None
    # Whether the server's own container downloads its weights (and so is given the hub token).
    downloads_weights: ClassVar[bool] = True
    # The KV cache type the planner falls back to where the server leaves it unset and f16 does not fit its card
    # (plane.plan_stack); None: the engine has no such choice.
    kv_cache_fallback: ClassVar[Optional[str]] = None

    def component_type(self, model: "ModelServer") -> str:
        return self.component_types[model.role]

    # --- config -----------------------------------------------------------------------------------

    @abstractmethod
    def config_problems(self, model: "ModelServer", path: str, pool: Optional["NodePool"]) -> list[Problem]:
        """What is wrong with this server's settings for this engine (run by validation)."""

    # --- the container ----------------------------------------------------------------------------

    @abstractmethod
    def args(self, model: "ModelServer", plan: Optional["ServerPlan"] = None) -> list[str]:
        """The container's arguments; ``plan`` is the server's capacity plan, for what the plan decides
        (a router's resident limit): an engine that needs it refuses None."""

    @abstractmethod
    def env(self, model: "ModelServer") -> list[dict]: ...

    def library(self, model: "ModelServer", mount_path: str) -> Optional[Library]:
        """The models this server loads by name from the cache volume at ``mount_path``, if any."""
        return None

    def admission(self, model: "ModelServer", plan: "ServerPlan") -> Optional[Admission]:
        """The admission proxy in front of the server, if it has one."""
        return None

    def config_files(self, model: "ModelServer", plan: Optional["ServerPlan"] = None) -> dict[str, dict[str, str]]:
        """Files the server reads, by mount folder: {file name: content}, mounted from a ConfigMap; those
        written from the plan only when it is given."""
        return {}

    @abstractmethod
    def health_path(self, model: "ModelServer") -> str: ...

    @abstractmethod
    def metrics_path(self, model: "ModelServer") -> Optional[str]: ...

    def metrics_scrapes(self, model: "ModelServer") -> list[Scrape]:
        """The targets at metrics_path: one plain scrape unless the engine needs several."""
        return [Scrape()]

    def client_paths(self, model: "ModelServer") -> Optional[tuple[str, ...]]:
        """The exact paths an Ingress to the server routes; None: every path (the API and a WebUI)."""
        return None

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

    def exports_llamacpp_metrics(self, model: "ModelServer") -> bool:
        """Whether /metrics carries llama.cpp's own series (llamacpp:*): the dashboard's decode and queue panels
        are drawn only then (another engine's metrics have other names)."""
        return False

    def build(self, model: "ModelServer", plan: "ServerPlan", mount_path: str) -> ServerBuild:
        """Every answer above for one planned server, with its cache volume at ``mount_path``."""
        return ServerBuild(
            component_type=self.component_type(model), args=self.args(model, plan), env=self.env(model),
            cache_env=self.cache_env(model, mount_path), downloads_weights=self.downloads_weights,
            files=self.config_files(model, plan), credentials=self.credentials(model),
            health_path=self.health_path(model), admission=self.admission(model, plan),
            library=self.library(model, mount_path), client_paths=self.client_paths(model),
            metrics_path=self.metrics_path(model), metrics_scrapes=self.metrics_scrapes(model),
            reports_queue=self.reports_queue(model), exports_llamacpp_metrics=self.exports_llamacpp_metrics(model),
            served_model=functools.partial(self.served_model, model))

    # --- planning ---------------------------------------------------------------------------------

    @abstractmethod
    def estimate(self, model: "ModelServer", pool: "NodePool", path: str,
                 pools: Optional[Mapping[str, "NodePool"]] = None) -> tuple[Optional[Planned], list[Problem]]:
        """The plan's one question: what one replica of the server holds where (system RAM, one GPU's
        VRAM), its download, the weights it reads per token and its predicted decode speed; for a
        server of models loaded on request, each model's (``OnRequest``). ``pools``: every node pool of the stack
        (a server split over nodes plans its helpers' pools too). With the problems that keep
        it from being planned or its promise from being kept (paths under ``path``, the server's
        config path); None when it cannot be planned at all."""
