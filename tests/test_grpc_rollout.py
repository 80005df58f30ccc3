"""A change rolls out to proxyless gRPC clients as to Envoys: wave by wave, gated on their ACKs.

The canary PoP ewr gets a version that makes `shop-api` a TLS service; ewr's gRPC client (its
bootstrap has no certificate provider) NACKs the cluster. The gate fails on that NACK, the
rollback names the client, its release and grpcio's message, and puts ewr back on the version
that passed, before sjc ever got the change; ewr's client then calls its origins again.
"""

from __future__ import annotations

from pathlib import Path

from harness.eventually import eventually
from harness.grpc_fleet import grpc_fleet

WAVES = "rollout: {canary: [ewr], waves: [100%], bake: 2s, stats_flush_interval: 1s}\n"


def _waves(text: str) -> str:
    return text.replace("rollout: {strategy: immediate}\n", WAVES)


async def test_a_change_a_grpc_client_nacks_is_rolled_back_before_sjc_gets_it(
        tmp_path: Path) -> None:
    async with grpc_fleet(tmp_path, rate=10, probes=False, edit=_waves) as fleet:
        server = fleet.service.server
        await eventually(lambda: all(server.acks.pop(pop).applied == 1 for pop in ("ewr", "sjc")),
                         15, "both clients on the first version")
        old = {pop: server.intent.intent.desired_of(pop).digest for pop in ("ewr", "sjc")}
        (sjc_stream,) = server.nodes.by_node("sjc-grpc-1")
        sjc_cds = next(t for t in sjc_stream.types if t.type == "CDS")

        desired = tmp_path / "desired.yaml"
        desired.write_text(desired.read_text().replace("    port: ", "    tls: true\n    port: ",
                                                       1))
        await eventually(lambda: fleet.records("rolled_back"), 30, "the rollback")
        rule = fleet.records("rolled_back")[-1]["rule"]
        assert "pop ewr: node ewr-grpc-1 (gRPC Python " in rule, rule
        assert "NACKed Cluster" in rule, rule
        assert "unrecognized certificate provider instance name: ballast" in rule, rule
        assert [r["detail"]["pops"] for r in fleet.records("wave_started")] == [["ewr"]]
        assert not fleet.records("wave_passed")
        await eventually(lambda: {pop: server.intent.intent.desired_of(pop).digest
                                  for pop in ("ewr", "sjc")} == old, 10, "both on the old version")
        (now,) = server.nodes.by_node("sjc-grpc-1")
        assert next(t for t in now.types if t.type == "CDS") == sjc_cds  # sjc never got it
        await eventually(lambda: server.acks.pop("ewr").applied == 1, 10,
                         "ewr's client on the old version again")
        answer = await fleet.ask("ewr", "calls 5")
        assert answer["errors"] == {} and sum(answer["by_origin"].values()) == 5, answer
