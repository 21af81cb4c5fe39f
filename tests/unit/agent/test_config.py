from pathlib import Path

import pytest

from berth_agent.config import ConfigError, DiscoveryMode, ExecutorKind, load

BASE = """
api_url: https://api.example.com/prod
pool: lab-a
host_id: gpu-01
executor: docker
gpus:
  discovery: simulated
  simulated: {gpu_type: A100, count: 4, memory_gib: 40}
datasets:
  imagenet: /data/imagenet
"""


def _write(tmp_path: Path, text: str = BASE) -> Path:
    p = tmp_path / "config.yaml"
    p.write_text(text)
    return p


def test_file_only(tmp_path: Path) -> None:
    cfg = load(_write(tmp_path), environ={})
    assert cfg.pool == "lab-a" and cfg.executor is ExecutorKind.DOCKER
    assert cfg.gpus.discovery is DiscoveryMode.SIMULATED and cfg.gpus.simulated.count == 4
    assert cfg.datasets == {"imagenet": Path("/data/imagenet")}
    assert cfg.cache_max_bytes == 100 * 1024**3
    assert cfg.logs.batch_max_events == 10_000 and cfg.logs.batch_max_bytes == 1_048_576


def test_env_overrides_nested_and_structured(tmp_path: Path) -> None:
    env = {
        "BERTH_AGENT_POOL": "lab-b",
        "BERTH_AGENT_GPUS__SIMULATED__COUNT": "8",
        "BERTH_AGENT_DATASETS": '{"coco": "/data/coco"}',
        "BERTH_AGENT_CANCEL_GRACE_S": "5",
        "UNRELATED": "x",
    }
    cfg = load(_write(tmp_path), environ=env)
    assert cfg.pool == "lab-b"
    assert cfg.gpus.simulated.count == 8 and cfg.gpus.simulated.gpu_type == "A100"  # merged, not replaced
    assert cfg.datasets == {"coco": Path("/data/coco")}
    assert cfg.cancel_grace_s == 5


def test_config_path_from_env_and_env_only(tmp_path: Path) -> None:
    path = _write(tmp_path)
    assert load(environ={"BERTH_AGENT_CONFIG": str(path)}).host_id == "gpu-01"
    env = {
        "BERTH_AGENT_CONFIG": str(tmp_path / "absent.yaml"),
        "BERTH_AGENT_API_URL": "http://127.0.0.1:1",
    }
    with pytest.raises(ConfigError, match="does not exist"):
        load(environ=env)


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"BERTH_AGENT_POOLL": "x"}, "pooll"),
        ({"BERTH_AGENT_EXECUTOR": "lxc"}, "executor"),
        ({"BERTH_AGENT_WORK_DIR": "relative/dir"}, "work_dir"),
        ({"BERTH_AGENT_DATASETS": '{"x": "rel"}'}, "datasets"),
        ({"BERTH_AGENT_LOGS__BATCH_MAX_EVENTS": "20000"}, "batch_max_events"),
    ],
)
def test_invalid_values_name_the_field(tmp_path: Path, env: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load(_write(tmp_path), environ=env)


def test_bad_yaml_and_missing_required(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(_write(tmp_path, "a: [unclosed"), environ={})
    with pytest.raises(ConfigError, match="api_url"):
        load(_write(tmp_path, "pool: a\nhost_id: h\n"), environ={})
