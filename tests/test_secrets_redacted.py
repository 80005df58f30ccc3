"""No private key leaves Ballast except inside an SDS Secret on a stream allowed to have it.

A real `BallastService` serves a TLS listener; its certificate is renewed (a reload with a diff
in the decision log). Then every face is read — the decision log's files, `/resources`,
`/intent`, `/status`, `/decisions`, `/metrics`, the dashboard's API, `ballast render`,
`ballast plan` (against the server and offline), `ballast status` — and none holds any of the
keys' PEM body, in PEM or as the base64 protobuf JSON would carry it. What they show instead is
the key's fingerprint; `plan` diffs it, and the served certificates' days to expiry are in
`/status`, `/metrics`, `ballast status` and the dashboard.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import aiohttp
import pytest

from control_plane.cli.main import main
from control_plane.decisions.log import log_files
from control_plane.decisions.read import iter_records
from control_plane.desired.served_certs import key_fingerprint
from control_plane.lifecycle.service import BallastService, ServiceConfig
from harness.envoy_process import free_port
from harness.eventually import eventually
from tests.support.tls_listeners import HOSTNAMES, TlsSite, key_pem, tls_desired_yaml

pytestmark = pytest.mark.timeout(60)


def leaks(text: str, keys: list[bytes]) -> list[str]:
    """Which of `keys` (PEM) appear in `text`: their body, any line of it, or base64 of it."""
    found = []
    for key in keys:
        lines = [line for line in key.decode().splitlines() if not line.startswith("-----")]
        forms = ["".join(lines), base64.b64encode(key).decode(), *lines]
        if any(form in text for form in forms):
            found.append(key.decode().splitlines()[1][:16])
    return found


async def test_no_face_shows_a_private_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                           ) -> None:
    site = TlsSite(tmp_path / "certs")
    for name, hostname in HOSTNAMES.items():
        site.write(name, hostname, not_after_days=40)
    ports = dict(https_port=free_port(), listener_port=free_port(), primary_port=free_port(),
                 secondary_port=free_port())
    path = tmp_path / "desired.yaml"
    path.write_text(tls_desired_yaml(site, **ports))
    # an older state, offline, for `plan --against`: its own certificate files
    old_site = TlsSite(tmp_path / "old-certs", ca=site.ca)
    for name, hostname in HOSTNAMES.items():
        old_site.write(name, hostname)
    old = tmp_path / "old.yaml"
    old.write_text(tls_desired_yaml(old_site, **ports))
    keys = [key_pem(i) for i in (*site.issued.values(), *old_site.issued.values())]

    state_dir = tmp_path / "state"
    service = BallastService(ServiceConfig(
        desired_path=path, state_dir=state_dir, xds_address="127.0.0.1:0",
        admin_address="127.0.0.1:0", probes=False, reload_poll_s=0.1))
    await service.start()
    try:
        renewed = site.write("shop", HOSTNAMES["shop"], not_after_days=40)
        keys.append(key_pem(renewed))

        def applied() -> bool:
            # the record is durable before the swap: wait for the swap too, so the faces read
            # below serve what the record says
            return any(r["kind"] == "config_applied" and "secrets" in str(r["detail"])
                       and r["detail"]["digest"] == service.server.intent.desired.digest
                       for r in iter_records(state_dir))

        await eventually(applied, 5, "the renewal applied and served")
        assert service.admin is not None
        url = service.admin.url
        faces: dict[str, str] = {}
        async with aiohttp.ClientSession() as session:
            for route in ("/resources?pop=ewr", "/resources?pop=sjc", "/intent", "/status",
                          "/decisions?limit=200", "/metrics", "/nodes",
                          "/dashboard/api/overview", "/dashboard/api/pops/ewr",
                          "/dashboard/api/decisions", "/dashboard/api/timeline?pop=ewr&group=shop"):
                async with session.get(url + route) as response:
                    assert response.status == 200, route
                    faces[route] = await response.text()
        faces["decision log"] = "".join(p.read_text() for p in log_files(state_dir))
        for argv in (["render", str(path), "--pop", "ewr"],
                     ["plan", str(path), "--against", str(old)],
                     ["plan", str(old), "--server", url],
                     ["status", "--server", url]):
            await asyncio.to_thread(main, argv)
            out, err = capsys.readouterr()
            faces[" ".join(argv[:2])] = out + err
    finally:
        await service.stop()
    for face, text in faces.items():
        assert leaks(text, keys) == [], f"{face} shows a private key"
    # what they show instead: the key's fingerprint, diffed by plan
    shown = f"sha256:{key_fingerprint(key_pem(renewed))}"
    assert shown in faces["/resources?pop=ewr"]
    assert shown in faces["plan " + str(path)]
    assert "secrets" in faces["plan " + str(path)]
    assert "https.shop" not in faces["/resources?pop=sjc"]  # sjc does not serve it
    # served certificates' health
    assert "ballast_served_certificate_days_to_expiry" in faces["/metrics"]
    assert '"served_certificates"' in faces["/dashboard/api/overview"]
    assert "served certificates (TLS listeners, over SDS):" in faces["status --server"]
    line = next(x for x in faces["status --server"].splitlines() if "https/shop" in x)
    assert "39." in line or "40.0" in line
    assert "shop.test" in line and "ewr" in line and line.rstrip().endswith("ok")
