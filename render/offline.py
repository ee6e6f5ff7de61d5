"""Run the Pulumi program under Pulumi's own mock engine and record what it would register.

This is the program's offline mode: no CLI, no provider plugin, no cluster, no network. The
same ``__main__.py`` that ``pulumi up`` runs is executed here; every resource registration it
makes is captured with its inputs and the resource options the engine would act on.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import yaml

from common.constants import OFFLINE_SECRET_PLACEHOLDER as SECRET_PLACEHOLDER
from common.constants import PROJECT
from plane import HISTORY_OUTPUT

PROJECT_DIR = Path(__file__).resolve().parent.parent
PROGRAM = PROJECT_DIR / "__main__.py"


@dataclass
class Registered:
    """One resource registration, as the engine would receive it."""

    type: str
    name: str
    urn: str
    parent: str
    custom: bool
    inputs: dict[str, Any]
    dependencies: list[str] = field(default_factory=list)
    custom_timeouts: dict[str, str] = field(default_factory=dict)
    retain_on_delete: bool = False
    protect: bool = False
    delete_before_replace: bool = False
    ignore_changes: list[str] = field(default_factory=list)
    replace_on_changes: list[str] = field(default_factory=list)
    # Earlier identities this resource answers to (ResourceOptions.aliases): each a dict with
    # "urn", or the spec's parts that are set ("name", "type", "parent_urn", "no_parent").
    aliases: list[dict[str, Any]] = field(default_factory=list)

    @property
    def is_kubernetes(self) -> bool:
        return self.custom and self.type.startswith("kubernetes:")


@dataclass
class ProgramRun:
    stack: str
    resources: list[Registered]
    outputs: dict[str, Any]
    secret_outputs: set[str]
    # The validated stack config the program built from (``main()``'s result).
    config: Any = None
    # Everything the program logged through the engine.
    logs: list[str] = field(default_factory=list)

    def by_urn(self) -> dict[str, Registered]:
        return {r.urn: r for r in self.resources}

    def kubernetes(self) -> list[Registered]:
        return [r for r in self.resources if r.is_kubernetes]

    def find(self, kind: str, name: Optional[str] = None) -> list[Registered]:
        """Kubernetes resources of a kind (``Deployment``), optionally by metadata.name."""
        return [
            r
            for r in self.kubernetes()
            if r.type.rsplit(":", 1)[1] == kind and (name is None or r.inputs.get("metadata", {}).get("name") == name)
        ]

    def one(self, kind: str, name: str) -> Registered:
        found = self.find(kind, name)
        if len(found) != 1:
            raise LookupError(f"expected one {kind} {name!r}, found {len(found)}")
        return found[0]


class StackFileError(Exception):
    """A stack file that is not valid YAML; ``str()`` names the file, line and column."""


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first: Any, again: Any):
        super().__init__(f"duplicate key {key!r}")
        self.key, self.first, self.again = key, first, again


# libyaml's parser when available: the pure-Python one dominates reading a large stack file.
_BASE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StackLoader(_BASE_LOADER):  # type: ignore[misc, valid-type]
    """What the Pulumi CLI reads (Go's yaml.v3), not PyYAML's defaults: a key given twice is an
    error, not a silent last-one-wins (a pasted second `chat:` would drop a server), and only
    true/false are booleans (YAML 1.2: `webui: no` is the string "no", as `pulumi preview` sees it)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        # As yaml.v3 does: keys compared by their text (1 and true are two keys), merge keys (<<)
        # left to the merge, where a key written here overrides a merged one.
        seen: dict[tuple[str, str], Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            text = (key_node.tag, key_node.value)
            if text in seen:
                raise _DuplicateKey(key_node.value, seen[text], key_node.start_mark)
            seen[text] = key_node.start_mark
        return super().construct_mapping(node, deep)


# yaml.v3's scalars (resolve.go), not YAML 1.1's: no yes/no/on/off booleans, no sexagesimal 1:30,
# no `=` value, no timestamps (strings); 0o17 octal and 1e3 are numbers.
_REPLACED = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
             "tag:yaml.org,2002:value", "tag:yaml.org,2002:timestamp"}
StackLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _REPLACED]
    for first, resolvers in _BASE_LOADER.yaml_implicit_resolvers.items()
}
StackLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
StackLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?[0-9][0-9_]*|0o[0-7_]+|0x[0-9a-fA-F_]+|0b[01_]+)$"),
    list("-+0123456789"),
)
StackLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*)?\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."),
)


def _load_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except UnicodeDecodeError as error:
        raise StackFileError(f"{path.name}: not UTF-8 text ({error.reason} at byte {error.start}); save it as UTF-8") from None
    return load_stack_text(text, path.name)


# A stack file is a few KiB; these bound what a hostile or broken one can cost before validation: its
# size, how deep it nests, and how many values it stands for once every alias is expanded (an alias
# bomb is small text for an exponential document).
MAX_STACK_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_VALUES = 100_000


def _shape_problem(root: yaml.Node) -> Optional[str]:
    """How the composed document exceeds the bounds, without recursion (aliases share their node)."""
    expanded: dict[int, int] = {}
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        if depth > MAX_DEPTH:
            return f"is nested deeper than {MAX_DEPTH} levels"
        children = ([v for pair in node.value for v in pair] if isinstance(node, yaml.MappingNode)
                    else list(node.value) if isinstance(node, yaml.SequenceNode) else [])
        if done:
            expanded[id(node)] = 1 + sum(expanded[id(child)] for child in children)
            if expanded[id(node)] > MAX_VALUES:
                return f"stands for more than {MAX_VALUES} values once its aliases are expanded (an alias bomb?)"
        elif id(node) not in expanded:
            stack.append((node, depth, True))
            stack.extend((child, depth + 1, False) for child in children if id(child) not in expanded)
    return None


def _flow_depth(text: str) -> int:
    """The deepest run of open [ and { (a cheap look before the parser nests that deep; brackets inside
    quotes count too, which only over-states)."""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}" and depth:
            depth -= 1
    return deepest


def load_stack_text(text: str, name: str) -> Any:
    """A stack file's document, read as the Pulumi CLI reads it (StackLoader); errors name ``name``."""
    if len(text.encode()) > MAX_STACK_BYTES:
        raise StackFileError(f"{name}: {len(text.encode()) >> 10} KiB, more than a stack file's {MAX_STACK_BYTES >> 20} MiB "
                             "bound; is this the right file?")
    if _flow_depth(text) > MAX_DEPTH:
        raise StackFileError(f"{name}: the YAML is nested deeper than {MAX_DEPTH} levels; a stack file is a few levels of "
                             "plain mappings")
    loader = StackLoader(text)
    try:
        node = loader.get_single_node()
        problem = _shape_problem(node) if node is not None else None
        if problem is not None:
            raise StackFileError(f"{name}: the YAML {problem}; a stack file is a few levels of plain mappings")
        return loader.construct_document(node) if node is not None else None
    except RecursionError:
        raise StackFileError(f"{name}: the YAML is nested too deeply to read; a stack file is a few levels of plain "
                             "mappings") from None
    except _DuplicateKey as error:
        raise StackFileError(
            f"{name}:{error.again.line + 1}:{error.again.column + 1}: duplicate key {error.key!r} (first at line "
            f"{error.first.line + 1}): the second would silently replace the first; remove or rename one"
        ) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark else name
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        hint = "; indent with spaces, not tabs" if "cannot start any token" in problem else ""
        raise StackFileError(f"{where}: invalid YAML: {problem}{hint}; fix the stack file there") from None
    finally:
        loader.dispose()


def stack_config(stack: str, project_dir: Path = PROJECT_DIR) -> tuple[dict[str, str], list[str]]:
    """A stack file's config as the engine passes it to the program: key -> string, secret keys."""
    path = project_dir / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        known = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in project_dir.glob("Pulumi.*.yaml"))
        raise FileNotFoundError(f"no stack {stack!r}: {path.name} does not exist (stacks: {', '.join(known)})")
    document = _load_yaml(path) or {}
    if not isinstance(document, dict) or not isinstance(document.get("config") or {}, dict):
        raise StackFileError(f"{path.name}: expected a mapping with a `config:` mapping at the top; fix the stack file")
    return config_from_mapping(document.get("config") or {})


def config_from_mapping(config: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    values: dict[str, str] = {}
    secret_keys: list[str] = []
    for key, value in config.items():
        full_key = key if ":" in key else f"{PROJECT}:{key}"
        if isinstance(value, dict) and set(value) == {"secure"}:
            values[full_key] = SECRET_PLACEHOLDER
            secret_keys.append(full_key)
        elif isinstance(value, str):
            values[full_key] = value
        else:
            values[full_key] = json.dumps(value)
    return values, secret_keys


def _alias(alias: Any) -> dict[str, Any]:
    if alias.HasField("urn"):
        return {"urn": alias.urn}
    spec = alias.spec
    parts = {"name": spec.name, "type": spec.type, "parent_urn": spec.parentUrn, "no_parent": spec.noParent}
    return {k: v for k, v in parts.items() if v}


def _run(
    config: dict[str, str], secret_keys: list[str], stack: str, program: Union[Path, Callable[[], Any]],
    previous: Optional[dict[str, Any]] = None,
) -> ProgramRun:
    import pulumi
    from pulumi.runtime import config as runtime_config
    from pulumi.runtime import mocks, settings
    from pulumi.runtime.stack import run_pulumi_func
    from pulumi.runtime.sync_await import _sync_await

    registered: list[Registered] = []

    class Recorder(pulumi.runtime.Mocks):
        def new_resource(self, args: pulumi.runtime.MockResourceArgs):
            # Outputs echo the inputs, as a provider's would for these kinds after create.
            return f"{args.name}-id", dict(args.inputs)

        def call(self, args: pulumi.runtime.MockCallArgs):
            if args.token == "pulumi:pulumi:readStackOutputs":
                # The stack's last update, as the engine answers it: offline there is none unless
                # a test hands one in (the `history` output of an earlier run).
                outputs = {HISTORY_OUTPUT: previous} if previous is not None else {}
                return {"name": args.args.get("name"), "outputs": outputs, "secretOutputNames": []}
            return {}

    class RecordingMonitor(mocks.MockMonitor):
        def RegisterResource(self, request):  # noqa: N802 - gRPC method name
            response = super().RegisterResource(request)
            if request.type != "pulumi:pulumi:Stack":
                timeouts = request.customTimeouts
                registered.append(
                    Registered(
                        type=request.type,
                        name=request.name,
                        urn=response.urn,
                        parent=request.parent,
                        custom=request.custom,
                        inputs=self.resources[response.urn].state if request.custom else {},
                        dependencies=sorted(request.dependencies),
                        custom_timeouts={
                            k: v for k, v in (("create", timeouts.create), ("update", timeouts.update)) if v
                        },
                        retain_on_delete=bool(request.retainOnDelete),
                        protect=bool(request.protect),
                        delete_before_replace=bool(request.deleteBeforeReplace),
                        ignore_changes=list(request.ignoreChanges),
                        replace_on_changes=list(request.replaceOnChanges),
                        aliases=[_alias(a) for a in request.aliases] + [{"urn": u} for u in request.aliasURNs],
                    )
                )
            return response

    runtime_config.set_all_config(dict(config), list(secret_keys))
    recorder = Recorder()
    logs: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logs.append(record.getMessage())

    logger = logging.getLogger(f"inference-plane.render.{id(logs)}")
    logger.propagate = False
    logger.addHandler(Collect())
    pulumi.runtime.set_mocks(
        recorder, project=PROJECT, stack=stack, preview=False, monitor=RecordingMonitor(recorder), logger=logger
    )
    result: dict[str, Any] = {}
    if callable(program):
        # A test builds components directly, without the stack's __main__.
        _sync_await(run_pulumi_func(lambda: result.update(program() or {})))
    else:
        # The program's own entry point, as `pulumi up` reaches it (under another module name, so
        # that loading it does not run it).
        entry = runpy.run_path(str(program), run_name="inference_plane_program")["main"]
        _sync_await(run_pulumi_func(lambda: result.update(built=entry())))
    root = settings.get_root_resource()
    outputs: dict[str, Any] = {}
    secret_outputs: set[str] = set()
    for key, value in getattr(root, "outputs", {}).items():
        output = pulumi.Output.from_input(value)
        outputs[key] = _sync_await(output.future())
        if _sync_await(output.is_secret()):
            secret_outputs.add(key)
    registered.sort(key=lambda r: r.urn)
    return ProgramRun(
        stack=stack,
        resources=registered,
        outputs=outputs,
        secret_outputs=secret_outputs,
        config=result["built"].stack if "built" in result else result.get("stack"),
        logs=logs,
    )


def run_program(
    config: dict[str, str],
    secret_keys: Sequence[str] = (),
    stack: str = "test",
    program: Union[Path, Callable[[], Any]] = PROGRAM,
    previous: Optional[dict[str, Any]] = None,
) -> ProgramRun:
    """Run the program once, isolated: each run gets fresh Pulumi runtime state. ``previous`` is
    the ``history`` output of the stack's last update (none: a first update, as offline)."""
    return contextvars.Context().run(_run, dict(config), list(secret_keys), stack, program, previous)


def run_stack(stack: str, project_dir: Path = PROJECT_DIR) -> ProgramRun:
    config, secret_keys = stack_config(stack, project_dir)
    return run_program(config, secret_keys, stack=stack)
