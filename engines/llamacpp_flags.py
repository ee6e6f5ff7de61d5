"""Which llama-server flags a stack may add in ``extra_args``: a closed list, each flag changing nothing
the plan, the policies or the pod depend on (sampling defaults, chat formatting, logging, timeouts).
Every other flag is refused: a generated one names its typed field, a known dangerous one says why,
and any other is not on the list. Each item is one printable line (config/values.py Args: a router
writes it into its preset file), and in a form the pinned llama-server's parser takes: a flag, then its
value as the next item (b10729 reads no `--flag=value`: "invalid argument"), never a value that reads as a
flag (it would be taken as the value and refused: "error while handling argument"). The flags are checked
against the pinned build's own --help, and these forms against its parser (tests/test_llama_contract.py)."""

from __future__ import annotations

import re

Problem = tuple[str, str]

# flag (every spelling) -> whether it takes a value.
ALLOWED: dict[str, bool] = {
    # Sampling defaults (a request's own parameters override them).
    **dict.fromkeys(("--temp", "--temperature", "--top-k", "--top-p", "--min-p", "--typical", "--typical-p",
                     "--repeat-last-n", "--repeat-penalty", "--presence-penalty", "--frequency-penalty",
                     "--dynatemp-range", "--dynatemp-exp", "--dry-multiplier", "--dry-base", "--dry-allowed-length",
                     "--dry-penalty-last-n", "--mirostat", "--mirostat-lr", "--mirostat-ent", "--xtc-probability",
                     "--xtc-threshold", "--top-nsigma", "--samplers", "--sampling-seq", "-s", "--seed", "-n",
                     "--predict", "--n-predict"), True),
    "--ignore-eos": False,
    # Chat formatting and reasoning.
    **dict.fromkeys(("--chat-template", "--chat-template-kwargs", "--reasoning-format", "-rea", "--reasoning",
                     "--reasoning-effort", "--reasoning-budget", "--reasoning-budget-message"), True),
    **dict.fromkeys(("--jinja", "--no-jinja", "--reasoning-preserve", "--no-reasoning-preserve", "-sp", "--special"),
                    False),
    # Serving behaviour that moves no memory: timeouts, batching, context shift, prompt-cache reuse.
    **dict.fromkeys(("-to", "--timeout", "--cache-reuse"), True),
    **dict.fromkeys(("-cb", "--cont-batching", "-nocb", "--no-cont-batching", "--context-shift",
                     "--no-context-shift", "--no-warmup", "--no-slots"), False),
    # Logging.
    **dict.fromkeys(("-lv", "--verbosity", "--log-verbosity"), True),
    **dict.fromkeys(("--log-disable", "--log-timestamps", "--log-prefix"), False),
    # RoPE scaling: what the model can attend to, not what it holds.
    **dict.fromkeys(("--rope-scaling", "--rope-scale", "--rope-freq-base", "--rope-freq-scale", "--yarn-orig-ctx",
                     "--yarn-ext-factor", "--yarn-attn-factor", "--yarn-beta-slow", "--yarn-beta-fast"), True),
}

# Refused with the reason (the flags a user is likeliest to reach for, and the harmful ones).
REFUSED: dict[str, str] = {
    **dict.fromkeys(("-mu", "--model-url", "-hff", "--hf-file", "-hfd", "-hfrd", "--hf-repo-draft", "--spec-draft-hf",
                     "-md", "--model-draft", "--spec-draft-model", "--lora", "--lora-scaled", "--control-vector",
                     "--control-vector-scaled", "--mmproj", "--mmproj-url", "-mm", "-mmu"),
                    "loads weights the plan does not count, from a source hf_repo's validation and the cache never see "
                    "(and sends the hub token wherever it points)"),
    "--path": "serves files from the container to every key holder",
    **dict.fromkeys(("-hft", "--hf-token", "--api-key"), "puts a credential on the command line, readable in the pod spec; "
                    "use model_cache.hub_token or api_key (Secrets)"),
    "--rpc": "offloads layers to another host over the network, outside the plan and the network policy (models.<key>.rpc plans a split and fences its port)",
    **dict.fromkeys(("--mlock", "--no-mmap", "--mmap", "--load-mode", "--numa"),
                    "changes how the weights are held in memory (mlock needs a capability the pod drops; --no-mmap "
                    "copies them into anonymous memory, which a memory limit kills instead of reclaiming: "
                    "tests/test_load_memory.py), which the plan does not model"),
    **dict.fromkeys(("-fa", "--flash-attn", "--swa-full", "--override-kv", "-ot", "--override-tensor", "-nkvo",
                     "--no-kv-offload", "-dev", "--device", "--fit", "-fit"),
                    "changes what llama.cpp allocates where, which the plan does not see; use the typed fields "
                    "(gpu_layers, cpu_moe_layers, gpus, cache_type_k/v, ctx_size)"),
    **dict.fromkeys(("--slot-save-path", "--props", "--lora-init-without-apply", "--tools", "--webui-mcp-proxy"),
                    "opens an endpoint that writes or changes the server's state for every key holder"),
    **dict.fromkeys(("-a", "--alias"), "renames the model the router and the gateway address it by"),
    **dict.fromkeys(("--chat-template-file", "--grammar-file", "-jf", "--json-schema-file", "--log-file"),
                    "reads or writes a path in the container; put the content in a typed setting instead"),
}

# A value may start with '-' only as a number (--seed -1, --temp -0.5 would be odd but parse).
_NUMBER = re.compile(r"-?[0-9.][0-9.eE+-]*")


def extra_args_problems(args: list[str], path: str, generated: frozenset[str]) -> list[Problem]:
    """Each flag on the list, with a value where it takes one, in the argv form the pinned parser takes."""
    problems: list[Problem] = []
    index = 0
    while index < len(args):
        arg = args[index]
        where = f"{path}[{index}]"
        flag = arg.split("=", 1)[0] if arg.startswith("-") else arg
        if not arg.startswith("-"):
            problems.append((where, f"{arg!r} is not a flag (a value goes right after the flag that takes it)"))
        elif flag in generated or flag in REFUSED or flag not in ALLOWED:
            if flag in generated:
                problems.append((where, f"{arg} is generated from a typed field; set that field instead"))
            elif flag in REFUSED:
                problems.append((where, f"{flag} {REFUSED[flag]}; remove it"))
            else:
                problems.append((where, f"{flag} is not among the flags extra_args may set (sampling, chat template "
                                 "and reasoning, timeouts, batching, logging, RoPE: engines/llamacpp_flags.py); ask for "
                                 "a typed setting"))
            if "=" not in arg and index + 1 < len(args) and not args[index + 1].startswith("-"):
                index += 1  # its value: one problem for the pair
        elif "=" in arg:
            problems.append((where, f"{arg!r}: llama-server (b10729) reads no '=' form and stops at start; write "
                             f"{flag!r} and its value as two items"))
        elif ALLOWED[flag]:
            value = args[index + 1] if index + 1 < len(args) else None
            if value is None:
                problems.append((where, f"{flag} takes a value: put it in the next item"))
            elif value.startswith("-") and not _NUMBER.fullmatch(value):
                problems.append((f"{path}[{index + 1}]", f"{value!r} is not a value for {flag} (llama-server would take "
                                 f"it as the value and stop at start); put {flag}'s value right after it"))
            index += 1
        index += 1
    return problems
