"""Each HTTP request of our rollout client (remote.py) against vLLM's recorded routes: the route (and method)
exists, and every body, query and sampling field we send is one its handler reads (vllm_contract.json)."""

from __future__ import annotations

import ast
import re

from test_vllm_contract import ROOT, V, C, init_fields

CLIENT = ROOT / "exgrpo_core" / "rollout" / "remote.py"

ROUTE = re.compile(r"/[A-Za-z0-9_/.-]+")


def client_requests(text: str) -> list[tuple[int, str | None, str, dict[str, list[str]]]]:
    """Each request in the client's source: (line, method or None, route, names sent by where: body / query /
    sampling_params), read from calls that name a route string and literal dicts next to it."""
    tree = ast.parse(text)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        consts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        routes = [c for c in consts if ROUTE.fullmatch(c)]
        if not routes:
            continue
        method = next((c for c in consts if c in ("GET", "POST")), None)
        names: dict[str, list[str]] = {}
        for arg in [*node.args, *(k.value for k in node.keywords if k.arg == "body")]:
            if isinstance(arg, ast.Dict):
                names["body"] = [k.value for k in arg.keys if isinstance(k, ast.Constant)]
        for k in node.keywords:
            if k.arg == "query" and isinstance(k.value, ast.Dict):
                names["query"] = [q.value for q in k.value.keys if isinstance(q, ast.Constant)]
        out.append((node.lineno, method, routes[0], names))
    for node in ast.walk(tree):  # generate_request(ids, **sampling): SamplingParams fields; its dict: GenerateRequest's
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "generate_request":
            out.append((node.lineno, "POST", "/inference/v1/generate",
                        {"sampling_params": [k.arg for k in node.keywords if k.arg]}))
        if isinstance(node, ast.Dict) and any(getattr(k, "value", None) == "sampling_params" for k in node.keys):
            out.append((node.lineno, "POST", "/inference/v1/generate",
                        {"body": [k.value for k in node.keys if isinstance(k, ast.Constant)]}))
    return out


def request_problems(text: str, where: str) -> list[str]:
    """Routes vLLM does not serve (with that method), and names its handlers do not read."""
    out = []
    for line, method, path, names in client_requests(text):
        routes = [r for r in C["routes"] if r["path"] == path and method in (None, r["method"])]
        if not routes:
            out.append(f"{where}:{line}: {method or ''} {path} is not a route of vLLM {V}")
            continue
        params = [p for r in routes for p in r["params"]]
        body = {f for p in params if p["in"] in ("body", "json", "auto")
                for f in (C["request_models"][p["model"]]["fields"] if p.get("model") else [p["name"]])}
        query = {p["name"] for p in params if p["in"] == "query"}
        allowed = {"body": body, "query": query, "sampling_params": init_fields("SamplingParams")}
        out += [f"{where}:{line}: {path} {kind} {n!r}: vLLM {V} reads no such name"
                for kind, sent in names.items() for n in sent if n not in allowed[kind]]
    return out


def test_routes_and_fields_our_client_requests_exist():
    """Each route remote.py requests is one of vLLM's, and each body, query and sampling field is one it reads."""
    found = client_requests(CLIENT.read_text())
    paths = {p for _, _, p, _ in found}
    assert {"/inference/v1/generate", "/update_weights", "/finish_weight_update", "/weight_checker",
            "/weight_info", "/pause", "/init_weight_transfer_engine"} <= paths, paths  # the scan sees the client
    problems = request_problems(CLIENT.read_text(), "exgrpo_core/rollout/remote.py")
    assert not problems, "\n".join(problems)


def test_request_checker_reports_invented_names():
    snippet = ("def f(c):\n    c.call('POST', '/no_such_route')\n    c.call('GET', '/update_weights')\n"
               "    c.call('POST', '/weight_checker', {'acton': 'checksum'})\n"
               "    c.call('POST', '/pause', query={'mod': 'wait'})\n"
               "    generate_request([1], temprature=1.0)\n    x = {'token_idz': [1], 'sampling_params': {}}\n")
    found = "\n".join(request_problems(snippet, "s.py"))
    for name in ("/no_such_route", "GET /update_weights", "'acton'", "'mod'", "'temprature'", "'token_idz'"):
        assert name in found, f"the checker missed {name}:\n{found}"
    clean = ("def f(c):\n    c.call('POST', '/weight_checker', {'action': 'checksum'})\n"
             "    c.call('POST', '/pause', query={'mode': 'wait', 'clear_cache': 'true'})\n"
             "    generate_request([1], n=2, logprobs=0)\n")
    assert request_problems(clean, "s.py") == []
