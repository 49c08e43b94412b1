"""The house rules, read from the source: no import cycles, no reads of another module's private names, no class
over 400 lines or function over 60 (argument tables aside), public primitives that import no runtime module."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "python" / "superggml"
MAX_CLASS = 400
MAX_FUNCTION = 60
TABLES = {
    ("commands/cli.py", "add_arguments"),
    ("commands/cli.py", "build_parser"),
}  # argument tables: one line per option
PRIMITIVES = ("paging", "gguf")  # the public paging API
RUNTIME = ("runtime", "generation", "api", "model", "arch", "serve", "commands", "compat")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    """Module name -> source; the compiled module by its stub."""
    return {module_name(p): p for p in sorted([*PKG.rglob("*.py"), *PKG.rglob("*.pyi")])}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports (anywhere in it, functions included)."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            subs = {f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known}
            out |= subs
            if mod in known and len(subs) < len(node.names):
                out.add(mod)
    out.discard(name)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = package_modules()
    known = set(mods)
    return {m: imports_of(m, p, known) for m, p in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected component of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def private_reads(path: Path) -> list[str]:
    """`x._name` with x not self or cls, and `from m import _name`, in one file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom):
            out += [
                f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import {a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
    return out


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 30  # the walk found the package
    assert cycles(graph) == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_nothing_reads_another_modules_private_names():
    files = [p for d in ("python/superggml", "tests", "bench") for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 60
    found = [r for p in files for r in private_reads(p)]
    assert found == [], "\n".join(found)


def continuation_lines(source: str) -> set[int]:
    """The lines that continue an expression in brackets (how a formatter wraps a call): not counted as length."""
    out, depth = set(), 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        elif tok.type in (tokenize.NL, tokenize.NEWLINE) and depth > 0:
            out.add(tok.start[0] + 1)
    return out


def test_classes_and_functions_are_short():
    """Lengths in lines, continuation lines of a bracketed expression left out (the formatter's wrapping)."""
    long = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        source = path.read_text()
        cont = continuation_lines(source)
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            n = sum(1 for line in range(node.lineno, (node.end_lineno or node.lineno) + 1) if line not in cont)
            if isinstance(node, ast.ClassDef) and n > MAX_CLASS:
                what = f"class {rel}:{node.name}"
            elif not isinstance(node, ast.ClassDef) and n > MAX_FUNCTION and (rel, node.name) not in TABLES:
                what = f"function {rel}:{node.name}"
            else:
                continue
            long.append(f"{what}: {n} lines")
    assert long == [], "\n".join(long)


def test_public_primitives_import_no_runtime_module():
    graph = import_graph()

    def reach(m: str, seen: set[str]) -> set[str]:
        for w in graph.get(m, ()):
            if w not in seen:
                seen.add(w)
                reach(w, seen)
        return seen

    for prim in PRIMITIVES:
        bad = sorted(m for m in reach(f"superggml.{prim}", set()) if m == "superggml" or m.split(".")[1] in RUNTIME)
        assert bad == [], f"superggml.{prim} imports {bad}"


def test_arch_builds_graphs_only():
    """arch/ sees tensors and hyperparameters: it never allocates a backend buffer, reaches for the devices or
    makes a runtime step (those are runtime/'s: runtime/exec/expert_steps.py builds a paged MoE block's steps)."""
    import re

    bad = re.compile(r"\balloc_tensors\b|\bbackends\b|\bStep\b(?! 3)")
    found = [
        f"{path.name}:{i}: {line.strip()}"
        for path in sorted((ROOT / "python" / "superggml" / "arch").glob("*.py"))
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if bad.search(line)
    ]
    assert found == [], "\n".join(found)


def floors() -> list[set[str]]:
    """The rooms floor by floor, top first, as docs/design.md writes them (its block after "Floors, top first")."""
    text = (ROOT / "docs" / "design.md").read_text()
    block = text.split("Floors, top first", 1)[1].split("```", 2)[1]
    out = []
    for line in block.splitlines():
        head, _, rooms = line.partition(":")
        if head.strip().isdigit():
            out.append({r.strip().rstrip("/") for r in rooms.split("#")[0].split(",") if r.strip()})
    return out


def room_of(module: str) -> str:
    """A module's room: the package's folder or module it lies in (runtime's floors are rooms of their own,
    runtime/exec and so on)."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "runtime":
        return f"runtime/{parts[2]}"
    return parts[1] if len(parts) > 1 else parts[0]


def arrows_up(graph: dict[str, set[str]], floor: dict[str, int]) -> list[str]:
    """The imports from a room to one on a higher floor (floor 0 is the top)."""
    return sorted(f"{a} -> {b}" for a, bs in graph.items() for b in bs if floor[room_of(b)] < floor[room_of(a)])


def test_no_arrow_runs_up_a_floor():
    """A room imports only rooms on its own floor or below (design.md's floors); every room has a floor."""
    fl = floors()
    assert len(fl) >= 5
    floor = {r: i for i, rooms in enumerate(fl) for r in rooms}
    graph = import_graph()
    missing = sorted({room_of(m) for m in graph} - set(floor))
    assert missing == [], f"rooms with no floor in design.md: {missing}"
    up = arrows_up(graph, floor)
    assert up == [], "\n".join(up)


def test_the_floor_check_finds_an_arrow_up():
    graph = {
        "superggml.model": {"superggml.runtime.exec.executor"},
        "superggml.runtime.exec.executor": {"superggml.model"},
        "superggml.runtime.plan.devices": {"superggml.runtime.memory.base"},
    }
    assert arrows_up(graph, {"model": 0, "runtime/exec": 1, "runtime/memory": 2, "runtime/plan": 3}) == [
        "superggml.runtime.exec.executor -> superggml.model",
        "superggml.runtime.plan.devices -> superggml.runtime.memory.base",
    ]


def test_runtime_is_four_floors():
    """runtime/ is four folders, exec above memory above weights above plan (design.md's floors), and holds no
    module of its own beside them."""
    fl = floors()
    order = [
        next(i for i, rooms in enumerate(fl) if f"runtime/{f}" in rooms) for f in ("exec", "memory", "weights", "plan")
    ]
    assert order == sorted(order) and len(set(order)) == 4, order
    loose = sorted(p.name for p in (PKG / "runtime").glob("*.py") if p.name != "__init__.py")
    assert loose == []
    assert {p.name for p in (PKG / "runtime").iterdir() if p.is_dir() and p.name != "__pycache__"} == {
        "exec",
        "memory",
        "weights",
        "plan",
    }


def memory_kinds() -> dict[str, list[str]]:
    """runtime/memory's files -> the SequenceMemory implementations each defines (classes whose bases name
    SequenceMemory or one of its subclasses)."""
    files = sorted((PKG / "runtime" / "memory").glob("*.py"))
    trees = {p.name: ast.parse(p.read_text()) for p in files}
    kinds = {"SequenceMemory"}
    while True:
        found = {
            node.name
            for tree in trees.values()
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") in kinds for b in node.bases)
        }
        if found <= kinds:
            break
        kinds |= found
    return {
        name: [n.name for n in tree.body if isinstance(n, ast.ClassDef) and n.name in kinds - {"SequenceMemory"}]
        for name, tree in trees.items()
    }


def test_one_sequence_memory_per_file_and_one_factory():
    """Each sequence-memory kind has its own file in runtime/memory (base.py keeps the interface and the laned
    K/V both kinds of K/V share), and only memory/factory.py constructs the kinds (a kind's own file aside: paged.py's
    paged_kv builds its PagedKV)."""
    kinds = memory_kinds()
    per_file = {f: ks for f, ks in kinds.items() if ks and f != "base.py"}
    assert all(len(ks) == 1 for ks in per_file.values()), per_file
    names = {k for ks in kinds.values() for k in ks} - {"LanedKV"}
    makers = []
    for p in sorted(PKG.rglob("*.py")):
        if p.parent.name == "memory" and p.name == "factory.py":
            continue
        own = set(kinds.get(p.name, [])) if p.parent.name == "memory" else set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in names - own:
                makers.append(f"{p.relative_to(PKG)}:{node.lineno}: {node.func.id}")  # type: ignore[attr-defined]
    assert makers == [], makers


def is_replace(f: ast.expr) -> bool:
    return (isinstance(f, ast.Name) and f.id == "replace") or (
        isinstance(f, ast.Attribute) and f.attr == "replace" and getattr(f.value, "id", "") == "dataclasses"
    )


def replaced(path: Path) -> list[str]:
    """dataclasses.replace calls in a file whose object is not hyperparameters (hp, self.hp)."""
    return [
        f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)[:80]}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and is_replace(node.func)
        and node.args
        and ast.unparse(node.args[0]) not in ("hp", "self.hp")
    ]


def test_settings_are_not_rewritten_after_resolve():
    """Settings are built in settings.py and settled once in runtime/plan/resolve.py: nothing else replaces a field,
    and an object keeps the settings it is given (an attribute `settings` is assigned a plain name, or the
    settings another object holds)."""
    once = {PKG / "settings.py", PKG / "runtime" / "plan" / "resolve.py"}
    found = [r for p in sorted(PKG.rglob("*.py")) if p not in once for r in replaced(p)]
    for p in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            for t in targets:
                pairs = (
                    zip(t.elts, node.value.elts)
                    if isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple)
                    else [(t, node.value)]
                )
                for tt, v in pairs:
                    taken = isinstance(v, ast.Name) or (isinstance(v, ast.Attribute) and v.attr == "settings")
                    if isinstance(tt, ast.Attribute) and tt.attr == "settings" and not taken:
                        found.append(f"{p.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert found == [], "\n".join(found)


CSRC = ROOT / "csrc"
CMAKE_CALL = r"{}\(\s*([^)]*)\)"
BINDING_ONLY = {
    "module": "the extension's init: calls every file's init_*",
    "lease": "the bindings' own hold on lent memory (lease.h), used by the pool, pager and KV cache bindings",
    "ops": "ggml's own ops (ggml.h) as methods of Context: no csrc source, graph.cpp binds graph.h",
}


def cmake_args(text: str, command: str, first: str) -> list[str]:
    """The arguments (after `first`) of the CMake call `command(first ...)`; [] if there is none."""
    import re

    for m in re.finditer(CMAKE_CALL.format(command), text):
        args = m.group(1).split()
        if args and args[0] == first:
            return args[1:]
    return []


def quoted_includes(path: Path) -> list[str]:
    import re

    return re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), re.M)


def test_the_paging_core_builds_without_rpc():
    """CMake's superggml_core target (csrc/*.cpp) holds no RPC source and links no ggml-rpc; no core file includes
    one of csrc/rpc/ or ggml-rpc.h; the core's stress tests link the core alone (rpc_stress the RPC module)."""
    text = (ROOT / "CMakeLists.txt").read_text()
    rpc = sorted(p.name for p in (CSRC / "rpc").glob("*.cpp"))
    assert {"rpc.cpp", "rpc-peer.cpp", "rpc-wire.cpp", "rpc-content.cpp"} <= set(rpc)
    assert not [p.name for p in CSRC.glob("rpc*.*")], "RPC sources outside csrc/rpc/"

    assert cmake_args(text, "add_library", "superggml_core") == ["STATIC", "${SUPERGGML_CORE_SOURCES}"]
    glob = cmake_args(text, "file", "GLOB")
    assert glob[:2] == ["SUPERGGML_CORE_SOURCES", "CONFIGURE_DEPENDS"] and glob[2:] == ["csrc/*.cpp"], glob
    core = sorted(CSRC.glob("*.cpp"))  # what that non-recursive glob picks up
    assert len(core) > 15 and all(p.parent == CSRC for p in core)
    links = cmake_args(text, "target_link_libraries", "superggml_core")
    assert links and not [x for x in links if "rpc" in x or x == "superggml::ggml"], links

    ggml = (ROOT / "ggml" / "CMakeLists.txt").read_text()
    ggml_core = cmake_args(ggml, "target_link_libraries", "superggml_ggml_core")
    assert ggml_core == ["INTERFACE", "ggml", "ggml-base", "ggml-cpu"], ggml_core

    bad = []
    core_headers = {p.name for p in CSRC.glob("*.h")}
    for p in sorted([*CSRC.glob("*.h"), *CSRC.glob("*.cpp")]):
        for inc in quoted_includes(p):
            if (
                inc.startswith("rpc")
                or inc == "ggml-rpc.h"
                or ("/" in inc)
                or (not inc.startswith("ggml") and inc != "gguf.h" and inc not in core_headers)
            ):
                bad.append(f"{p.relative_to(ROOT)}: #include \"{inc}\"")
    assert bad == [], "\n".join(bad)

    tests = cmake_args(text, "set", "core_tests")
    assert {"task_stress", "prefetch_stress", "kv_stress", "loader_stress", "expert_stress", "hash_stress"} <= set(
        tests
    )
    assert "rpc_stress" not in tests
    for t in tests:
        incs = quoted_includes(ROOT / "tests" / "cpp" / f"{t}.cpp")
        assert not [i for i in incs if i.startswith("rpc") or i == "ggml-rpc.h"], (t, incs)
    assert "target_link_libraries(${t} PRIVATE superggml_core)" in text


def test_binding_files_are_named_after_their_sources():
    """csrc/bindings/<x>.cpp binds csrc/<x>.cpp (or csrc/rpc/<x>.cpp), `_` for `-`; the few binding-only files
    say why they have no source."""
    sources = {p.stem for p in [*CSRC.glob("*.cpp"), *CSRC.glob("*.h"), *(CSRC / "rpc").glob("*.cpp")]}
    odd = [
        p.name
        for p in sorted((CSRC / "bindings").glob("*.cpp"))
        if p.stem.replace("_", "-") not in sources and p.stem not in BINDING_ONLY
    ]
    assert odd == [], odd
    assert all((CSRC / "bindings" / f"{n}.cpp").exists() for n in BINDING_ONLY)


SEAMS = ("ex", "model", "plan", "placement", "arch")  # collaborators that must say what they are


def untyped_seams(path: Path) -> list[str]:
    """Parameters named like a collaborator (SEAMS) and typed Any (or not typed) in one file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = node.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
            if arg.arg in SEAMS and (arg.annotation is None or ast.unparse(arg.annotation) == "Any"):
                out.append(f"{path.relative_to(PKG)}:{node.lineno}: {node.name}({arg.arg})")
    return out


def test_collaborators_are_typed():
    """A collaborator handed to runtime/, arch/, generation/ or metrics.py says what it is: no parameter named
    ex, model, plan, placement or arch is typed Any (a call that climbs back up shows in its type)."""
    files = [p for d in ("runtime", "arch", "generation") for p in sorted((PKG / d).rglob("*.py"))]
    found = [f for p in [*files, PKG / "metrics.py"] for f in untyped_seams(p)]
    assert found == [], "\n".join(found)


def split_off(path: Path) -> list[str]:
    """Module-level functions whose first parameter is a class with behaviour defined in the same file (not a
    dataclass or a Protocol): a method moved out to keep the class short, instead of a class split by
    responsibility."""
    tree = ast.parse(path.read_text())
    classes = {
        n.name
        for n in tree.body
        if isinstance(n, ast.ClassDef)
        and not any("dataclass" in ast.unparse(d) for d in n.decorator_list)
        and not any(ast.unparse(b) in ("Protocol", "typing.Protocol") for b in n.bases)
    }
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.args.args:
            ann = node.args.args[0].annotation
            if ann is not None and ast.unparse(ann).strip("'\"") in classes:
                out.append(f"{path.relative_to(PKG)}:{node.lineno}: {node.name}({ast.unparse(ann)})")
    return out


def test_no_function_takes_the_class_it_was_split_from():
    found = [f for p in sorted(PKG.rglob("*.py")) for f in split_off(p)]
    assert found == [], "\n".join(found)
