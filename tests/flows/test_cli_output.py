"""`exgrpo config` prints plain YAML (no wrapping, no markup), `--help-keys` documents every key, and
error lines stay one line at any terminal width. The real CLI in a subprocess, at a narrow COLUMNS."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pydantic
import yaml

from exgrpo_core.config.keys import config_keys, missing_help, type_name
from exgrpo_core.config.load import flatten, load_config
from exgrpo_core.config.schema import ExGRPOConfig

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "40", "TERM": "xterm-256color"}  # rich would wrap at 40 columns
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)


def test_config_output_is_the_resolved_config_as_yaml_through_a_pipe():
    long = "Answer with just the final number, " * 6 + "[b]not bold[/b] and [red]not red[/red]."
    sets = [f"data.instruction={long}", "run.name='[b]x'", "data.system_prompt='x: [i]y[/i] # z'"]
    out = _cli("config", "--config", "cpu-demo", *[a for s in sets for a in ("--set", s)])
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout) == load_config("cpu-demo", sets).model_dump(mode="json")
    shown = [line for line in out.stdout.splitlines() if "not bold" in line]
    assert len(shown) == 1 and long in shown[0] and shown[0].startswith("  instruction: ")  # one line, unwrapped
    assert "\x1b[" not in out.stdout  # no colour codes in a pipe


def test_an_error_is_one_unwrapped_line_and_keeps_brackets():
    out = _cli("config", "--config", "[b]no-such-preset-with-a-rather-long-name")
    lines = [x for x in (out.stdout + out.stderr).splitlines() if x.strip()]
    assert out.returncode == 2 and len(lines) == 1, lines
    assert "'[b]no-such-preset-with-a-rather-long-name' not found" in lines[0]
    assert "presets: ['arith-fast', 'arith3', 'cpu-demo'" in lines[0] and "Traceback" not in lines[0]


def test_the_unknown_key_error_names_a_close_key_and_help_keys():
    out = _cli("config", "--config", "tiny", "--set", "rollout.temprature=0.7")
    text = out.stdout + out.stderr
    assert out.returncode == 2
    assert ("rollout.temprature: unknown key (did you mean rollout.temperature? see `exgrpo config --help-keys "
            "rollout.`)") in text


def test_help_keys_lists_every_key_with_type_default_and_help():
    out = _cli("config", "--help-keys")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    defaults = flatten(ExGRPOConfig())
    heads = {line.split(":", 1)[0]: line for line in lines if not line.startswith(" ")}
    assert set(heads) == set(defaults)  # every key, nothing else
    for key, value in defaults.items():
        head = heads[key]
        assert yaml.safe_load(head.rsplit(" = ", 1)[1]) == value, head  # the default, as YAML reads it
        help_line = lines[lines.index(head) + 1]
        assert help_line.startswith("    ") and len(help_line.strip()) > 3, (key, help_line)
    assert heads["run.resume"].startswith("run.resume: auto | never | must = ")
    assert heads["buffer.collect_max_k"].startswith("buffer.collect_max_k: int | null = null")
    assert "rho: fraction of the batch's questions drawn from experience" in out.stdout


def test_help_keys_filters_by_prefix_and_names_a_bad_one():
    out = _cli("config", "--help-keys", "buffer.")
    heads = [x.split(":")[0] for x in out.stdout.splitlines() if not x.startswith(" ")]
    assert out.returncode == 0 and heads == [k for k in flatten(ExGRPOConfig()) if k.startswith("buffer.")]
    bad = _cli("config", "--help-keys", "bufer.")
    lines = [x for x in (bad.stdout + bad.stderr).splitlines() if x.strip()]
    assert bad.returncode == 2 and len(lines) == 1 and "no config key starts with 'bufer.'" in lines[0]


def test_a_reader_that_stops_early_gets_no_traceback():
    """`exgrpo config --help-keys | head -1`: the reader is gone before the command writes."""
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "config", "--help-keys"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 0 and err == "", err


def test_every_config_key_has_help():
    assert missing_help() == []
    assert all(k.help.endswith(".") and "\n" not in k.help for k in config_keys())


def test_a_key_without_help_is_found():
    class Inner(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(use_attribute_docstrings=True)
        documented: int = 1
        """Has help."""
        bare: str = "x"

    class Root(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(use_attribute_docstrings=True)
        inner: Inner = Inner()
        """A section."""
        loose: float = 0.5

    assert missing_help(Root) == ["inner.bare", "loose"]
    assert type_name(int | None) == "int | null" and type_name(list[int]) == "list[int]"
