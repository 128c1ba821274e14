"""Record vLLM's API surface from its wheel's source (ast only, vLLM is never imported) into exgrpo_core/rollout/vllm_contract.json."""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "exgrpo_core" / "rollout" / "vllm_contract.json"

WT = "vllm.distributed.weight_transfer"
# modules whose public names are recorded: a `from M import N` in our code must find N under M
EXPORT_MODULES = ["vllm", "vllm.platforms", "vllm.model_executor.model_loader.reload", "vllm.inputs", "vllm.sampling_params", "vllm.outputs", "vllm.config", "vllm.engine.arg_utils",
                  "vllm.entrypoints.llm", "vllm.v1.engine", "vllm.config.weight_transfer", WT,
                  *(f"{WT}.{m}" for m in ("base", "nccl_engine", "ipc_engine", "clients", "factory"))]
# classes recorded in full (fields, public methods with parameters, instance attributes)
CLASSES = {
    "LLM": "vllm:LLM", "SamplingParams": "vllm:SamplingParams", "TokensPrompt": "vllm.inputs:TokensPrompt",
    "EngineArgs": "vllm.engine.arg_utils:EngineArgs", "ModelConfig": "vllm.config.model:ModelConfig",
    "ParallelConfig": "vllm.config.parallel:ParallelConfig", "LLMEngine": "vllm.v1.engine.llm_engine:LLMEngine",
    "RequestOutput": "vllm.outputs:RequestOutput", "CompletionOutput": "vllm.outputs:CompletionOutput",
    "Worker": "vllm.v1.worker.gpu_worker:Worker", "WorkerWrapperBase": "vllm.v1.worker.worker_base:WorkerWrapperBase",
    "WeightTransferConfig": "vllm.config.weight_transfer:WeightTransferConfig",
    **{n: f"{WT}.base:{n}" for n in ("WeightTransferInitRequest", "WeightTransferUpdateRequest", "WeightTransferEngine",
                                     "TrainerWeightTransferEngine", "VLLMWeightSyncClient", "ModuleSource")},
    **{n: f"{WT}.nccl_engine:{n}" for n in ("NCCLTrainerWeightTransferEngine", "NCCLTrainerInitInfo",
                                            "NCCLWeightTransferUpdateInfo")},
    **{n: f"{WT}.ipc_engine:{n}" for n in ("IPCTrainerWeightTransferEngine", "IPCTrainerInitInfo",
                                           "IPCWeightTransferUpdateInfo")},
    "NCCLWeightTransferInitInfo": f"{WT}.nccl_common:NCCLWeightTransferInitInfo",
    "HTTPVLLMWeightSyncClient": f"{WT}.clients:HTTPVLLMWeightSyncClient",
    "WeightTransferTrainerFactory": f"{WT}.factory:WeightTransferTrainerFactory",
}
# of these configuration classes only the fields and properties are recorded, not their methods
FIELDS_ONLY = {"SamplingParams", "EngineArgs", "ModelConfig", "ParallelConfig", "WeightTransferConfig"}
# classes recorded by member names only (large): what `self.model_runner.<x>` may name
NAME_ONLY_CLASSES = {"GPUModelRunner": "vllm.v1.worker.gpu_model_runner:GPUModelRunner",
                     "GPUModelRunnerV2": "vllm.v1.worker.gpu.model_runner:GPUModelRunner"}
# model classes whose `load_weights` signature is recorded (the models we train)
MODEL_CLASSES = {f"{c}ForCausalLM": f"vllm.model_executor.models.{c.lower()}:{c}ForCausalLM"
                 for c in ("Llama", "Qwen2", "Qwen3")}
LITERALS = {"LogprobsMode": "vllm.config.model:LogprobsMode", "PauseMode": "vllm.v1.engine:PauseMode",
            "PROCESSED_LOGPROBS_MODES": "vllm.config.model:PROCESSED_LOGPROBS_MODES",
            "DistributedExecutorBackend": "vllm.config.parallel:DistributedExecutorBackend",
            "SLEEP_TAGS": "vllm.v1.executor.abstract:SLEEP_TAGS"}
ENV_DETAIL = ["VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_BATCH_INVARIANT", "VLLM_SERVER_DEV_MODE",
              "VLLM_USE_V2_MODEL_RUNNER", "VLLM_ALLOW_INSECURE_SERIALIZATION", "VLLM_USE_FLASHINFER_SAMPLER"]
HTTP_VERBS = {"get", "post", "put", "delete", "patch", "head", "options"}
EXTERNAL_PYDANTIC = {"BaseModel", "OpenAIBaseModel"}


def short(node: ast.AST | None, limit: int = 80) -> str | None:
    """Source text of `node` on one line, cut at `limit` characters."""
    text = " ".join(ast.unparse(node).split()) if node is not None else None
    return text if text is None or len(text) <= limit else text[:limit - 3] + "..."


class Source:
    """The wheel's Python modules, parsed on demand."""

    def __init__(self, wheel: Path):
        self.zip = zipfile.ZipFile(wheel)
        self.files = {n for n in self.zip.namelist() if n.endswith(".py")}
        self.trees: dict[str, ast.Module] = {}

    def path(self, module: str) -> str | None:
        base = module.replace(".", "/")
        return next((p for p in (base + ".py", base + "/__init__.py") if p in self.files), None)

    def tree(self, module: str) -> ast.Module | None:
        if module not in self.trees:
            p = self.path(module)
            self.trees[module] = ast.parse(self.zip.read(p).decode(), p) if p else None
        return self.trees[module]

    def is_package(self, module: str) -> bool:
        return (self.path(module) or "").endswith("__init__.py")

    def absolute(self, module: str, level: int, target: str | None) -> str:
        if not level:
            return target or ""
        parts = module.split(".") if self.is_package(module) else module.split(".")[:-1]
        parts = parts[:len(parts) - (level - 1)]
        return ".".join(parts + ([target] if target else []))

    def top_level(self, module: str):
        """Top-level statements, including those inside `if` / `try` blocks."""
        for node in self.tree(module).body if self.tree(module) else []:
            yield from self._unnest(node)

    def _unnest(self, node):
        if not isinstance(node, (ast.If, ast.Try)):
            yield node
            return
        for child in [*node.body, *node.orelse, *getattr(node, "finalbody", []),
                      *(s for h in getattr(node, "handlers", []) for s in h.body)]:
            yield from self._unnest(child)

    def module_attrs(self, module: str) -> dict[str, str]:
        """vllm/__init__.py-style lazy re-exports: MODULE_ATTRS = {"LLM": ".entrypoints.llm:LLM"}."""
        for node in self.top_level(module):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and any(
                    isinstance(t, ast.Name) and t.id == "MODULE_ATTRS" for t in node.targets):
                return {k.value: v.value for k, v in zip(node.value.keys, node.value.values)
                        if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)}
        return {}

    def resolve(self, module: str, name: str, seen=None):
        """(module, node) defining `name` as seen from `module`; node None for a submodule; None if unknown."""
        seen = seen or set()
        if (module, name) in seen or self.tree(module) is None:
            return None
        seen.add((module, name))
        found = None
        for node in self.top_level(module):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                found = found or (module, node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    found = found or (module, node)
        if found:
            return found
        for node in self.top_level(module):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        target = self.absolute(module, node.level, node.module)
                        hit = self.resolve(target, alias.name, seen)
                        if hit is None and self.path(f"{target}.{alias.name}"):
                            hit = (f"{target}.{alias.name}", None)
                        if hit:
                            return hit
        if name in self.module_attrs(module):
            rel, attr = self.module_attrs(module)[name].split(":")
            level = len(rel) - len(rel.lstrip("."))
            return self.resolve(self.absolute(module, level, rel.lstrip(".")), attr, seen)
        if self.path(f"{module}.{name}"):
            return (f"{module}.{name}", None)
        return None

    def exports(self, module: str) -> list[str]:
        names = set(self.module_attrs(module))
        for node in self.top_level(module):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name != "*")
        if self.is_package(module):
            prefix = module.replace(".", "/") + "/"
            names.update(f[len(prefix):].split("/")[0].removesuffix(".py") for f in self.files
                         if f.startswith(prefix) and f != prefix + "__init__.py")
        return sorted(n for n in names if not n.startswith("_") or n in ("__version__", "__version_tuple__"))


def params(fn: ast.FunctionDef, drop_first: bool) -> list[list]:
    """[[name, kind, default]]: kind pos | arg | kw | *args | **kwargs; default None when required."""
    a = fn.args
    positional = [(p, "pos") for p in a.posonlyargs] + [(p, "arg") for p in a.args]
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    out = [[p.arg, kind, short(d)] for (p, kind), d in zip(positional, defaults)]
    out += [[a.vararg.arg, "*args", None]] if a.vararg else []
    out += [[p.arg, "kw", short(d)] for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    out += [[a.kwarg.arg, "**kwargs", None]] if a.kwarg else []
    return out[1:] if drop_first and out and out[0][1] in ("pos", "arg") else out


def decorator_names(node) -> set[str]:
    calls = [d.func if isinstance(d, ast.Call) else d for d in node.decorator_list]
    return {d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", "") for d in calls}


def field_record(stmt: ast.AnnAssign, typed_dict_total: bool) -> dict | None:
    ann = short(stmt.annotation, 200)
    if ann.startswith(("ClassVar", "typing.ClassVar")):
        return None
    if typed_dict_total is not None:
        return {"required": "required" if typed_dict_total and not ann.startswith("NotRequired") else "optional"}
    value = stmt.value
    if not (isinstance(value, ast.Call) and short(value.func) in ("field", "Field", "msgspec.field")):
        return {"default": short(value, 60)}
    default = next((k.value for k in value.keywords if k.arg in ("default", "default_factory")),
                   value.args[0] if value.args else None)
    no_init = any(k.arg == "init" and getattr(k.value, "value", True) is False for k in value.keywords)
    return {"default": short(default, 60), **({"init": False} if no_init else {})}


def type_name(node) -> str | None:
    """The recorded class an annotation names, if any (what `x.attr.<next>` is checked against)."""
    text = short(node, 200).strip("'\"") if node is not None else ""
    return text if text in CLASSES or text in NAME_ONLY_CLASSES else None


def guess_type(src: Source, module: str, fn, node) -> str | None:
    """The recorded class `self.x = ...` holds when the source says so plainly: an annotation, `C(...)` or
    `C.make(...)`, or `param.attr` where `param: C` declares `attr: D`."""
    if isinstance(node, ast.AnnAssign):
        return type_name(node.annotation)
    value = node.value
    if isinstance(value, ast.Call):
        return type_name(value.func.value if isinstance(value.func, ast.Attribute) else value.func)
    if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
        ann = next((a.annotation for a in fn.args.args + fn.args.kwonlyargs if a.arg == value.value.id), None)
        hit = src.resolve(module, ann.id) if isinstance(ann, ast.Name) else None
        if hit and isinstance(hit[1], ast.ClassDef):
            return next((type_name(s.annotation) for s in hit[1].body if isinstance(s, ast.AnnAssign)
                         and getattr(s.target, "id", None) == value.attr), None)
    return None


def class_record(src: Source, module: str, cls: ast.ClassDef, names_only: bool = False,
                 with_all_names: bool = False) -> dict:
    """Members of `cls` and of its bases inside vLLM (first definition along a depth-first walk wins)."""
    fields: dict = {}
    methods: dict = {}
    attrs: set[str] = set()
    all_names: set[str] = set()
    external: set[str] = set()
    no_init: set[str] = set()
    types: dict[str, str | None] = {}
    kind = "class"
    order: list = []

    def walk(mod: str, node: ast.ClassDef):
        if (mod, node.name) in [(m, n.name) for m, n in order]:
            return
        order.append((mod, node))
        for base in node.bases:
            base = base.value if isinstance(base, ast.Subscript) else base
            hit = src.resolve(mod, base.id) if isinstance(base, ast.Name) else None
            if hit and isinstance(hit[1], ast.ClassDef):
                walk(hit[0], hit[1])
            else:
                external.add(short(base))

    walk(module, cls)
    for mod, node in order:
        decos = decorator_names(node)
        is_td = any(short(b) in ("TypedDict", "typing.TypedDict") for b in node.bases) or "TypedDict" in external
        total = not any(k.arg == "total" and isinstance(k.value, ast.Constant) and k.value.value is False
                        for k in node.keywords)
        if kind == "class":
            kind = ("msgspec" if any("msgspec.Struct" == short(b) for b in node.bases) else
                    "typeddict" if is_td else "dataclass" if decos & {"dataclass", "config"} else
                    "pydantic" if external & EXTERNAL_PYDANTIC else "class")
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                all_names.add(stmt.target.id)
                rec = field_record(stmt, total if is_td else None)
                types[stmt.target.id] = types.get(stmt.target.id) or type_name(stmt.annotation)
                if rec is not None and stmt.target.id not in fields:
                    fields[stmt.target.id] = rec.get("required", rec.get("default"))
                    if rec.get("init") is False:
                        no_init.add(stmt.target.id)
            elif isinstance(stmt, ast.Assign):
                all_names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                all_names.add(stmt.name)
                sdecos = decorator_names(stmt)
                for sub in ast.walk(stmt):
                    if isinstance(sub, (ast.Assign, ast.AnnAssign)):
                        for t in (sub.targets if isinstance(sub, ast.Assign) else [sub.target]):
                            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                                attrs.add(t.attr)
                                types[t.attr] = types.get(t.attr) or guess_type(src, mod, stmt, sub)
                if "overload" in sdecos or stmt.name in methods:
                    continue
                if stmt.name.startswith("_") and stmt.name not in ("__init__", "__call__"):
                    continue
                mkind = ("property" if sdecos & {"property", "cached_property"} else
                         "classmethod" if "classmethod" in sdecos else
                         "staticmethod" if "staticmethod" in sdecos else "method")
                methods[stmt.name] = {"kind": mkind, "from": f"{mod}:{node.name}",
                                      "params": params(stmt, mkind != "staticmethod")}
                if isinstance(stmt, ast.AsyncFunctionDef):
                    methods[stmt.name]["async"] = True
    rec = {"defined_in": f"{module}:{cls.name}", "kind": kind, "external_bases": sorted(external),
           "attributes": sorted(a for a in attrs if not a.startswith("_")),
           "attribute_types": {a: t for a, t in types.items() if t and not a.startswith("_")}}
    if names_only:
        rec["members"] = sorted({*methods, *fields, *rec["attributes"]})
        return rec
    rec.update(fields=fields, methods=methods)
    if no_init:
        rec["fields_not_in_init"] = sorted(no_init)
    if kind == "msgspec":
        rec["field_order"] = list(fields)  # a Struct's positional parameters, in this order
    if with_all_names:
        rec["all_class_names"] = sorted(all_names)  # vLLM refuses a worker extension that shadows any of these
    return rec


def find(src: Source, dotted: str):
    module, name = dotted.split(":")
    if (hit := src.resolve(module, name)) is None or hit[1] is None:
        raise SystemExit(f"vllm_contract: cannot find {dotted} in the wheel")
    return hit


def literal_values(node) -> list:
    value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else node
    return sorted({n.value for n in ast.walk(value) if isinstance(n, ast.Constant) and isinstance(n.value, str)})


def dev_mode_modules(src: Source) -> set[str]:
    """Modules whose routes are attached only when VLLM_SERVER_DEV_MODE is set: follow the imports (and the
    register / attach functions they bring) inside `if envs.VLLM_SERVER_DEV_MODE:` blocks."""
    gated: set[str] = set()
    todo: list[tuple[str, list]] = []
    for f in sorted(src.files):
        if f.startswith("vllm/entrypoints/"):
            mod = f.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            todo += [(mod, n.body) for n in ast.walk(src.tree(mod))
                     if isinstance(n, ast.If) and "VLLM_SERVER_DEV_MODE" in ast.unparse(n.test)]
    seen = set()
    while todo:
        mod, body = todo.pop()
        for stmt in (s for b in body for s in ast.walk(b)):
            if isinstance(stmt, ast.ImportFrom):
                target = src.absolute(mod, stmt.level, stmt.module)
                for alias in stmt.names:
                    hit = src.resolve(target, alias.name)
                    if hit and isinstance(hit[1], ast.FunctionDef):
                        gated.add(hit[0])
                        if (hit[0], alias.name) not in seen:
                            seen.add((hit[0], alias.name))
                            todo.append((hit[0], hit[1].body))
                    elif hit:
                        gated.add(hit[0])
    return gated


def route_params(src: Source, module: str, fn, models: dict) -> list[dict]:
    out = []
    a = fn.args
    defaults = [None] * (len(a.args) - len(a.defaults)) + list(a.defaults) + list(a.kw_defaults)
    for p, d in zip(a.args + a.kwonlyargs, defaults):
        ann = p.annotation
        if ann is None or short(ann) in ("Request", "fastapi.Request", "Response"):
            continue
        rec: dict = {"name": p.arg}
        inner, marker = ann, d
        if isinstance(ann, ast.Subscript) and short(ann.value) == "Annotated":
            elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            inner, marker = elts[0], (elts[1] if len(elts) > 1 else d)
        call = short(marker.func) if isinstance(marker, ast.Call) else None
        rec["in"] = {"Query": "query", "Body": "body", "Path": "path", "Form": "form", "File": "file",
                     "Depends": "dependency", "Header": "header"}.get(call, "auto")
        rec["type"] = short(inner)
        if isinstance(inner, ast.Name):
            hit = src.resolve(module, inner.id)
            if hit and isinstance(hit[1], ast.ClassDef):
                key = f"{hit[0]}:{inner.id}"
                rec["model"] = key
                if key not in models:
                    r = class_record(src, hit[0], hit[1])
                    models[key] = {"kind": r["kind"], "fields": sorted(r["fields"])}
        out.append(rec)
    for node in ast.walk(fn):  # read by hand: request.query_params.get[list]("x"), body.get("x") of a JSON body
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "getlist")
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            owner = short(node.func.value)
            where = "query" if owner.endswith("query_params") else "json" if owner == "body" else None
            if where and node.args[0].value not in [r["name"] for r in out]:
                out.append({"name": node.args[0].value, "in": where, "type": "read by hand"})
    return out


def routes(src: Source) -> tuple[list[dict], dict]:
    gated = dev_mode_modules(src)
    found, models = [], {}
    for f in sorted(src.files):
        if not f.startswith("vllm/entrypoints/"):
            continue
        mod = f.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        tree = src.tree(mod)
        functions = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        regs = []
        for fn in functions.values():
            for d in fn.decorator_list:
                if (isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.args
                        and isinstance(d.args[0], ast.Constant) and isinstance(d.args[0].value, str)):
                    verb = d.func.attr
                    if verb in HTTP_VERBS:
                        regs.append((d.args[0].value, [verb.upper()], fn, d))
                    elif verb == "api_route":
                        regs.append((d.args[0].value, literal_values(next(
                            (k.value for k in d.keywords if k.arg == "methods"), ast.List([], ast.Load()))), fn, d))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_api_route"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                handler = functions.get(getattr(node.args[1], "id", None)) if len(node.args) > 1 else None
                methods = next((k.value for k in node.keywords if k.arg == "methods"), None)
                regs.append((node.args[0].value, literal_values(methods) if methods else ["GET"], handler, node))
        for path, methods, fn, node in regs:
            for m in methods:
                rec = {"path": path, "method": m, "module": mod, "line": node.lineno, "dev_mode": mod in gated}
                if fn is not None:
                    rec.update(handler=fn.name, params=route_params(src, mod, fn, models))
                found.append(rec)
    found.sort(key=lambda r: (r["path"], r["method"], r["module"], r["line"]))
    return found, models


def env_vars(src: Source) -> tuple[list[str], dict]:
    for node in src.top_level("vllm.envs"):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and "environment_variables" in short(
                node.targets[0] if isinstance(node, ast.Assign) else node.target):
            table = {k.value: v for k, v in zip(node.value.keys, node.value.values) if isinstance(k, ast.Constant)}
            return sorted(table), {n: short(table[n], 300) for n in ENV_DETAIL if n in table}
    raise SystemExit("vllm_contract: no environment_variables table in vllm/envs.py")


def registries(src: Source) -> dict:
    out: dict = {}
    for node in ast.walk(src.tree("vllm.distributed.weight_transfer.factory")):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register_engine"
                and isinstance(node.func.value, ast.Name) and len(node.args) == 3):
            name, module, cls = (a.value for a in node.args)
            out.setdefault(node.func.value.id, {})[name] = f"{module}:{cls}"
    return out


def metadata(src: Source) -> dict:
    meta = next(n for n in src.zip.namelist() if n.endswith(".dist-info/METADATA"))
    pairs = [line.split(":", 1) for line in src.zip.read(meta).decode().splitlines() if ":" in line]
    return {"vllm_version": next(v.strip() for k, v in pairs if k == "Version"),
            "requires_dist": sorted(v.strip() for k, v in pairs if k == "Requires-Dist")}


def build(wheel: Path) -> dict:
    src = Source(wheel)
    rec: dict = {"generator": "scripts/vllm_contract.py", "wheel": wheel.name,
                 "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(), **metadata(src)}
    rec["exports"] = {m: src.exports(m) for m in EXPORT_MODULES}
    rec["classes"] = {}
    for name, dotted in CLASSES.items():
        rec["classes"][name] = r = class_record(src, *find(src, dotted), with_all_names=name in ("Worker",))
        if name in FIELDS_ONLY:
            r["properties"] = sorted(m for m, v in r.pop("methods").items() if v["kind"] == "property")
    for name, dotted in NAME_ONLY_CLASSES.items():
        rec["classes"][name] = class_record(src, *find(src, dotted), names_only=True)
    rec["model_load_weights"] = {name: class_record(src, *find(src, dotted))["methods"]["load_weights"]
                                 for name, dotted in MODEL_CLASSES.items()}
    rec["literals"] = {name: {"defined_in": f"{find(src, dotted)[0]}:{find(src, dotted)[1].lineno}",
                              "values": literal_values(find(src, dotted)[1])} for name, dotted in LITERALS.items()}
    rec["routes"], rec["request_models"] = routes(src)
    rec["env_vars"], rec["env_var_detail"] = env_vars(src)
    rec["weight_transfer_registry"] = registries(src)
    return rec


def dump(value, depth: int = 0) -> str:
    """Sorted, stable JSON: one member per line, short lists and dicts of plain values on one line."""
    flat = json.dumps(value, sort_keys=True, ensure_ascii=True)
    nested = isinstance(value, (dict, list)) and (len(flat) > 100 or any(isinstance(v, (dict, list)) for v in (
        value.values() if isinstance(value, dict) else value)))
    if not nested or not value:
        return flat
    pad = " " * (depth + 1)
    items = ([f"{json.dumps(k)}: {dump(value[k], depth + 1)}" for k in sorted(value)] if isinstance(value, dict)
             else [dump(v, depth + 1) for v in value])
    brackets = "{}" if isinstance(value, dict) else "[]"
    return brackets[0] + "\n" + ",\n".join(pad + i for i in items) + "\n" + " " * depth + brackets[1]


def download(version: str, into: str) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps",
                    "--only-binary=:all:", "-d", into], check=True)
    return next(Path(into).glob("vllm-*.whl"))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--wheel", type=Path, help="a downloaded vllm wheel")
    which.add_argument("--version", help="pip-download this vllm version (--no-deps) into a temporary folder")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rec = build(a.wheel or download(a.version, tmp))
    text = dump(rec) + "\n"
    a.out.write_text(text)
    print(f"wrote {a.out} ({len(text) // 1024} KiB): vllm {rec['vllm_version']}, {len(rec['routes'])} routes, "
          f"{len(rec['env_vars'])} env vars, {len(rec['classes'])} classes")


if __name__ == "__main__":
    main()
