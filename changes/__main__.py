"""Change preview: ``python -m changes STACK --base REF_OR_FILE``.

Runs the program offline twice, with the stack's config before and after an edit, and prints
what ``pulumi up`` would do to each resource (update in place, replace create-first or
delete-first, create, delete) and what that means for the running servers.

"Before" is ``Pulumi.<stack>.yaml`` at a git ref (``git show REF:Pulumi.<stack>.yaml``) or a
stack file given by path; "after" is the working tree's ``Pulumi.<stack>.yaml`` (or
``--after-file``). Both runs use the code in the working tree: the difference shown is the stack
config's, not the code's (previewing a change of code needs the old code, which this does not
run). ``secure:`` values cannot be decrypted offline: a key whose ciphertext differs between the
two files is treated as rotated (re-encrypting the same value with ``pulumi config set
--secret`` also changes the ciphertext, so it reads as a rotation too).

Exit status: 0 with the report printed; 2 with one line on stderr when the input is unusable
(unknown stack, bad ref, unreadable file, a config the program rejects).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from render import offline

from .preview import preview
from .provider import ProviderOptions, options_from_config

PROJECT_DIR = Path(__file__).resolve().parent.parent
EPILOG = """\
'before' is Pulumi.<stack>.yaml at a git ref, or a stack file given by path; 'after' is the
working tree's Pulumi.<stack>.yaml. Both runs use the code in the working tree: only the stack
config differs (a change of code is not previewed). secure: values cannot be decrypted offline:
a key whose ciphertext differs between the two files is treated as rotated (re-encrypting the
same value also changes it). Exit 0 with the report; 2 with one line on stderr for unusable
input (unknown stack, bad ref, unreadable file, a config the program rejects).

  python -m changes homelab --base HEAD
  python -m changes strix-halo --base origin/main --json
  python -m changes homelab --before-file old.yaml --after-file new.yaml
"""


class InputError(Exception):
    """Unusable input: ``str()`` is the one line printed."""


def _document(text: str, where: str) -> dict[str, Any]:
    try:
        document = offline.load_stack_text(text, where) or {}
    except offline.StackFileError as error:
        raise InputError(str(error)) from None
    if not isinstance(document, dict) or not isinstance(document.get("config") or {}, dict):
        raise InputError(f"{where}: expected a mapping with a `config:` mapping at the top")
    return document.get("config") or {}


def read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read {path}: {getattr(error, 'strerror', None) or error}") from None
    return _document(text, str(path))


class NewStack(Exception):
    """The stack file is not in the base revision: the stack has nothing before this edit."""


def _new_at(ref: str, stack: str, project_dir: Path) -> bool:
    """The ref is a commit, the stack file is on disk and not in it (asked of git, not read from its
    possibly translated messages)."""
    def git(*args: str) -> int:
        return subprocess.run(["git", "-C", str(project_dir), *args], capture_output=True, check=False).returncode

    return ((project_dir / f"Pulumi.{stack}.yaml").is_file()
            and git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}") == 0
            and git("cat-file", "-e", f"{ref}:./Pulumi.{stack}.yaml") != 0)


def read_at_ref(ref: str, stack: str, project_dir: Path) -> dict[str, Any]:
    spec = f"{ref}:./Pulumi.{stack}.yaml"
    try:
        shown = subprocess.run(["git", "-C", str(project_dir), "show", spec], capture_output=True, text=True, check=False)
    except OSError as error:
        raise InputError(f"cannot run git: {error.strerror}") from None
    if shown.returncode != 0 and _new_at(ref, stack, project_dir):
        raise NewStack(f"Pulumi.{stack}.yaml is not in {ref} (a new stack, not committed yet): everything is created")
    if shown.returncode != 0:
        reason = (shown.stderr.strip().splitlines() or ["git show failed"])[-1]
        raise InputError(f"cannot read Pulumi.{stack}.yaml at {ref!r}: {reason}")
    return _document(shown.stdout, f"{ref}:Pulumi.{stack}.yaml")


def _ciphertexts(config: dict[str, Any]) -> dict[str, str]:
    return {key: str(value["secure"]) for key, value in config.items() if isinstance(value, dict) and set(value) == {"secure"}}


def _full_key(key: str) -> str:
    return key if ":" in key else f"inference-plane:{key}"


def program_config(config: dict[str, Any], rotated: set[str]) -> tuple[dict[str, str], list[str]]:
    """The offline runner's config for a stack file's mapping; each rotated secret key gets a value
    of its own (the offline placeholder is the same for every secret)."""
    values, secret_keys = offline.config_from_mapping(config)
    for key in rotated:
        full = _full_key(key)
        if full in values:
            digest = hashlib.sha256(f"{full}\0{config[key]['secure']}".encode()).hexdigest()[:12]
            values[full] = f"{values[full]}-rotated-{digest}"
    return values, secret_keys


def run(stack: str, config: dict[str, Any], rotated: set[str], which: str, previous: Optional[dict] = None) -> Any:
    """The program on one config; ``previous``: the history output the last update left (pulumi up reads it)."""
    values, secret_keys = program_config(config, rotated)
    try:
        return offline.run_program(values, secret_keys, stack=stack, previous=previous)
    except Exception as error:  # the program's own refusal (ConfigError, CapacityError as RunError)
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise InputError(f"the {which} config does not run: {first}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m changes",
        description="What pulumi up would do to each resource between two versions of a stack's config, "
        "and what that means for the running servers.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("stack", help="stack name: Pulumi.<stack>.yaml")
    parser.add_argument("--base", help="git ref (Pulumi.<stack>.yaml at that ref) or path of a stack file: the 'before'")
    parser.add_argument("--before-file", type=Path, help="stack file for 'before' (instead of --base)")
    parser.add_argument("--after-file", type=Path, help="stack file for 'after' (default: the working tree's Pulumi.<stack>.yaml)")
    parser.add_argument("--project-dir", type=Path, default=PROJECT_DIR, help="folder holding the stack files (default: the project)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--enable-secret-mutable", action="store_true", help="the provider runs with enableSecretMutable (also read from the stack file's kubernetes:enableSecretMutable)")
    parser.add_argument("--enable-configmap-mutable", action="store_true", help="the provider runs with enableConfigMapMutable")
    parser.add_argument("--upsert-existing-objects", action="store_true", help="the provider runs with upsertExistingObjects")
    return parser


def _before(args: argparse.Namespace) -> dict[str, Any]:
    if args.before_file is not None:
        return read_file(args.before_file)
    if args.base is None:
        raise InputError("give --base REF_OR_FILE (or --before-file FILE)")
    path = Path(args.base)
    if path.is_file():
        return read_file(path)
    return read_at_ref(args.base, args.stack, args.project_dir)


def _after(args: argparse.Namespace) -> dict[str, Any]:
    if args.after_file is not None:
        return read_file(args.after_file)
    path = args.project_dir / f"Pulumi.{args.stack}.yaml"
    if not path.is_file():
        known = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in args.project_dir.glob("Pulumi.*.yaml"))
        raise InputError(f"no stack {args.stack!r}: {path.name} does not exist (stacks: {', '.join(known)})")
    return read_file(path)


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        after_config = _after(args)
        new = None
        try:
            before_config = _before(args)
        except NewStack as error:
            before_config, new = {}, str(error)
        before_secrets, after_secrets = _ciphertexts(before_config), _ciphertexts(after_config)
        rotated = {k for k, v in after_secrets.items() if k in before_secrets and before_secrets[k] != v}
        # A new stack: nothing before it, so every object is created (the program is not run on nothing).
        before = offline.ProgramRun(stack=args.stack, resources=[], outputs={}, secret_outputs=set()) if new \
            else run(args.stack, before_config, set(), "before")
        # As pulumi up runs it: with the history the last update left (renames, claims, servers leaving a card).
        after = run(args.stack, after_config, rotated, "after", (before.outputs or {}).get("history"))
    except InputError as error:
        print(f"changes {args.stack}: {error}", file=sys.stderr)
        return 2
    # The provider runs with the options the stack file sets (kubernetes:*), or the flags' on top.
    stacked = options_from_config(after_config)
    options = ProviderOptions(
        enable_secret_mutable=args.enable_secret_mutable or stacked.enable_secret_mutable,
        enable_configmap_mutable=args.enable_configmap_mutable or stacked.enable_configmap_mutable,
        upsert_existing_objects=args.upsert_existing_objects or stacked.upsert_existing_objects,
    )
    report = preview(before, after, options)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        if new:
            print(new)
        print(report.text())
        if rotated:
            print(f"(secrets treated as rotated: {', '.join(sorted(rotated))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
