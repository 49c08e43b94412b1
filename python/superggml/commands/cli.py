"""The `superggml` command line."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Sequence

from .. import __version__, native
from ..errors import MissingExtra, SuperggmlError
from ..settings import add_arguments, default_threads, env_name, options_from_args
from ..runtime.exec.profile import speed as pass_speed
from .chat import format_speed, format_stats


def _env_arg(
    p: argparse.ArgumentParser, *flags: str, env: str, help: str, default: Any = None, type: Any = str, **kw: Any
) -> None:
    """A flag whose default SUPERGGML_<env> gives when set (named at the end of its help)."""
    raw = os.environ.get(env_name(env))
    try:
        default = type(raw) if raw else default
    except ValueError as e:
        p.error(f"{env_name(env)}={raw!r}: {e}")
    p.add_argument(*flags, type=type, default=default, help=f"{help} [{env_name(env)}]", **kw)


def _model_path(a: argparse.Namespace) -> str:
    """-m's file, -hf's from the Hugging Face cache (downloaded there unless already in it), or the bundled
    SmolLM2."""
    hf = getattr(a, "hf_repo", None)
    if hf and a.model:
        raise ValueError("give a model file (-m) or a Hugging Face repo (-hf), not both")
    if hf:
        from .. import hub

        repo, pattern = hub.parse_spec(hf)
        return hub.download(repo, a.hf_file or pattern)
    if a.model:
        return str(a.model)
    from ..models import smollm2_path

    return str(smollm2_path())


def _add_source_args(p: argparse.ArgumentParser, help: str) -> None:
    _env_arg(p, "-m", "--model", env="model", help=help)
    _env_arg(
        p,
        "-hf",
        "--hf-repo",
        env="hf_repo",
        metavar="REPO[:QUANT]",
        help="a Hugging Face repo's GGUF (its QUANT file, else Q4_K_M or the first), from the hub's cache or "
        "downloaded into it; HF_HUB_OFFLINE=1: the cache only",
    )
    p.add_argument("--hf-file", metavar="GLOB", default=None, help="with -hf: the repo's file (a glob)")


def add_model_args(p: argparse.ArgumentParser, options: bool = True) -> None:
    _add_source_args(p, "GGUF file (default: the bundled SmolLM2-135M test model)")
    if options:
        add_arguments(p)


def _generate_many(m: Any, a: argparse.Namespace) -> int:
    """--prompts-file: every line a prompt, run together (up to --parallel at once); a JSON line
    {index, prompt, text, finish_reason} per prompt as it ends, a progress bar on stderr."""
    import json

    from tqdm import tqdm

    from ..generation.batch import BatchScheduler, Request
    from ..generation.sampling import SamplingParams

    f = sys.stdin if a.prompts_file == "-" else open(a.prompts_file, encoding="utf-8")  # noqa: SIM115
    try:
        prompts = [line.rstrip("\n") for line in f if line.strip()]
    finally:
        if f is not sys.stdin:
            f.close()
    if not prompts:
        raise SuperggmlError(f"{a.prompts_file}: no prompts (one per line)")
    texts = [m.apply_chat_template([{"role": "user", "content": p}]) if a.chat else p for p in prompts]
    grammar = m.grammar(**_constraint(a))
    tokens = [m.tokenize(t, add_bos=True, special=True) for t in texts]
    sampling = SamplingParams.pick(_sampling(a))
    out: dict[int, list[str]] = {}
    t0 = time.perf_counter()
    n_tok = 0
    with tqdm(total=len(prompts), unit="prompt", file=sys.stderr, disable=None) as bar:
        req = Request(tokens, 1, a.n_predict if a.n_predict >= 0 else None, a.stop or [], sampling, grammar=grammar)
        for i, piece, finish, k, _ in BatchScheduler(m, parallel=a.parallel).stream(req):
            out.setdefault(i, []).append(piece)
            if finish:
                n_tok += k
                sys.stdout.write(
                    json.dumps(
                        {"index": i, "prompt": prompts[i], "text": "".join(out.pop(i)), "finish_reason": finish},
                        ensure_ascii=False,
                    )
                    + "\n"
                )
                sys.stdout.flush()
                bar.update(1)
                bar.set_postfix(tok_s=f"{n_tok / (time.perf_counter() - t0):.1f}")
    if a.verbose:
        print(f"[superggml] {len(prompts)} prompts, {n_tok} tokens, {time.perf_counter() - t0:.2f} s", file=sys.stderr)
        print(f"[superggml] stats:\n{format_stats(m.stats())}", file=sys.stderr)
    return 0


def _constraint(a: argparse.Namespace) -> dict[str, Any]:
    """generate's --grammar/--grammar-file/--json-schema/--regex as Model's constraint keywords."""
    if a.grammar_file:
        with open(a.grammar_file, encoding="utf-8") as f:
            return {"grammar": f.read()}
    return {"grammar": a.grammar, "json_schema": a.json_schema, "regex": a.regex}


def _cmd_generate(a: argparse.Namespace) -> int:
    from ..model import Model

    if (a.prompt is None) == (a.prompts_file is None):
        raise SuperggmlError("generate needs a prompt (-p) or a prompts file (--prompts-file), not both")
    with Model(_model_path(a), **options_from_args(a)) as m:
        if a.prompts_file is not None:
            return _generate_many(m, a)
        kw = dict(**_sampling(a), stream=True, **_constraint(a))
        prof = m.runtime.profile
        start = first = prof.mark()
        t0 = time.perf_counter()
        n = 0
        if a.chat:
            chunks = m.create_chat_completion([{"role": "user", "content": a.prompt}], **kw)
            for i, c in enumerate(chunks):
                first = prof.mark() if i == 0 else first
                piece = c["choices"][0]["delta"].get("content", "")
                n += 1 if piece else 0
                sys.stdout.write(piece)
                sys.stdout.flush()
        else:
            for i, c in enumerate(m.create_completion(a.prompt, **kw)):
                first = prof.mark() if i == 0 else first
                sys.stdout.write(c["choices"][0]["text"])
                sys.stdout.flush()
        sys.stdout.write("\n")
        print(f"[superggml] {format_speed(pass_speed(start, first, prof.mark()))}", file=sys.stderr)
        if a.verbose:
            dt = time.perf_counter() - t0
            print(f"[superggml] {m.n_tokens} tokens in context, {dt:.2f} s", file=sys.stderr)
            print(f"[superggml] stats:\n{format_stats(m.stats())}", file=sys.stderr)
    return 0


def _cmd_serve(a: argparse.Namespace) -> int:
    from ..model import Model
    from ..serve import serve
    from ..serve.keys import check_bind, load_keys

    keys = load_keys(a.api_key or (), a.api_key_file)
    check_bind(a.host, keys, a.insecure)  # before the model loads
    kw = options_from_args(a)
    path = _model_path(a)
    if kw["seed"] is None:
        kw["seed"] = 0
    if kw.get("paged_kv") and a.parallel > 1 and kw.get("kv_device_layers") is None:
        from .analyze import model_layout  # each request in flight a sequence of the paged KV cache

        kw["kv_device_layers"] = model_layout(path).n_layer * a.parallel  # all on the device
    with Model(path, **kw) as m:
        serve(
            m,
            host=a.host,
            port=a.port,
            parallel=a.parallel,
            max_queue=a.max_queue,
            batch_tokens=a.batch_tokens,
            log_level=a.log_level,
            api_keys=keys,
            insecure=a.insecure,
            slot_save_path=a.slot_save_path,
            model_id=a.alias,
        )
    return 0


def _cmd_bench(a: argparse.Namespace) -> int:
    import json
    import statistics

    from ..model import Model

    prompt = [(i * 37) % 1000 + 100 for i in range(a.n_prompt)]
    if a.n_prompt + a.n_gen + 1 > a.ctx_size:
        raise ValueError(f"-p {a.n_prompt} + -n {a.n_gen} tokens do not fit ctx_size {a.ctx_size}")
    with Model(_model_path(a), **options_from_args(a)) as m:
        pp, tg = [], []
        for _ in range(a.repetitions):
            m.reset()
            t0 = time.perf_counter()
            m.eval(prompt)
            t1 = time.perf_counter()
            tok = 0
            for _ in range(a.n_gen):
                tok = int(m.eval([tok + 200])[-1].argmax())
            t2 = time.perf_counter()
            pp.append(a.n_prompt / (t1 - t0))
            tg.append(a.n_gen / (t2 - t1) if a.n_gen else 0.0)
        res = {
            "model": os.path.basename(m.path),
            "n_threads": m.settings.context.threads,
            "n_prompt": a.n_prompt,
            "n_gen": a.n_gen,
            "prefill_tok_s": statistics.median(pp),
            "decode_tok_s": statistics.median(tg),
            "prefill_runs": pp,
            "decode_runs": tg,
            "stats": m.stats(),
        }
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        print(f"{res['model']}: {res['n_threads']} threads, median of {a.repetitions}")
        print(f"  prefill {a.n_prompt} tokens: {res['prefill_tok_s']:.2f} tok/s")
        print(f"  decode  {a.n_gen} tokens: {res['decode_tok_s']:.2f} tok/s")
        print(f"  stats:\n{format_stats(res['stats'])}")
    return 0


def _cmd_analyze(a: argparse.Namespace) -> int:
    import json

    from .analyze import analyze, format_analysis, model_layout
    from ..settings import parse_size

    path = _model_path(a)
    if a.device_budget:  # the model option's flag, given once per budget to plan: sizes only
        if any(b in ("auto", "off") or "," in b for b in a.device_budget):
            raise ValueError("analyze's --device-budget takes one size per budget to plan")
        budgets = [int(parse_size(b) or 0) for b in a.device_budget]
    else:
        lay = model_layout(path)
        n_keys = lay.n_layer + len(lay.head_chunk_bytes)
        budgets = [int(max(1, int(n_keys * f)) * lay.slot_bytes) for f in (1.0, 0.5, 0.25)] + [lay.slot_bytes]
        if lay.n_expert:  # a MoE block is mostly experts: shares of the file, the expert cache the rest
            budgets = [int(lay.file_bytes * f) for f in (1.0, 0.5, 0.25, 0.1)]
    where: dict[str, Any] = {}
    if a.rpc:  # the blocks compute on the servers' devices (all of them on the first, with --devices)
        where = dict(rpc=list(a.rpc), devices=list(a.devices) or None)
        _print_rpc_devices(a.rpc)
    threads = a.n_threads or default_threads()
    res = analyze(
        path,
        budgets,
        n_threads=threads,
        direct_io=a.direct_io,
        progress=not a.json,
        measure=not a.no_measure,
        hit_rate=a.hit_rate,
        full=a.full,
        **where,
    )
    out = res.to_json()
    hashes = None
    if a.hashes:  # content addresses (superggml.hashes): computed once, then from the sidecar index
        from ..hashes import content_hashes

        hashes = content_hashes(path, n_threads=threads)
        out["hashes"] = {
            "model": hashes.model,
            "blocks": hashes.blocks,
            "tensors": hashes.tensors,
            "experts": hashes.experts,
        }
    if not a.rpc:
        dev, mplan = _auto_plan(path)
        out["memory_plan"] = {"device": dev or "CPU", **mplan.as_dict()}
    print(json.dumps(out, indent=1) if a.json else format_analysis(res))
    if not a.rpc and not a.json:
        print(f"device_budget auto on {dev or 'CPU'}:" + mplan.line().replace("superggml: ", " "))
    if hashes is not None and not a.json:
        print(
            f"content hashes (ggml RPC's FNV-1a; {len(hashes.tensors)} tensors, "
            f"{sum(map(len, hashes.experts.values()))} experts): model {hashes.model}"
        )
        for b, h in hashes.blocks.items():
            print(f"  block {b:3d}  {h}")
    return 0


def _cmd_plan(a: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from .allocation import allocate, format_allocation, visible_devices

    if a.rpc:
        _print_rpc_devices(a.rpc, quiet=a.json)
    devs = visible_devices()
    select = None
    if a.devices:
        by_name = {d.name: d.index for d in devs}
        unknown = [n for n in a.devices if n not in by_name]
        if unknown:
            raise ValueError(f"no device {', '.join(unknown)}; the devices are {', '.join(by_name)}")
        select = [by_name[n] for n in a.devices]
    sizes: list[int] = []
    if a.model:
        from .analyze import model_layout

        lay = model_layout(a.model)
        sizes = list(lay.block_bytes)
    alloc = allocate(
        devs, sizes, reserve=a.reserve_mib << 20, min_budget=a.min_budget_mib << 20, order=a.device_order, select=select
    )
    mplan = _auto_plan(a.model) if a.model else None
    rates = None
    if a.model:  # the cost model's rates: the disk, the host, and the links to this GPU and the servers named
        from ..runtime.plan.costs import measure_rates
        from ..runtime.plan.devices import default_device, resolve_devices
        from ..settings import DeviceSettings, default_threads

        linked = resolve_devices(DeviceSettings(rpc=tuple(e.strip() for e in a.rpc or ())))[0]
        linked = [n for n in dict.fromkeys([default_device(), *linked]) if n not in ("", "CPU")]
        rates = measure_rates(a.model, default_threads(), linked)
    if a.json:
        print(
            json.dumps(
                {
                    "devices": [asdict(d) for d in devs],
                    **({"memory_plan": mplan[1].as_dict(), "device": mplan[0]} if mplan else {}),
                    **(
                        {"rates": {"disk": rates.disk, "compute": rates.compute, "links": dict(rates.links)}}
                        if rates
                        else {}
                    ),
                    "placements": [
                        {
                            "device": p.device.name,
                            "index": p.device.index,
                            "budget": p.budget,
                            "first_layer": p.first_layer,
                            "n_layers": p.n_layers,
                            "bytes": p.bytes,
                        }
                        for p in alloc.placements
                    ],
                    "skipped": [{"device": d.name, "why": w} for d, w in alloc.skipped],
                    "streamed": list(alloc.streamed),
                    "tensor_split": list(alloc.tensor_split),
                },
                indent=1,
            )
        )
        return 0
    print(f"{'#':>2} {'device':<28} {'type':<5} {'free MiB':>9} {'total MiB':>9} source")
    for d in devs:
        print(f"{d.index:>2} {d.name[:28]:<28} {d.type:<5} {d.free >> 20:>9} {d.total >> 20:>9} {d.source}")
    if sizes:
        print()
        print(format_allocation(alloc, sizes))
    if mplan:
        print(f"\n{mplan[0] or 'CPU'}, device_budget auto (ctx 4096, batch 512, F16 K/V):")
        print(mplan[1].line().replace("superggml: ", "  "))
    if rates:
        print(f"measured: {rates.line()}")
    if a.rpc and a.model:
        _print_rpc_split(a.rpc, a.model, len(sizes))
    return 0


def _auto_plan(model: str) -> tuple[str, Any]:
    """(device, MemoryPlan): what device_budget auto gives the model on the device it runs on by default (the
    first GPU, else the CPU) with the default context options."""
    from ..runtime.plan.devices import default_device
    from ..runtime.plan.memory_plan import plan_on
    from ..settings import ContextSettings

    dev = default_device()
    return dev, plan_on(model, dev, ContextSettings())


def _print_rpc_split(endpoints: Sequence[str], model: str, n_layer: int) -> None:
    """The split a model over this CPU and the servers gets: by free memory and measured speed."""
    from ..gguf import open as open_gguf
    from ..runtime.plan.devices import balance, free_memory, layer_split, measure_speed, resolve_devices
    from ..settings import DeviceSettings, default_threads

    with open_gguf(model) as g:
        total = sum(int(t.nbytes) for t in g.tensors.values())
    names, _ = resolve_devices(DeviceSettings(rpc=tuple(e.strip() for e in endpoints)))  # no speeds measured yet
    speeds = [measure_speed(n, default_threads()) for n in names]
    shares = balance(free_memory(names), speeds, total)  # as resolve_devices splits, each speed measured once
    print("\nsplit over this machine and the servers (by free memory and measured speed):")
    for name, speed, share, n in zip(names, speeds, shares, layer_split(n_layer, len(names), shares)):
        print(f"  {name:<12} {speed:>9.0f} products/s  share {share / sum(shares):.3f}  {n} blocks")


def _print_rpc_devices(endpoints: Sequence[str], *, quiet: bool = False) -> None:
    """Adds the servers' devices (DeviceError names one that cannot be used) and lists them on stderr."""
    from ..devices import add_rpc_server

    for ep in endpoints:
        for d in add_rpc_server(ep):
            if not quiet:
                print(f"rpc: {d['name']}[{d['endpoint']}] (device {d['index']} of that server)", file=sys.stderr)


def _cmd_rpc_server(a: argparse.Namespace) -> int:
    from ..devices import start_rpc_server
    from ..settings import parse_size

    host = a.host.strip("[]")
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"superggml: warning: serving on {a.host}: ggml's RPC protocol has no authentication or encryption; "
            f"anyone who reaches this port can run code paths of this process and read what it holds. Use it "
            f"only on a trusted network.",
            file=sys.stderr,
        )
    endpoint = f"[{host}]:{a.port}" if ":" in host else f"{host}:{a.port}"
    mem = int(parse_size(a.mem) or 0) if a.mem else 0
    if a.cache:
        os.makedirs(a.cache, exist_ok=True)
    models = _held_models(a.models) if a.models else []
    start_rpc_server(endpoint, a.cache or "", a.threads or default_threads(), mem, models, a.direct)
    print(
        f"superggml rpc-server on {endpoint}: {len(models)} model file(s) held"
        f"{' from ' + a.models if a.models else ''}, cache {a.cache or 'off'}",
        file=sys.stderr,
    )
    sys.stdout.flush()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0


def _held_models(folder: str) -> list[tuple[str, list[tuple[int, int, int]]]]:
    """The GGUF files under `folder` and their ranges by content hash (hashed once; superggml.hashes)."""
    from ..errors import GGUFError
    from ..hashes import content_ranges

    if not os.path.isdir(folder):
        raise FileNotFoundError(f"--models {folder}: not a directory")
    out = []
    for root, _, files in sorted(os.walk(folder)):
        for name in sorted(files):
            if not name.endswith(".gguf"):
                continue
            path = os.path.join(root, name)
            try:
                out.append((os.path.realpath(path), content_ranges(path)))
            except (GGUFError, OSError) as e:
                print(f"superggml rpc-server: skipping {path}: {e}", file=sys.stderr)
    return out


def _cmd_plot(a: argparse.Namespace) -> int:
    from .plot import plot_metrics

    print(plot_metrics(a.metrics, a.output, tokens=a.tokens))
    return 0


def _add_sampling_args(p: argparse.ArgumentParser, n_predict: int) -> None:
    """The sampling flags, in a group of their own that --help shows before the model options."""
    g = p.add_argument_group("sampling")
    until = "until the end of the context or an end-of-generation token"
    g.add_argument(
        "-n", "--n-predict", type=int, default=n_predict, help=f"tokens to generate (-1: {until}; default {n_predict})"
    )
    g.add_argument("--temp", dest="temperature", type=float, default=0.8, help="temperature (0: greedy; default 0.8)")
    g.add_argument("--top-k", type=int, default=40, help="draw among the k likeliest tokens (0: all; default 40)")
    g.add_argument(
        "--top-p", type=float, default=0.95, help="then among the likeliest whose probabilities sum to p (default 0.95)"
    )
    g.add_argument(
        "--min-p",
        type=float,
        default=0.05,
        help="then those at least p times the likeliest's probability (default 0.05)",
    )
    g.add_argument(
        "--repeat-penalty",
        type=float,
        default=1.0,
        help="divide the logits of the last 64 tokens by this (default 1.0)",
    )
    g.add_argument("--stop", action="append", help="stop string (repeatable)")


def _sampling(a: argparse.Namespace) -> dict[str, Any]:
    """The sampling flags (named as SamplingParams' fields) as create_completion's keywords."""
    from ..generation.sampling import SamplingParams

    return dict(
        SamplingParams.named_in(vars(a)), max_tokens=a.n_predict if a.n_predict >= 0 else None, stop=a.stop or None
    )


def _cmd_chat(a: argparse.Namespace) -> int:
    from ..model import Model
    from . import chat

    with Model(_model_path(a), **options_from_args(a)) as m:
        return chat.main(m, a, _sampling(a))


def _cmd_models(a: argparse.Namespace) -> int:
    """The GGUFs in the Hugging Face cache: size, family, and what superggml does with each on this machine."""
    import json

    from .. import hub
    from ..runtime.plan.memory_plan import file_shape, gib, plan_on
    from ..settings import ContextSettings

    rows = []
    for cm in hub.cached_models(a.cache_dir):
        try:
            arch = file_shape(cm.path)[0].hp.arch
            p = plan_on(cm.path, "", ContextSettings(ctx_size=a.ctx_size))
            fit = "fits" if p.resident else f"streams (budget {gib(p.budget or 0)})"
        except (SuperggmlError, ValueError, OSError) as e:  # an architecture superggml does not run, no room
            fit, arch = f"no: {e}".splitlines()[0][:100], "-"
        rows.append({"repo": cm.repo_id, "file": cm.filename, "bytes": cm.size, "arch": arch, "here": fit})
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print("no GGUF files in the Hugging Face cache (superggml generate -hf org/name downloads one)")
        return 0
    for r in rows:
        print(f"{r['repo']}:{r['file']}  {gib(r['bytes'])}  {r['arch']}  {r['here']}")
    return 0


def command_helps() -> dict[str, str]:
    """Each command's --help without the model options (the documentation lists those once)."""
    commands: dict[str, argparse.ArgumentParser] = {}
    build_parser(commands, model_options=False)
    return {name: p.format_help() for name, p in commands.items()}


def build_parser(
    commands: dict[str, argparse.ArgumentParser] | None = None, *, model_options: bool = True
) -> argparse.ArgumentParser:
    """The command line: model options come from superggml.settings (flags and SUPERGGML_* defaults). `commands`
    gets each command's parser; without `model_options` they lack the model options' flags."""
    parser = argparse.ArgumentParser(prog="superggml", description="Run GGUF models layer by layer over ggml.")
    parser.add_argument("--version", action="version", version=f"superggml {__version__} (ggml {native.GGML_VERSION})")
    sub = parser.add_subparsers(dest="command", required=True)

    def _add_model_args(p: argparse.ArgumentParser) -> None:
        add_model_args(p, model_options)

    g = sub.add_parser("generate", help="complete a prompt")
    g.add_argument("-p", "--prompt", help="prompt text")
    _add_sampling_args(g, n_predict=64)
    _add_model_args(g)
    g.add_argument(
        "--prompts-file",
        metavar="F",
        help="a prompt per line ('-': stdin), run together in shared "
        "forward passes; writes a JSON line {index, prompt, text, finish_reason} per prompt",
    )
    g.add_argument(
        "--parallel", type=int, default=16, help="with --prompts-file: prompts generating at once (default 16)"
    )
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    c = g.add_mutually_exclusive_group()
    c.add_argument("--grammar", metavar="TEXT", help="constrain the text: a GBNF (root ::= ...) or Lark grammar")
    c.add_argument("--grammar-file", metavar="F", help="--grammar from a file")
    c.add_argument("-j", "--json-schema", metavar="JSON", help="constrain the text: JSON valid against this schema")
    c.add_argument("--regex", metavar="RE", help="constrain the text: a match of this regex")
    g.set_defaults(func=_cmd_generate)

    ch = sub.add_parser("chat", help="a conversation in the terminal, through the model's chat template")
    _add_sampling_args(ch, n_predict=-1)
    _add_model_args(ch)
    ch.add_argument("--system", help="system prompt (/system changes it)")
    ch.set_defaults(func=_cmd_chat)

    mo = sub.add_parser("models", help="the GGUF files in the Hugging Face cache, and whether each fits here")
    mo.add_argument("--cache-dir", default=None, help="the hub's cache (default: HF_HUB_CACHE)")
    mo.add_argument("-c", "--ctx-size", type=int, default=4096, help="the context to plan for (default 4096)")
    mo.add_argument("--json", action="store_true", help="a JSON list")
    mo.set_defaults(func=_cmd_models)

    sv = sub.add_parser("serve", help="an OpenAI-compatible HTTP API (completions, chat, streaming)")
    _add_model_args(sv)
    _env_arg(sv, "--host", env="host", default="127.0.0.1", help="address (default 127.0.0.1)")
    _env_arg(sv, "--port", env="port", type=int, default=8080, help="default 8080")
    _env_arg(
        sv,
        "--parallel",
        env="parallel",
        type=int,
        default=4,
        help="sequences generating at once, each a sequence of its own K/V (contiguous: host pages "
        "held as written; --paged-kv: pages of the paged cache), batched in shared forward passes "
        "(default 4)",
    )
    _env_arg(
        sv,
        "--batch-tokens",
        env="batch_tokens",
        type=int,
        default=512,
        help="tokens per engine step: the next token of every running request, then prompt chunks "
        "of new ones (default 512)",
    )
    _env_arg(
        sv,
        "--max-queue",
        env="max_queue",
        type=int,
        default=64,
        help="requests waiting beyond those; more get 503 (default 64)",
    )
    sv.add_argument(
        "--api-key",
        action="append",
        metavar="KEY",
        help="a key requests must carry (Authorization: Bearer KEY); repeatable; also "
        "SUPERGGML_API_KEY. /health stays open",
    )
    sv.add_argument("--api-key-file", metavar="F", help="keys, one per line (# comments)")
    _env_arg(
        sv,
        "-a",
        "--alias",
        env="alias",
        metavar="NAME",
        help="the model's name in /v1/models and in replies (default: the file's name); requests may name any "
        "model, as llama-server's",
    )
    sv.add_argument(
        "--insecure", action="store_true", help="listen beyond loopback with no API key (refused otherwise)"
    )
    sv.add_argument(
        "--slot-save-path",
        metavar="DIR",
        help="directory where POST /slots/{id}?action=save|restore keeps saved sequences",
    )
    sv.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    sv.set_defaults(func=_cmd_serve)

    bn = sub.add_parser("bench", help="prefill and decode speed with the given model and paging flags")
    _add_model_args(bn)
    bn.add_argument("-p", "--n-prompt", type=int, default=128, help="prompt tokens (default 128)")
    bn.add_argument("-n", "--n-gen", type=int, default=32, help="decoded tokens (default 32)")
    bn.add_argument("-r", "--repetitions", type=int, default=3, help="runs; the median is reported (default 3)")
    bn.add_argument("--json", action="store_true")
    bn.set_defaults(func=_cmd_bench)

    an = sub.add_parser("analyze", help="layer sizes, KV bytes per token and the predicted cost of budgets")
    _add_source_args(an, "GGUF file (default: SmolLM2)")
    add_arguments(an, only=("device_budget", "direct_io", "n_threads", "rpc", "devices"), repeat=("device_budget",))
    an.add_argument("--no-measure", action="store_true", help="sizes and plans only; no bandwidth or compute runs")
    an.add_argument(
        "--full",
        action="store_true",
        help="time the whole model streamed, not sampled blocks and reads (minutes on a big model)",
    )
    an.add_argument(
        "--hit-rate",
        type=float,
        default=None,
        metavar="H",
        help="MoE: the expert cache's hit rate to predict for (default: uniform routing's)",
    )
    an.add_argument(
        "--hashes",
        action="store_true",
        help="the content hashes of the model and each block (kept in a sidecar index once computed)",
    )
    an.add_argument("--json", action="store_true")
    an.set_defaults(func=_cmd_analyze)

    pn = sub.add_parser("plan", help="devices, their free memory, and a layer-to-device allocation")
    pn.add_argument("-m", "--model", default=None, help="GGUF file whose layers to allocate")
    pn.add_argument("--reserve-mib", type=int, default=1024, help="MiB left free on each device (default 1024)")
    pn.add_argument("--min-budget-mib", type=int, default=1024, help="skip devices with less (default 1024)")
    pn.add_argument("--device-order", choices=["free_desc", "total_desc", "index"], default="free_desc")
    add_arguments(pn, only=("devices", "rpc"))
    pn.add_argument("--json", action="store_true")
    pn.set_defaults(func=_cmd_plan)

    rs = sub.add_parser("rpc-server", help="serve this machine's CPU to other processes' --rpc (ggml RPC)")
    rs.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; the protocol has "
        "no authentication: anything else only on a trusted network)",
    )
    rs.add_argument("-p", "--port", type=int, default=50052, help="default 50052")
    rs.add_argument("-t", "--threads", type=int, default=None, help="compute threads (default: the cores)")
    rs.add_argument(
        "-m",
        "--mem",
        default=None,
        metavar="SIZE",
        help="the memory the device advertises, e.g. 4GiB (default: the host's)",
    )
    rs.add_argument(
        "-c",
        "--cache",
        default=None,
        metavar="DIR",
        help="ggml's cache of bytes by hash: a client sends a hash instead of bytes it has sent before",
    )
    rs.add_argument(
        "--models",
        default=None,
        metavar="DIR",
        help="GGUF files this peer holds: a superggml client names their tensors by hash and the peer "
        "reads them from here instead of receiving them",
    )
    rs.add_argument(
        "--no-direct",
        dest="direct",
        action="store_false",
        help="read held files through the page cache (default: O_DIRECT where the file system allows)",
    )
    rs.set_defaults(func=_cmd_rpc_server)

    pl = sub.add_parser("plot", help="draw a timeline PNG from a metrics file")
    pl.add_argument("metrics", help="a JSON-lines file written with --metrics-file")
    pl.add_argument("-o", "--output", default="timeline.png", help="PNG to write (default timeline.png)")
    pl.add_argument("--tokens", type=int, default=3, help="forward passes in the per-layer chart (default 3)")
    pl.set_defaults(func=_cmd_plot)

    if commands is not None:
        commands.update(sub.choices)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        return a.func(a)
    except MissingExtra as e:
        print(f"superggml: {e}", file=sys.stderr)
        return 2
    except (SuperggmlError, OSError, ValueError) as e:
        print(f"superggml: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
