"""`raybatch build`: a Serve config that Ray accepts and that carries our whole config."""

from __future__ import annotations

import yaml

from cluster.config import load_config
from cluster.render import APP_BUILDER, serve_config
from raybatch.main import main


def _config(**ingress):
    return load_config({
        "app_name": "shop",
        "ingress": {"route_prefix": "/ml", "host": "0.0.0.0", "port": 9000, **ingress},
        "models": [{
            "name": "square", "transformer": "deployments.models:Square",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
            "batching": {"max_batch_size": 16, "max_queue_delay_s": 0.004,
                         "preferred_batch_sizes": [8]},
        }],
    })


def test_rendered_config_is_accepted_by_serve_and_self_contained():
    from ray.serve.schema import ServeDeploySchema

    cfg = _config()
    rendered = serve_config(cfg)
    schema = ServeDeploySchema.model_validate(rendered)
    (app,) = schema.applications
    assert (app.name, app.route_prefix, app.import_path) == ("shop", "/ml", APP_BUILDER)
    assert (schema.http_options.host, schema.http_options.port) == ("0.0.0.0", 9000)
    assert load_config(app.args["config"]) == cfg  # round-trips: nothing lost


def test_app_builder_builds_from_the_inline_config():
    from deployments.app import app_builder

    args = serve_config(_config())["applications"][0]["args"]
    app = app_builder(args)
    assert type(app).__name__ == "Application"


def test_cli_build_writes_yaml(tmp_path, capsys):
    out = tmp_path / "serve.yaml"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(_config().model_dump(mode="json")))
    assert main(["build", "--config", str(cfg), "-o", str(out)]) == 0
    data = yaml.safe_load(out.read_text())
    assert data["applications"][0]["args"]["config"]["app_name"] == "shop"
    assert "serve deploy" in capsys.readouterr().out


def test_cli_build_reads_raybatch_config_like_up_and_serve_run(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(_config().model_dump(mode="json")))
    monkeypatch.setenv("RAYBATCH_CONFIG", str(cfg))
    assert main(["build"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["applications"][0]["name"] == "shop"
    monkeypatch.delenv("RAYBATCH_CONFIG")
    assert main(["build"]) == 0  # without it: the bundled demo
    assert yaml.safe_load(capsys.readouterr().out)["applications"][0]["name"] == "raybatch"


def test_the_app_logs_at_warning_without_access_log_unless_asked():
    from ray.serve.schema import ServeDeploySchema

    (app,) = ServeDeploySchema.model_validate(serve_config(_config())).applications
    assert (app.logging_config.log_level, app.logging_config.enable_access_log) == (
        "WARNING", False)
    on = serve_config(_config(access_log=True))["applications"][0]["logging_config"]
    assert on == {"log_level": "INFO", "enable_access_log": True}  # access lines are INFO


def test_serve_environment_names_throughput_mode_direct_ingress_and_haproxy(tmp_path, capsys):
    from cluster.render import serve_environment

    assert serve_environment(_config()) == {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
                                            "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
                                            "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30",
                                            "RAY_SERVE_ENABLE_HA_PROXY": "1"}
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in serve_environment(_config(haproxy=False))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(_config().model_dump(mode="json")))
    assert main(["build", "--config", str(cfg)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# ") and "RAY_SERVE_ENABLE_HA_PROXY=1" in text.split("\n")[3]
