"""Our uses of vLLM and the fake_vllm stand-in, checked against the API recorded from vLLM's own source (vllm_contract.json)."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import tomllib
import warnings
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[3]
C = json.loads((ROOT / "exgrpo_core" / "rollout" / "vllm_contract.json").read_text())
V = C["vllm_version"]
OURS = sorted(p for d in ("exgrpo_core", "flows", "scripts") for p in (ROOT / d).rglob("*.py")
              if p.name != "vllm_contract.py")  # the recorder names vLLM's env vars without setting them
FAKE = ROOT / "tests" / "exgrpo_core" / "fake_vllm.py"
_spec = importlib.util.spec_from_file_location("vllm_contract_script", ROOT / "scripts" / "vllm_contract.py")
script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(script)  # its `params` reads our signatures the way it read vLLM's


def cls(name: str) -> dict:
    return C["classes"][name]


def members(name: str) -> set[str]:
    c = cls(name)
    return {*c.get("members", []), *c.get("methods", {}), *c.get("fields", {}), *c.get("attributes", []),
            *c.get("properties", [])}


def init_fields(name: str) -> set[str]:
    c = cls(name)
    return {f for f in c["fields"] if f not in c.get("fields_not_in_init", []) and not f.startswith("_")}


def _params(name: str, method: str) -> set[str]:  # keyword-passable parameters of a recorded method (or none)
    m = cls(name).get("methods", {}).get(method)
    return {p[0] for p in m["params"] if p[1] in ("arg", "kw")} if m else set()


def llm_keywords() -> set[str]:
    """`LLM(...)` takes its own parameters and hands **kwargs on to `EngineArgs(...)` (vllm/entrypoints/llm.py)."""
    own = {p[0] for p in cls("LLM")["methods"]["__init__"]["params"] if p[1] in ("arg", "kw")}
    return own | init_fields("EngineArgs")


def call_problems(params: list, nargs: int, keywords: list[str], what: str) -> list[str]:
    """Keywords the signature rejects, or more positional arguments than it takes."""
    kinds = {p[1] for p in params}
    names = {p[0] for p in params if p[1] in ("arg", "kw")}
    out = [f"{what}: vLLM {V} has no parameter {k!r}" for k in keywords if k not in names and "**kwargs" not in kinds]
    npos = sum(p[1] in ("pos", "arg") for p in params)
    if nargs > npos and "*args" not in kinds:
        out.append(f"{what}: vLLM {V} takes {npos} positional arguments, got {nargs}")
    return out


def literal_keys(fn: ast.AST, name: str) -> list[str] | None:
    """Keys of the dict `name` built in `fn` from literal keys only (`name = {...}` on every branch of a conditional,
    `name["k"] = ...`); None when it is built some other way."""
    keys: list[str] = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id == name:
                    v = node.value
                    for d in ([v.body, v.orelse] if isinstance(v, ast.IfExp) else [v]):
                        if not isinstance(d, ast.Dict) or not all(isinstance(k, ast.Constant) for k in d.keys):
                            return None
                        keys += [k.value for k in d.keys]
                elif isinstance(t, ast.Subscript) and getattr(t.value, "id", None) == name:
                    if not isinstance(t.slice, ast.Constant):
                        return None
                    keys.append(t.slice.value)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and getattr(node.func.value, "id", None) == name and node.func.attr in ("update", "setdefault")):
            return None
    return keys


def chain_problems(node: ast.AST, types: list[str], parents: dict, at) -> list[str]:
    """`node` is `<an object of one of types>.attr.attr...`: each step must exist in vLLM; calls must fit."""
    out = []
    while isinstance(node, ast.Attribute) and types:
        missing = [t for t in types if node.attr not in members(t)]
        if missing:
            out.append(f"{at(node)}: vLLM {V} {missing[0]} ({cls(missing[0])['defined_in']}) has no {node.attr!r}")
            break
        parent = parents.get(node)
        method = cls(types[0]).get("methods", {}).get(node.attr)
        if isinstance(parent, ast.Call) and parent.func is node and method:
            out += [f"{at(parent)}: {m}" for m in call_problems(
                method["params"], len(parent.args), [k.arg for k in parent.keywords if k.arg], f"{types[0]}.{node.attr}()")]
        nxt = cls(types[0]).get("attribute_types", {}).get(node.attr)
        # the worker builds the V1 or the V2 model runner at run time (vllm/v1/worker/gpu_worker.py): both must fit
        types = [nxt, "GPUModelRunnerV2"] if nxt == "GPUModelRunner" else [nxt] if nxt else []
        node = parent
    return out


def extension_problems(cls_node: ast.ClassDef, at) -> tuple[list[str], set[str]]:
    """Our worker extension (mixed into vLLM's Worker): no name clash, `self.<vLLM attr>` chains and
    `load_weights(...)` calls that fit; returns the problems and the extension's method names."""
    mine = {n.name for n in cls_node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    out = [f"{at(cls_node)}: worker extension method {n!r} clashes with vLLM {V} Worker (vLLM refuses it)"
           for n in sorted(mine & set(cls("Worker")["all_class_names"]))]
    parents = {c: p for p in ast.walk(cls_node) for c in ast.iter_child_nodes(p)}
    for node in ast.walk(cls_node):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                and node.attr not in mine):
            out += chain_problems(node, ["Worker"], parents, at)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "load_weights":
            for model, sig in sorted(C["model_load_weights"].items()):
                out += [f"{at(node)}: {m}" for m in call_problems(
                    sig["params"], len(node.args), [k.arg for k in node.keywords if k.arg], f"{model}.load_weights()")]
    return out, mine


def find_extension(value: ast.AST, module: str, tree: ast.Module) -> tuple[ast.ClassDef | None, str]:
    """The class named by `worker_extension_cls=` (a string, or f"{__name__}.Name"), searched in our source."""
    if isinstance(value, ast.JoinedStr):
        text = "".join(module if isinstance(v, ast.FormattedValue) and getattr(v.value, "id", "") == "__name__"
                       else str(getattr(v, "value", "?")) for v in value.values)
    else:
        text = getattr(value, "value", "?")
    mod, _, name = str(text).rpartition(".")
    path = ROOT / (mod.replace(".", "/") + ".py")
    where = tree if mod == module else ast.parse(path.read_text()) if path.is_file() else None
    found = [n for n in ast.walk(where) if isinstance(n, ast.ClassDef) and n.name == name] if where else []
    return (found[0] if found else None), str(text)


def problems_in(text: str, where: str) -> list[str]:
    """Every use of vLLM in one of our files that vLLM's recorded API does not have."""
    tree = ast.parse(text)
    module = where.removesuffix(".py").replace("/", ".")
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    at = lambda node: f"{where}:{node.lineno}"  # noqa: E731
    out: list[str] = []
    names: dict[str, str] = {}  # local name -> what it is in vLLM
    holders: set[str] = set()   # `self.X` / `X` holding an LLM
    rpcs: list[tuple[str, ast.AST]] = []
    extension: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm" and not node.level:
            exported = C["exports"].get(node.module)
            for a in node.names:
                if exported is None:
                    out.append(f"{at(node)}: from {node.module} import {a.name}: module not recorded (add it to "
                               "EXPORT_MODULES in scripts/vllm_contract.py and rerun it)")
                elif a.name not in exported:
                    out.append(f"{at(node)}: vLLM {V} has no {node.module}.{a.name}")
                names[a.asname or a.name] = a.name
        elif isinstance(node, ast.Import):
            for a in node.names:
                parent, _, leaf = a.name.rpartition(".")
                if parent.split(".")[0] == "vllm" and leaf not in C["exports"].get(parent, [leaf]):
                    out.append(f"{at(node)}: vLLM {V} has no module {a.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"VLLM_[A-Z0-9_]+", node.value):
            if node.value not in C["env_vars"]:
                out.append(f"{at(node)}: {node.value} is not an environment variable of vLLM {V} (vllm/envs.py)")
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names):
            continue
        what = names[node.func.id]
        keywords = [k.arg for k in node.keywords if k.arg]
        if what == "LLM":
            fn = next((p for p in _ancestors(node, parents) if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef))), tree)
            for k in (k for k in node.keywords if k.arg is None):
                keys = literal_keys(fn, k.value.id) if isinstance(k.value, ast.Name) else None
                if keys is None:
                    out.append(f"{at(node)}: LLM(**{ast.unparse(k.value)}): build it from literal keys so it can be checked")
                keywords += keys or []
            allowed = llm_keywords()
            out += [f"{at(node)}: LLM(...): vLLM {V} has no parameter or EngineArgs field {k!r}"
                    for k in keywords if k not in allowed]
            target = parents.get(node)
            if isinstance(target, ast.Assign):
                holders.update(getattr(t, "attr", getattr(t, "id", None)) for t in target.targets)
            ext = next((k.value for k in node.keywords if k.arg == "worker_extension_cls"), None)
            if ext is not None:
                found, qual = find_extension(ext, module, tree)
                if found is None:
                    out.append(f"{at(node)}: worker_extension_cls {qual!r} not found in our source")
                else:
                    more, extension = extension_problems(found, at)
                    out += more
        elif what == "SamplingParams":
            allowed = init_fields("SamplingParams")
            out += [f"{at(node)}: SamplingParams(...): vLLM {V} has no field {k!r}" for k in keywords if k not in allowed]
            if node.args:
                out.append(f"{at(node)}: SamplingParams(...) with positional arguments: pass fields by keyword")
        elif what == "TokensPrompt":
            out += [f"{at(node)}: TokensPrompt(...): vLLM {V} has no key {k!r}" for k in keywords
                    if k not in cls("TokensPrompt")["fields"]]
        elif what in C["classes"]:  # any other recorded class built by keyword: its fields or __init__'s
            allowed = init_fields(what) | _params(what, "__init__")
            out += [f"{at(node)}: {what}(...): vLLM {V} has no field or parameter {k!r}" for k in keywords
                    if k not in allowed]
    for node in ast.walk(tree):  # a recorded class's own methods: RecordedClass.method(..., keyword=...)
        f = node.func if isinstance(node, ast.Call) else None
        if (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and names.get(f.value.id) in C["classes"]
                and f.attr in cls(names[f.value.id]).get("methods", {})):
            allowed = _params(names[f.value.id], f.attr)
            out += [f"{at(node)}: {names[f.value.id]}.{f.attr}(...): vLLM {V} has no parameter {k.arg!r}"
                    for k in node.keywords if k.arg and k.arg not in allowed]
    for node in ast.walk(tree):  # uses of the engine: self.llm.<...> or llm.<...>
        if isinstance(node, ast.Attribute) and (
                (isinstance(node.value, ast.Attribute) and node.value.attr in holders
                 and getattr(node.value.value, "id", None) == "self")
                or (isinstance(node.value, ast.Name) and node.value.id in holders)):
            out += chain_problems(node, ["LLM"], parents, at)
            call = parents.get(node)
            if node.attr == "collective_rpc" and isinstance(call, ast.Call) and call.args and isinstance(
                    call.args[0], ast.Constant):
                rpcs.append((call.args[0].value, call))
    for name, call in rpcs:
        if name not in extension and name not in cls("Worker")["methods"]:
            out.append(f"{at(call)}: collective_rpc({name!r}): neither our worker extension nor vLLM {V}'s Worker has it")
    return list(dict.fromkeys(out))


def _ancestors(node, parents):
    while node in parents:
        node = parents[node]
        yield node


def test_our_vllm_uses_exist_in_vllm():
    problems = [p for path in OURS for p in problems_in(path.read_text(), str(path.relative_to(ROOT)))]
    assert not problems, f"our code uses what vLLM {V} does not have:\n" + "\n".join(problems)


def test_our_uses_were_found():
    """The scan sees the engine: if this fails, the checks above check nothing."""
    text = (ROOT / "exgrpo_core" / "rollout" / "vllm_engine.py").read_text()
    tree = ast.parse(text)
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert {"LLM", "SamplingParams", "TokensPrompt"} <= calls
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" in text


def test_checker_reports_invented_names():
    snippet = (
        "import os\n"
        "from vllm import LLM, SamplingParams\n"
        "from vllm.inputs import TokensPrompt\n"
        "from vllm.nowhere import Thing\n"
        "class Ext:\n"
        "    def load_model(self):\n"
        "        return self.model_runner.no_such_runner_attr.load_weights(weightz=[])\n"
        "def make(flag):\n"
        "    extra = {'distributed_executor_backend': 'external_launcher'} if flag else {}\n"
        "    extra['bogus_extra'] = 1\n"
        "    os.environ['VLLM_NOT_A_VARIABLE'] = '1'\n"
        "    llm = LLM(model='x', bogus_arg=1, worker_extension_cls=f'{__name__}.Ext', **extra)\n"
        "    llm.generate([TokensPrompt(prompt_token_ids=[1], bogus_key=2)], SamplingParams(temprature=0.5),\n"
        "                 use_tqdmm=False)\n"
        "    llm.sleep(level=1, bogus_level=2)\n"
        "    llm.llm_engine.model_config.no_such_field\n"
        "    llm.collective_rpc('no_such_worker_method')\n"
    )
    found = "\n".join(problems_in(snippet, "snippet.py"))
    for name in ("bogus_arg", "bogus_extra", "VLLM_NOT_A_VARIABLE", "bogus_key", "temprature", "use_tqdmm",
                 "bogus_level", "no_such_field", "no_such_worker_method", "vllm.nowhere", "'load_model' clashes",
                 "no_such_runner_attr", "weightz"):
        assert name in found, f"the checker missed {name}:\n{found}"
    clean = snippet.split("class Ext")[0].replace("from vllm.nowhere import Thing\n", "") + (
        "def make():\n    llm = LLM(model='x', seed=0, enable_sleep_mode=True)\n"
        "    llm.generate([TokensPrompt(prompt_token_ids=[1])], SamplingParams(n=2, seed=3), use_tqdm=False)\n"
        "    llm.sleep(level=1)\n    llm.wake_up(tags=['weights'])\n    llm.llm_engine.model_config.hf_config\n")
    assert problems_in(clean, "snippet.py") == []


def test_recording_matches_the_pinned_vllm():
    """The recording is of the vLLM the project pins, and the pin cannot drift past it."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    spec = next(Requirement(r) for r in extra if Requirement(r).name == "vllm").specifier
    assert Version(V) in spec, f"vllm_contract.json records vLLM {V}, outside the pin vllm{spec}: rerun scripts/vllm_contract.py"
    bounded = [s for s in spec if s.operator in ("<", "<=", "~=", "==", "===")]
    assert bounded, (f"the vllm extra pin `vllm{spec}` has no upper bound: a newer vLLM would be installed unchecked "
                     f"against this recording of {V}; pin e.g. vllm>={Version(V).major}.{Version(V).minor},"
                     f"<{Version(V).major}.{Version(V).minor + 1}")


def _fake_signatures() -> dict[str, ast.FunctionDef]:
    tree = ast.parse(FAKE.read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in ("LLM", "SamplingParams"):
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and not f.name.startswith("_") or getattr(f, "name", "") == "__init__":
                    if "property" not in script.decorator_names(f):
                        out[f"{node.name}.{f.name}"] = f
        elif isinstance(node, ast.FunctionDef) and node.name == "TokensPrompt":
            out["TokensPrompt"] = node
    return out


def _real(key: str) -> tuple[list | None, set[str] | None]:
    """The real signature (params) or accepted keywords for a fake's callable."""
    if key == "LLM.__init__":
        return None, llm_keywords()
    if key == "SamplingParams.__init__":
        return None, init_fields("SamplingParams")
    if key == "TokensPrompt":
        return None, set(cls("TokensPrompt")["fields"])
    method = cls("LLM")["methods"].get(key.split(".", 1)[1])
    return (method["params"], {p[0] for p in method["params"] if p[1] in ("arg", "kw")}) if method else (None, None)


def test_fake_vllm_accepts_only_what_vllm_accepts():
    problems = []
    for key, fn in _fake_signatures().items():
        at = f"tests/exgrpo_core/fake_vllm.py:{fn.lineno}"
        _, real = _real(key)
        if real is None:
            problems.append(f"{at}: the fake has {key}(), vLLM {V} LLM has no such method")
            continue
        sig = script.params(fn, drop_first=key != "TokensPrompt")
        for name, kind, _ in sig:
            if kind in ("arg", "kw") and name not in real:
                problems.append(f"{at}: fake {key} accepts {name!r}, vLLM {V} does not")
            if kind == "**kwargs":
                read = sorted({n.slice.value if isinstance(n, ast.Subscript) else n.args[0].value for n in ast.walk(fn)
                               if _reads_key(n, name)})
                problems += [f"{at}: fake {key} reads {k!r} from **{name}, vLLM {V} has no such keyword"
                             for k in read if k not in real]
                if not _checks_against_the_recording(fn, name):
                    problems.append(f"{at}: fake {key} takes **{name}, so it accepts any keyword (vLLM {V} rejects "
                                    "unknown ones): name them, or check them against vllm_contract.json")
    assert not problems, "\n".join(problems)


def _checks_against_the_recording(fn, name: str) -> bool:
    """`set(kwargs) - llm_keywords()` in the fake: its **kwargs are checked against vllm_contract.json."""
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub) and isinstance(n.left, ast.Call)
               and getattr(n.left.func, "id", None) == "set" and getattr(n.left.args[0], "id", None) == name
               and isinstance(n.right, ast.Call) and getattr(n.right.func, "id", None) == "llm_keywords"
               for n in ast.walk(fn))


def test_the_fake_refuses_a_keyword_vllm_does_not_have(tmp_path):
    import fake_vllm

    with pytest.raises(TypeError, match="bogus_arg"):
        fake_vllm.LLM(str(tmp_path), bogus_arg=1)
    assert {"logprobs_mode", "enable_sleep_mode", "hf_overrides", "seed"} <= fake_vllm.llm_keywords()


def _reads_key(node, name: str) -> bool:
    """`kwargs.get("k")` or `kwargs["k"]` for the **kwargs named `name`."""
    if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == name:
        return isinstance(node.slice, ast.Constant)
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and getattr(node.func.value, "id", None) == name and bool(node.args) and isinstance(node.args[0], ast.Constant))


def test_fake_vllm_divergences_are_listed():
    """Where the fake differs from vLLM without accepting too much: different defaults, positional order,
    parameters it lacks. Listed as warnings (pytest's summary), for whoever relies on the fake."""
    notes = []
    for key, fn in _fake_signatures().items():
        real_params, _ = _real(key)
        if key == "SamplingParams.__init__":  # a msgspec Struct: its fields in source order are its parameters
            fields = cls("SamplingParams")["fields"]
            real_params = [[f, "arg", fields[f]] for f in cls("SamplingParams")["field_order"] if not f.startswith("_")]
        if not real_params:
            continue
        real = {p[0]: p for p in real_params}
        fake = script.params(fn, drop_first=True)
        for name, kind, default in fake:
            if name in real and default != real[name][2]:
                notes.append(f"{key}: default {name}={default}, vLLM {V}: {real[name][2]}")
        fake_pos = [p[0] for p in fake if p[1] in ("pos", "arg")]
        real_pos = [p[0] for p in real_params if p[1] in ("pos", "arg")][:len(fake_pos)]
        if fake_pos != real_pos:
            notes.append(f"{key}: positional order {fake_pos}, vLLM {V}: {real_pos}")
        lacking = [p[0] for p in real_params if p[0] not in {f[0] for f in fake} and not p[0].startswith("_")]
        if lacking and key != "SamplingParams.__init__":
            notes.append(f"{key}: lacks vLLM's {lacking}")
    for note in notes:
        warnings.warn(f"fake_vllm diverges from vLLM {V}: {note}", UserWarning, stacklevel=1)


def test_the_worker_extension_loads_through_the_workers_own_accessor():
    """vLLM's supported path to the running model is `Worker.get_model()`; `model_runner.model` may be a
    CUDA-graph wrapper and is the runner's internals."""
    src = (ROOT / "exgrpo_core" / "rollout" / "vllm_engine.py").read_text()
    ext = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == "WeightSyncExtension")
    used = {n.attr for n in ast.walk(ext) if isinstance(n, ast.Attribute) and getattr(n.value, "id", None) == "self"}
    assert "model_runner" not in used and "get_model" in used
    assert "get_model" in members("Worker")
