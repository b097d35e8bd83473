"""docker/: the compose file and Dockerfile hang together (no Docker engine runs here, so this is
as far as they can be validated: structure, references, and that the commands exist)."""

from __future__ import annotations

from pathlib import Path

import yaml

from app.cli import COMMANDS

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def test_compose_references_resolve() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert {"kafka", "postgres", "ingest", "worker", "projector", "effects", "prometheus"} <= set(services)
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        if "image" in service and "build" not in service:
            assert ":" in service["image"] and not service["image"].endswith(":latest"), "pin images"
        depends = service.get("depends_on", [])
        assert set(depends) <= set(services), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DOCKER / source).exists(), source
            else:
                assert source in compose["volumes"], source
        command = service.get("command")
        if service.get("image", "").startswith("orderly:"):
            assert command[0] in COMMANDS, f"{name} runs `orderly {command[0]}`, which does not exist"
        if "build" in service:
            assert (DOCKER / service["build"]["context"] / service["build"]["dockerfile"]).exists()
            env = service["environment"]
            assert {"ORDERLY_KAFKA", "ORDERLY_POSTGRES_DSN", "ORDERLY_SECRET_PG", "ORDERLY_SECRET_CARD",
                    "ORDERLY_SECRET_PAYMOS", "ORDERLY_API_TOKEN"} <= set(env)


def test_dockerfile_copies_every_package() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    for package in ("app", "topics", "projections"):
        assert f"COPY {package} ./{package}" in text
    assert 'ENTRYPOINT ["orderly"]' in text


def test_prometheus_scrapes_the_ingest() -> None:
    config = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    targets = [t for job in config["scrape_configs"] for c in job["static_configs"] for t in c["targets"]]
    assert "ingest:8080" in targets
